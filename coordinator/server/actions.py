"""Carrying out the logic core's incident actions: the I/O side of the state machine.

The core (``rankscope.coordinator.logic``) decides: it opens incidents, walks them through
the transition table and hands out :class:`Action` objects (``take_actions``).
This module does what they say: CONTROL to the node agents; BUNDLE_CHUNKs of an
export routed into ``incidents/<id>/rank_<r>/`` (a BundleAssembler), each rank
reported to the core once its bundle is complete (manifest.json and every file it
lists arrived); incident.json through the core; history.json + report.html on a
one-thread executor, so rendering never stalls ingest.

Runs on the front end's loop thread (the owner of the core and the socket).
"""
from __future__ import annotations

import concurrent.futures
import json
import logging
from pathlib import Path
from typing import Any, Callable

from rankscope.coordinator.logic.views import core_status
from rankscope.coordinator.logic.incidents.incident import Action, ActionKind
from rankscope.coordinator.report.history import history_from_series, save_history
from rankscope.rdr.transfer import BundleAssembler
from rankscope.wire.layout import incident_dir, incident_rank_dir
from rankscope.wire.rank_map import write_rank_map

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
_CONTROL = {ActionKind.PAUSE: "pause", ActionKind.RESUME: "resume", ActionKind.TERMINATE: "terminate",
            ActionKind.STEP: "step", ActionKind.STACKS: "stacks"}


