"""What the live console asks the coordinator service: one snapshot a poll (the status with
a row per rank, plus the grid's judged steps the console does not hold yet), the tensors
of a kept step, one tensor over the kept steps, new watchpoints, and watchpoints checked
again over the kept steps. Read on the loop thread, like status, in turns short enough
that a step due to be judged never waits long behind a page."""
from __future__ import annotations

import time
from typing import Any

#: Judged steps per group the grid shows; older ones are in report.html and history.json.
GRID_STEPS = 64
#: Newest verdicts a snapshot lists (each detector's repeats are already held back).
MAX_VERDICTS = 200
#: Seconds a snapshot's coverage may be old: it changes slowly, and reading it holds the
#: ingest thread longer than the rest of the snapshot at a few hundred ranks.
COVERAGE_EVERY_S = 5.0
#: What :meth:`ConsoleQueries.console` answers.
QUERIES = ("snapshot", "tensors", "tensor", "watchpoints", "recheck", "capture")


class ConsoleQueries:
    """Mixed into :class:`~.service.CoordinatorService` beside StatusReports."""

    core: Any
    frontend: Any
    link: Any

    def console(self, what: str, args: dict | None = None) -> Any:
        """ValueError naming the field when ``what`` or its arguments are wrong."""
        args = dict(args or {})
        if what not in QUERIES:
            raise ValueError(f"console: {what!r} is not one of {', '.join(QUERIES)}")
        if what in ("watchpoints", "recheck"):
            rules = args.get("rules")
            if what == "recheck" and rules is None:
                return self.frontend.call_sync(self._recheck, None)  # the rules set now
            if not isinstance(rules, list):
                raise ValueError(f"console {what}: args.rules must be a list of watchpoint rules")
            if self.link is not None:
                raise ValueError(f"console {what}: with ingest shards the watchpoints and the kept steps are the "
                                 "shards' (set them in cluster.watchpoints before the start)")
            from rankscope.config.watchpoints import parse_watchpoints
            parsed = parse_watchpoints(rules, "watchpoints")  # a ValueError naming the field, off the loop thread
            if what == "recheck":
                return self.frontend.call_sync(self._recheck, parsed)
            return self.frontend.call_sync(self._set_watchpoints, rules)
        if what == "snapshot":
            return self._console_snapshot(args)
        return self.frontend.call_sync(getattr(self, f"_console_{what}"), args)

    def _console_snapshot(self, args: dict) -> dict:
        """Two turns of the loop thread, not one: the status with its rank rows, then the
        grid's new columns and the verdicts (a step judged between them is in the grid and
        not yet in the status: the page shows it a poll later). ``args.since``: per group,
        the newest step the console holds."""
        steps, since = args.get("steps", GRID_STEPS), args.get("since")
        if not isinstance(steps, int) or steps < 0:
            raise ValueError(f"console snapshot: args.steps must be a non-negative integer, got {steps!r}")
        if since is not None and not (isinstance(since, dict) and all(
                isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in since.items())):
            raise ValueError(f"console snapshot: args.since must map a group to a step, got {since!r:.80}")
        st = self.frontend.call_sync(self._console_status)
        st.update(self.frontend.call_sync(self._console_columns, steps, since))
        return st

    def _console_status(self) -> dict:
        now = time.monotonic()
        held = getattr(self, "_console_coverage", None)
        fresh = held is not None and now - held[0] < COVERAGE_EVERY_S
        st = self._status(coverage=not fresh)  # type: ignore[attr-defined]
        if fresh:
            st["coverage"] = held[1]
        else:
            self._console_coverage = (now, st["coverage"])
        return st

    def _console_columns(self, steps: int, since: dict | None) -> dict:
        verdicts = list(self.core.verdicts)[-MAX_VERDICTS:]
        return {"grid": self.core.series.tail(steps, since),
                "verdicts": verdict_rows(verdicts, self.core.documents()),
                "watchpoints": self._watchpoint_rows(), "sharded": self.link is not None}

    def _console_tensors(self, args: dict) -> dict | None:
        return self.core.series.recent.tensors(_group(args), _step(args))

    def _console_tensor(self, args: dict) -> dict | None:
        name, step = args.get("tensor"), _step(args)
        if not isinstance(name, str) or not name:
            raise ValueError("console tensor: args.tensor must name a tensor")
        recent = self.core.series.recent
        group = _group(args)
        if step is None:
            views = recent.views(group)
            step = views[-1].step if views else 0
        return recent.tensor_window(group, name, step, [r for r in args.get("ranks") or [] if isinstance(r, int)],
                                    before=recent.keep_steps, after=recent.keep_steps)

    def _console_capture(self, args: dict) -> dict:
        """Every kept capture (no ``id``), or one with the window ``a``, ``b``, ``index``,
        ``row``, ``col`` choose (rankscope.coordinator.logic.views.captures)."""
        cid = args.get("id")
        if cid is None:
            return {"captures": self.captures.rows()}  # type: ignore[attr-defined]
        if not isinstance(cid, str):
            raise ValueError(f"console capture: args.id must be a capture id, got {cid!r:.40}")
        index = args.get("index")
        if index is not None and not (isinstance(index, list) and all(isinstance(i, int) for i in index)):
            raise ValueError(f"console capture: args.index must list integers, got {index!r:.60}")
        for key in ("a", "b", "row", "col"):
            if args.get(key) is not None and (not isinstance(args[key], int) or isinstance(args[key], bool)):
                raise ValueError(f"console capture: args.{key} must be an integer, got {args[key]!r:.40}")
        return self.captures.view(cid, args.get("a"), args.get("b"), index,  # type: ignore[attr-defined]
                                  args.get("row") or 0, args.get("col") or 0)

    def _set_watchpoints(self, rules: list[dict]) -> dict:
        self.core.set_watchpoints(rules)
        return {"watchpoints": self._watchpoint_rows()}

    def _recheck(self, rules: tuple | None) -> dict:
        if self.link is not None:
            raise ValueError("console recheck: with ingest shards the kept steps are the shards'")
        from rankscope.coordinator.logic.views.recheck import recheck
        return recheck(self.core.series.recent.all_views(), tuple(self._watchpoints()) if rules is None else rules)

    def _watchpoint_rows(self) -> list[dict]:
        """Each rule as set, and (``blind``) what it cannot see in the job's watch."""
        from rankscope.config.watchpoints import blind_in
        return [{**w.to_dict(), "blind": blind_in(w, self.core.settings.watch)} for w in self._watchpoints()]

    def _watchpoints(self) -> list:
        for det in self.core.detectors:
            if det.name == "watchpoint":
                return list(det.rules)
        return []


