"""Per-rank flight recorders in the node agent, and bundles written on a rank's behalf.

A rank killed by SIGKILL (or a segfault, or the OOM killer) cannot write its own RDR
bundle. The node agent has seen every step it streamed, so it keeps the last K per rank
and writes ``<bundle_dir>/<job>/rank_<id>/rdr/`` for it with :func:`rankscope.rdr.bundle.write_bundle` (``on_behalf=True``), including the rank map entry
and how the process ended. On export the files go to the coordinator as BUNDLE_CHUNKs,
paths relative to ``rank_<id>/`` so they land in ``incidents/<id>/rank_<r>/rdr/``.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Iterator

from rankscope.node.registry import RankEntry
from rankscope.rdr.flight_recorder import FlightRecorder
from rankscope.wire.layout import dump_label, safe_id
from rankscope.wire.rank_map import rank_map_document
from rankscope.wire.records import StepBatch

log = logging.getLogger(__name__)

class RankBundles:
    def __init__(self, bundle_dir: str | Path, k: int = 8) -> None:
        self.root = Path(bundle_dir)
        self.k = k
        self._recorders: dict[tuple[str, int], FlightRecorder] = {}
        self.written: dict[tuple[str, int], Path] = {}
        self._finished: list[tuple[str, int]] = []  # oldest first

    @staticmethod
    def _key(entry: RankEntry) -> tuple[str, int]:
        return (entry.job, entry.pid)

    def record(self, entry: RankEntry, batch: StepBatch) -> None:
        rec = self._recorders.get(self._key(entry))
        if rec is None:
            rec = self._recorders[self._key(entry)] = FlightRecorder(self.k)
        rec.record(batch)

    def recorder(self, entry: RankEntry) -> FlightRecorder | None:
        return self._recorders.get(self._key(entry))

    def write_on_behalf(self, entry: RankEntry, reason: str, rank_map: list[dict],
                        final: bool = True) -> Path | None:
        """Write a rank's bundle from what this agent saw. ``final`` (the rank is dead):
        written once, later calls return the same directory, the ring is freed. Not final
        (a live rank with no bundle of its own, asked for one): a fresh bundle every time."""
        key = self._key(entry)
        if final and key in self.written:
            return self.written[key]
        from rankscope.rdr.bundle import reserve_bundle_dir, write_bundle

        rank = entry.assigned_rank if entry.assigned_rank is not None else dump_label(None, entry.pid)
        rec = self._recorders.get(key) or FlightRecorder(self.k)
        ended = {"rank": entry.assigned_rank, "claimed_rank": entry.claimed_rank, "pid": entry.pid,
                 "host": entry.host, "last_step": entry.last_step, "exit_status": entry.exit_status,
                 "reason": entry.reason or reason}
        try:
            what = "rank_finished" if entry.state.value == "finished" else "rank_lost"
            ended["state"] = entry.state.value
            texts = {"thread_stacks.txt": stacks} if (stacks := _captured_stacks(entry)) else None
            directory = reserve_bundle_dir(self.root / safe_id(entry.job), rank)
            _carry_replay(entry, directory)
            path = write_bundle(self.root / safe_id(entry.job), rank, reason=reason, steps=rec, texts=texts,
                                on_behalf=True, extra={what: ended, "rank_map": rank_map_document(rank_map)},
                                directory=directory)
        except Exception:  # never let one bundle take the agent down
            log.exception("could not write the bundle of rank %s (pid %d) on its behalf", rank, entry.pid)
            return None
        log.warning("wrote the bundle of rank %s (pid %d, %s) on its behalf: %s", rank, entry.pid, reason, path)
        self.written[key] = path
        if final:
            self._recorders.pop(key, None)  # the ring is in the bundle; a dead rank sends no more
        return path

    def chunks(self, entry: RankEntry, transfer: str) -> Iterator[dict]:
        """BUNDLE_CHUNK bodies of the bundle written for ``entry`` (none if not written)."""
        path = self.written.get(self._key(entry))
        if path is None or entry.assigned_rank is None:
            return iter(())
        from rankscope.rdr.transfer import iter_file_chunks

        return iter_file_chunks([path], path.parent, entry.assigned_rank, safe_id(transfer), on_behalf=True)

    def retire(self, entry: RankEntry, keep: int = 64) -> None:
        """The rank ended normally. Its ring stays for an export that comes later (an
        incident judged after the job's last steps), but only for the last ``keep``
        finished ranks: a long-lived agent serves many jobs."""
        key = self._key(entry)
        if key not in self._recorders:
            return
        self._finished.append(key)
        while len(self._finished) > keep:
            self._recorders.pop(self._finished.pop(0), None)


def _carry_replay(entry: RankEntry, directory: Path) -> None:
    """The rank's latest replay record (its re-run status named the folder) goes into the
    bundle, so ``rankscope rerun`` works from the incident folder after the rank ended."""
    from rankscope.files import replay_files
    record = entry.extra.get("replay")
    if not record:
        return
    try:
        replay_files.carry(record, directory)
    except OSError as exc:  # the bundle goes without it; rerun says the record is missing
        log.warning("the replay record %s of rank %s could not join its bundle: %s", record, entry.assigned_rank, exc)


def _captured_stacks(entry: RankEntry) -> str:
    """What the rank's SIGUSR2 handler wrote (every thread's stack), if it ever ran."""
    path = entry.extra.get("stacks_file")
    if not path:
        return ""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read(1 << 20)
    except OSError:
        return ""
    if not text.strip():
        return ""
    at = entry.extra.get("stacks_at")
    when = f" at {time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(at))}Z" if at else ""
    return f"# every thread's stack, written by the rank on SIGUSR2{when} (most recent call first)\n{text}"
