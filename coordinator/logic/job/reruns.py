"""What the ranks' re-runs of anomalous steps said, per job and rank: the classification a
verdict carries (deterministic / transient / not re-run) and each rank's strike count.

A rank re-runs a step whose own loss or gradients look wrong (rankscope.probe.rerun.rerun) and
says what came out in a STATUS ``rerun`` (rankscope.wire.rerun_facts). It says it before
the step's records leave the rank, so the verdict on that step usually finds it here;
one that comes later is added to the incident already open (:meth:`IncidentBook.on_rerun`).

Bounded: the newest :data:`KEEP_PER_RANK` outcomes of each rank, and counters.
"""
from __future__ import annotations

from collections import deque
from typing import Any

from rankscope.wire import rerun_facts as facts

KEEP_PER_RANK = 64
#: Transient steps listed per rank in status and coverage (the count goes on).
LISTED_STEPS = 20


class RerunBook:
    def __init__(self) -> None:
        self._recent: dict[tuple[str, int], deque[dict[str, Any]]] = {}
        self._counts: dict[tuple[str, int], dict[str, int]] = {}
        self._transient_steps: dict[tuple[str, int], deque[int]] = {}

    def add(self, job: str, detail: dict[str, Any]) -> dict[str, Any]:
        """One rank's outcome (validated by the wire decoder); returns it with its line."""
        key = (job, int(detail["rank"]))
        entry = {**detail, "line": facts.classification(detail)}
        self._recent.setdefault(key, deque(maxlen=KEEP_PER_RANK)).append(entry)
        counts = self._counts.setdefault(key, {o: 0 for o in facts.OUTCOMES})
        counts[detail["outcome"]] += 1
        if detail["outcome"] == facts.TRANSIENT:
            self._transient_steps.setdefault(key, deque(maxlen=LISTED_STEPS)).append(int(detail["step"]))
        return entry

    def lookup(self, job: str, rank: int, step: int) -> dict[str, Any] | None:
        """The outcome of that rank's re-run of that step, if it made one."""
        for entry in reversed(self._recent.get((job, int(rank)), ())):
            if entry["step"] == step:
                return entry
        return None

    def strikes(self, job: str) -> dict[str, dict[str, Any]]:
        """Per rank that re-ran anything: how often each outcome came, and the steps of the
        newest transient ones (a rank with repeated transients is a node to drain)."""
        out = {}
        for (j, rank), counts in sorted(self._counts.items()):
            if j == job:
                out[str(rank)] = {**counts, "transient_steps": list(self._transient_steps.get((j, rank), ()))}
        return out


def strikes_text(strikes: dict[str, dict[str, Any]]) -> str:
    """``re-runs: rank 2: 3 transient (steps 5, 90, 311); rank 0: 1 reproduced``, or ""."""
    parts = []
    for rank, s in sorted(strikes.items(), key=lambda kv: (-kv[1][facts.TRANSIENT], int(kv[0]))):
        bits = []
        if s[facts.TRANSIENT]:
            steps = ", ".join(map(str, s["transient_steps"]))
            bits.append(f"{s[facts.TRANSIENT]} transient (step{'s' if len(s['transient_steps']) > 1 else ''} {steps})")
        if s[facts.REPRODUCED]:
            bits.append(f"{s[facts.REPRODUCED]} reproduced")
        if s[facts.NOT_POSSIBLE]:
            bits.append(f"{s[facts.NOT_POSSIBLE]} not re-run")
        parts.append(f"rank {rank}: " + ", ".join(bits))
    return "re-runs of anomalous steps: " + "; ".join(parts) if parts else ""
