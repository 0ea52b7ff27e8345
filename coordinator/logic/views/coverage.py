"""What the coordinator saw and judged, per rank and step: the ground under every "no
divergence".

A verdict of "nothing found" is only worth the steps it covers. :class:`Coverage` marks
each (rank, step) whose records were in a judged step, keeps what the ranks said they
dropped, and :func:`describe` says it in one line: "watched steps 0-15 on 4/4 ranks", or
"rank 2 steps 4-9 not seen (212 steps dropped in the rank)". Pure: no clock, no I/O.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, Iterable


class StepRanges:
    """A set of step numbers kept as sorted, disjoint, inclusive ranges (steps arrive
    mostly in order, so this stays a handful of ranges)."""

    def __init__(self) -> None:
        self._lo: list[int] = []
        self._hi: list[int] = []

    def add(self, step: int) -> None:
        self.add_range(step, step)

    def add_range(self, lo: int, hi: int) -> None:
        """Add the steps lo..hi (merged with the ranges they overlap or touch)."""
        los, his = self._lo, self._hi
        if his and his[-1] >= lo - 1 and los[-1] <= lo:  # at the end, the usual case
            if hi > his[-1]:
                his[-1] = hi
            return
        i = bisect.bisect_left(his, lo - 1)  # the first range that ends at lo - 1 or later
        j = bisect.bisect_right(los, hi + 1)  # ranges from j on start after hi + 1
        if i < j:
            lo, hi = min(lo, los[i]), max(hi, his[j - 1])
        los[i:j], his[i:j] = [lo], [hi]

    def copy(self) -> "StepRanges":
        out = StepRanges()
        out._lo, out._hi = list(self._lo), list(self._hi)
        return out

    def ranges(self) -> list[tuple[int, int]]:
        return list(zip(self._lo, self._hi))

    def __len__(self) -> int:
        return sum(h - l + 1 for l, h in zip(self._lo, self._hi))

    def bounds(self) -> tuple[int, int] | None:
        return (self._lo[0], self._hi[-1]) if self._lo else None

    def intersection(self, other: "StepRanges") -> "StepRanges":
        """The steps in both sets."""
        out, i, j = StepRanges(), 0, 0
        while i < len(self._lo) and j < len(other._lo):
            lo, hi = max(self._lo[i], other._lo[j]), min(self._hi[i], other._hi[j])
            if lo <= hi:
                out._lo.append(lo)
                out._hi.append(hi)
            if self._hi[i] < other._hi[j]:
                i += 1
            else:
                j += 1
        return out

    def missing(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """The ranges of [lo, hi] not in the set."""
        gaps, at = [], lo
        for l, h in zip(self._lo, self._hi):
            if h < at:
                continue
            if l > hi:
                break
            if l > at:
                gaps.append((at, min(l - 1, hi)))
            at = max(at, h + 1)
        if at <= hi:
            gaps.append((at, hi))
        return gaps


@dataclass
class RankCoverage:
    judged: StepRanges = field(default_factory=StepRanges)
    dropped_steps: int = 0  # steps the rank's client dropped (its queue was full)


#: Runs a job's log keeps before folding the oldest half into per-rank ranges: bounds its
#: memory when the judged ranks change often (ranks coming and going).
MAX_RUNS = 64


class _JobLog:
    """One job's judged steps as runs of consecutive steps judged with the same ranks:
    each step costs O(1) however many ranks it had (a rank-by-rank update was most of a
    16k-rank step's bookkeeping), and per-rank ranges are built when a report asks."""

    def __init__(self) -> None:
        self.runs: list[list] = []  # [first step, last step, ranks (a shared tuple)]
        self.folded: dict[int, StepRanges] = {}

    def add(self, step: int, ranks: tuple[int, ...]) -> None:
        if self.runs:
            last = self.runs[-1]
            if step == last[1] + 1 and (last[2] is ranks or last[2] == ranks):
                last[1] = step
                return
            for run in reversed(self.runs[-4:]):  # share an equal tuple: bounded memory
                if run[2] == ranks:
                    ranks = run[2]
                    break
        self.runs.append([step, step, ranks])
        if len(self.runs) > MAX_RUNS:
            old, self.runs = self.runs[:MAX_RUNS // 2], self.runs[MAX_RUNS // 2:]
            _apply(self.folded, old)

    def per_rank(self) -> dict[int, StepRanges]:
        out = {r: rng.copy() for r, rng in self.folded.items()}
        _apply(out, self.runs)
        return out


def _apply(into: dict[int, StepRanges], runs: list[list]) -> None:
    for lo, hi, ranks in runs:
        for r in ranks:
            rng = into.get(r)
            if rng is None:
                rng = into[r] = StepRanges()
            rng.add_range(lo, hi)


class Coverage:
    def __init__(self) -> None:
        self._jobs: dict[str, _JobLog] = {}
        self._dropped: dict[tuple[str, int], int] = {}
        self._dumps: dict[tuple[str, int], dict[str, Any]] = {}

    def judged(self, job: str, step: int, ranks: Iterable[int]) -> None:
        """A step was judged with these ranks' records in it."""
        log = self._jobs.get(job)
        if log is None:
            log = self._jobs[job] = _JobLog()
        log.add(int(step), tuple(int(r) for r in ranks))

    def local_dump(self, job: str, rank: int, detail: dict[str, Any]) -> None:
        """What of the rank's local dump stays on disk (STATUS ``dump``)."""
        self._dumps[(job, rank)] = {k: v for k, v in detail.items() if k != "rank"}

    def dumps_of(self, job: str) -> dict[int, dict[str, Any]]:
        return {r: d for (j, r), d in self._dumps.items() if j == job}

    def dropped(self, job: str, rank: int, steps: int) -> None:
        """The rank says it has dropped this many steps so far (a running total)."""
        key = (job, rank)
        self._dropped[key] = max(self._dropped.get(key, 0), steps)

    def per_rank(self, job: str) -> dict[int, StepRanges]:
        """Each rank's judged steps (ranks with none are absent)."""
        log = self._jobs.get(job)
        return log.per_rank() if log is not None else {}

    def dropped_of(self, job: str) -> dict[int, int]:
        return {r: n for (j, r), n in self._dropped.items() if j == job}

    def report(self, job: str, ends: dict[int, int | None]) -> dict[str, Any]:
        """What was watched of ``job``. ``ends``: every rank known to the job, with the
        last step it can have run when it ended early (lost), else None (ran to the end)."""
        judged, dropped = self.per_rank(job), self.dropped_of(job)
        mine = {r: RankCoverage(judged.get(r, StepRanges()), dropped.get(r, 0)) for r in set(judged) | set(dropped)}
        return _with_dumps(_report(job, mine, ends), self.dumps_of(job))


class ShardedCoverage(Coverage):
    """Coverage when K ingest shards judge the records (each a share of the kinds): a
    step counts as watched for a rank only when every shard judged it with that rank's
    records, so a step one shard lost (or judged without the rank) is "not seen", never
    quietly half-judged. What ranks say they dropped is kept here, as in :class:`Coverage`."""

    def __init__(self, count: int) -> None:
        super().__init__()
        self.shards = [Coverage() for _ in range(count)]

    def judged_by(self, shard: int, job: str, step: int, ranks: Iterable[int]) -> None:
        self.shards[shard].judged(job, step, ranks)

    def report(self, job: str, ends: dict[int, int | None]) -> dict[str, Any]:
        parts = [c.per_rank(job) for c in self.shards]
        dropped = self.dropped_of(job)
        mine = {}
        for rank in set().union(*parts, dropped):
            judged: StepRanges | None = None
            for part in parts:
                got = part.get(rank, StepRanges())
                judged = got if judged is None else judged.intersection(got)
            mine[rank] = RankCoverage(judged if judged is not None else StepRanges(), dropped.get(rank, 0))
        return _with_dumps(_report(job, mine, ends), self.dumps_of(job))


def _report(job: str, mine: dict[int, RankCoverage], ends: dict[int, int | None]) -> dict[str, Any]:
    bounds = [rc.judged.bounds() for rc in mine.values() if rc.judged.bounds() is not None]
    ranks = sorted(set(ends) | set(mine))
    if not bounds:
        return {"job": job, "steps": None, "ranks": len(ranks), "watched_ranks": 0,
                "complete": False, "not_seen": [{"rank": r, "steps": "all"} for r in ranks]}
    lo, hi = min(b[0] for b in bounds), max(b[1] for b in bounds)
    not_seen, watched = [], 0
    for r in ranks:
        rc = mine.get(r, RankCoverage())
        end = ends.get(r)
        top = hi if end is None else min(hi, end)
        gaps = rc.judged.missing(lo, top) if top >= lo else []
        if len(rc.judged):
            watched += 1
        if gaps or rc.dropped_steps or not len(rc.judged):
            entry = {"rank": r, "steps": [list(g) for g in gaps] if len(rc.judged) else "all"}
            if rc.dropped_steps:
                entry["dropped_steps"] = rc.dropped_steps
            not_seen.append(entry)
    out = {"job": job, "steps": [lo, hi], "ranks": len(ranks), "watched_ranks": watched,
           "complete": not not_seen, "not_seen": not_seen}
    # A rank lost before the last step ran no later one: said, so "steps 0-N on all ranks"
    # does not read as N seen on it.
    lost = [{"rank": r, "through": ends[r]} for r in ranks if ends.get(r) is not None and ends[r] < hi]
    if lost:
        out["lost"] = lost
    return out


def _with_dumps(report: dict[str, Any], dumps: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Removals by the local dump's retention: which ranks removed which steps, and why."""
    removed = {r: d for r, d in dumps.items() if d.get("removed")}
    if removed:
        report["local_dump"] = {str(r): d for r, d in sorted(removed.items())}
    return report


def dump_text(report: dict[str, Any]) -> str:
    """``local dump: ranks 0-3 keep steps 300-399 (...; 300 earlier steps removed)``, ranks
    that kept alike sharing a phrase; "" when no rank removed a step."""
    by: dict[tuple, list[int]] = {}
    for r, d in (report.get("local_dump") or {}).items():
        by.setdefault((d["kept_from"], d["kept_to"], d["removed"], d["why"]), []).append(int(r))
    parts = []
    for (lo, hi, n, why), ranks in by.items():
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {_ranges_text(_runs(ranks))}"
        parts.append(f"{who} keep steps {lo}-{hi} on disk, {n} earlier step(s) removed ({why})")
        if len(parts) == 3:
            break
    return "local dump: " + "; ".join(parts) if parts else ""


def describe(report: dict[str, Any]) -> str:
    """One line for people: what was watched, then what was not."""
    n = report["ranks"]
    if report["steps"] is None:
        return f"nothing watched: no step of any of {n} rank(s) reached the coordinator" + _stop_text(report, "; ")
    lo, hi = report["steps"]
    line = f"watched steps {lo}-{hi} on {report['watched_ranks']}/{n} ranks"
    parts = []
    for e in report["not_seen"]:
        if e["steps"] == "all":
            what = f"rank {e['rank']} not seen at all"
        elif e["steps"]:
            one = len(e["steps"]) == 1 and e["steps"][0][0] == e["steps"][0][1]
            what = f"rank {e['rank']} {'step' if one else 'steps'} {_ranges_text(e['steps'])} not seen"
        else:
            what = f"rank {e['rank']}"
        if e.get("dropped_steps"):
            what += f" ({e['dropped_steps']} step(s) dropped in the rank)"
        parts.append(what)
    parts += [f"rank {e['rank']} lost after step {e['through']}" if e["through"] >= lo else f"rank {e['rank']} lost"
              for e in report.get("lost") or [] if not any(n["rank"] == e["rank"] for n in report["not_seen"])]
    return line + ("; " + "; ".join(parts) if parts else "") + _stop_text(report, "; ") + _scale_text(report) \
        + _cost_text(report)


def _cost_text(report: dict[str, Any]) -> str:
    """Where the default watch spread the weights' fingerprints over steps: how late a
    silent weight change can be named."""
    every = (report.get("watch_cost") or {}).get("fingerprint_every_steps") or 1
    if every <= 1:
        return ""
    return f"; weights fingerprinted every {every} steps to stay within the watch's budget " \
        f"(a silent weight change is named up to {every - 1} step(s) late; --watch full checks every step)"


def _scale_text(report: dict[str, Any]) -> str:
    """A job under a loss scale: its overflow steps, which are healthy and no finding."""
    scale = report.get("loss_scale")
    if not scale or not scale.get("overflow_steps"):
        return ""
    now = scale.get("scale")
    return (f"; loss scale {now:g}" if isinstance(now, (int, float)) else "; loss scale") + \
        f": {scale['overflow_steps']} overflow step(s), the update skipped by the scaler (no finding)"


def _stop_text(report: dict[str, Any], sep: str) -> str:
    """Where the job was stopped from outside (:mod:`.stops`), if it was."""
    stop = report.get("stopped")
    if not stop:
        return ""
    ranks = stop["ranks"]
    who = f"rank {ranks[0]}" if len(ranks) == 1 else f"{len(ranks)} ranks ({_ranges_text(_runs(ranks))})"
    return f"{sep}{who} stopped together from outside by {stop['signal']} after step {stop['after_step']} " \
        "(no rank failed first)"


def _runs(ranks: list[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for r in sorted(ranks):
        if out and out[-1][1] == r - 1:
            out[-1][1] = r
        else:
            out.append([r, r])
    return out


def _ranges_text(ranges: list[list[int]]) -> str:
    return ", ".join(f"{lo}" if lo == hi else f"{lo}-{hi}" for lo, hi in ranges)