def verdict_rows(verdicts: list, incidents: list[dict]) -> list[dict]:
    """Every verdict, the ones that joined an open incident (a watchpoint hit on a paused
    job) included, with the incident that holds it: what the page's hit list shows."""
    held: dict[tuple, str] = {}
    for doc in incidents:
        iid = doc["incident_id"]
        held.setdefault((doc.get("detector"), doc.get("first_diverging_rank"), doc.get("step"), doc.get("tensor")), iid)
        for r in doc.get("related_verdicts") or []:
            held.setdefault((r.get("detector"), r.get("rank"), r.get("step"), r.get("tensor")), iid)
    return [{"detector": v.detector, "rank": v.rank, "step": v.step, "tensor": v.tensor, "group": v.group,
             "job": v.job, "decided": v.decided, "candidates": v.candidates, "rule": v.evidence.get("rule"),
             "incident_id": held.get((v.detector, v.rank, v.step, v.tensor))} for v in verdicts]


def _group(args: dict) -> str:
    group = args.get("group")
    if not isinstance(group, str) or not group:
        raise ValueError("console: args.group must name a group (a job's role, as the grid lists them)")
    return group


def _step(args: dict) -> int | None:
    step = args.get("step")
    if step is not None and not isinstance(step, int):
        raise ValueError(f"console: args.step must be an integer, got {step!r}")
    return step