class ActionPerformer:
    """``send_control(command, job=, incident=, args=) -> int`` is the service's."""

    def __init__(self, core: Any, export_dir: Path, send_control: Callable[..., int]) -> None:
        self.core = core
        self.export_dir = Path(export_dir)
        self.send_control = send_control
        self.assemblers: dict[str, BundleAssembler] = {}
        self.reported: set[tuple[str, int]] = set()
        self.received: dict[str, int] = {}  # incident -> bundle bytes arrived (export progress)
        self.terminated = False
        #: verdict dict -> its proof, when ingest shards hold the records (else the core does).
        self.proof: Callable[[dict], dict] | None = None
        self._io = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rankscope-report")
        self._jobs: list[concurrent.futures.Future] = []
        # After a restart: incidents the core restored mid-export keep receiving their
        # bundles (node agents replay unacknowledged chunks from their spools).
        for inc in core.incidents():
            if inc["state"] in ("detected", "pausing", "exporting"):
                iid = inc["incident_id"]
                self.assemblers[iid] = BundleAssembler(incident_dir(self.export_dir, iid))
                self.reported |= {(iid, int(r)) for r in inc.get("bundles", {})}

    # --- actions -------------------------------------------------------------------
    def run(self) -> int:
        """Perform every action the core has queued (performing one may queue more)."""
        done = 0
        for _ in range(100):  # bounded: a write queues its follow-up (resume/terminate) once
            actions = self.core.take_actions()
            if not actions:
                break
            for action in actions:
                self._guarded(action)
                done += 1
        return done

    def _guarded(self, action: Action) -> None:
        try:
            self.perform(action)
        except Exception:  # one failed action must not stop the others or the loop
            log.exception("incident action %s (%s) failed", action.kind.value, action.incident_id)

    def perform(self, action: Action) -> None:
        kind, job, iid = action.kind, action.job, action.incident_id
        if kind in _CONTROL:
            if kind == ActionKind.TERMINATE:
                self.terminated = True
            self.send_control(_CONTROL[kind], job=job, incident=iid, args=dict(action.detail))
            if kind in (ActionKind.RESUME, ActionKind.TERMINATE) and iid:
                self._refresh(iid)
        elif kind == ActionKind.EXPORT:
            # The transfer id is the incident id: chunks find their incident by it.
            self.assemblers.setdefault(iid, BundleAssembler(incident_dir(self.export_dir, iid)))
            self.send_control("export", job=job, incident=iid, args={"transfer": iid})
        elif kind == ActionKind.WRITE_INCIDENT:
            # Ranks whose bundle did not complete stay out of "bundles" (incident.json lists
            # them under missing_bundles; the report shows what did arrive of them).
            path = self.core.write_incident(iid)
            inc = next((i for i in self.core.incidents() if i["incident_id"] == iid), None)
            verdict = (inc or {}).get("verdict", {})
            group = verdict.get("group")
            if group and group.endswith("/*"):  # an operator's export names the job: its (first) group's curves
                group = next((g for g in self.core.series.to_dict() if g.startswith(group[:-1])), None)
            series = self.core.series.to_dict(group).get(group) if group else None
            history = history_from_series(series, self._around(verdict))
            scale = core_status.loss_scale(self.core, job) if job else None
            if history is not None and scale is not None:
                history["loss_scale"] = scale  # the report draws the scale and marks its overflow steps
            rank_map = list(self.core.rank_maps.get(job, []))
            self._submit(write_report_files, path.parent, history, rank_map)

    def _refresh(self, iid: str) -> None:
        """The incident ended (resumed, terminated) after its files were written: write
        incident.json again and render the report again, or both would still say it holds
        the job paused."""
        path = self.core.rewrite_incident(iid)
        if path is not None:
            self._submit(_render_again, path.parent)

    def _around(self, verdict: dict) -> dict:
        """The report's proof, taken while the coordinator (or its ingest shards: ``proof``)
        still holds the steps around the verdict."""
        if self.proof is not None:
            return self.proof(verdict)
        return self.core.series.recent.proof(verdict)

    # --- bundles -------------------------------------------------------------------
    def accept_chunk(self, body: dict) -> bool:
        """Route one BUNDLE_CHUNK by its transfer id; False if it is not an incident's."""
        iid = body.get("transfer")
        asm = self.assemblers.get(iid) if isinstance(iid, str) else None
        if asm is None:
            return False
        data = body.get("data")
        self.received[iid] = self.received.get(iid, 0) + (len(data) if isinstance(data, (bytes, bytearray)) else 0)
        done = asm.accept(body)
        rank = body.get("rank")
        if done is not None and isinstance(rank, int) and (iid, rank) not in self.reported:
            rank_dir = incident_rank_dir(asm.dest_root, rank)
            if bundle_complete(rank_dir):
                self.reported.add((iid, rank))
                self.core.on_bundle(iid, rank, str(rank_dir))
        return True

    def problems(self, iid: str) -> list[str]:
        asm = self.assemblers.get(iid)
        return [str(p) for p in asm.problems][:100] if asm is not None else []

    # --- I/O thread ----------------------------------------------------------------
    def _submit(self, fn: Callable[..., Any], *args: Any) -> None:
        self._jobs = [f for f in self._jobs if not f.done()]
        self._jobs.append(self._io.submit(fn, *args))

    def flush(self, timeout: float = 30.0) -> None:
        concurrent.futures.wait(list(self._jobs), timeout)

    def close(self) -> None:
        self.flush()
        self._io.shutdown(wait=True)


def bundle_complete(rank_dir: Path) -> bool:
    """Complete = a final manifest.json arrived and every file it lists did too."""
    for manifest in rank_dir.rglob(MANIFEST):
        try:
            doc = json.loads(manifest.read_text())
        except (OSError, ValueError):
            continue
        if doc.get("state") == "writing":
            continue
        if all((manifest.parent / f.get("path", "")).is_file() for f in doc.get("files", [])):
            return True
    return False


def _render_again(d: Path) -> None:
    try:
        from rankscope.coordinator.report.render import render_report
        render_report(d)  # with the history.json written beside it the first time
    except Exception:
        log.exception("rendering report.html again in %s failed", d)


def write_report_files(d: Path, history: dict | None, rank_map: list) -> None:
    try:
        # The node agents' rank map (claims -> assigned ids) beside the incident, as a file
        # of its own for tools that do not read incident.json.
        write_rank_map(d / "rank_map.json", rank_map)
        if history is not None:
            save_history(d, history)
        from rankscope.coordinator.report.render import render_report
        render_report(d, history)
    except Exception:
        log.exception("writing report.html into %s failed", d)
