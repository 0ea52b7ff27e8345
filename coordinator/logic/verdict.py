"""A detector's finding: one first rank, its step and tensor, and the evidence."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

#: Detector names in the order a user trusts them (DESIGN "How a divergence is found");
#: verdicts of one judged step are returned in this order.
#: The evidence key of a finding every rank runs (a job-wide fault: code, data or
#: configuration); its value says so in a sentence. Such a verdict names no rank.
JOB_WIDE = "every_rank"
TRUST_ORDER = ("nan_origin", "replica", "param_moved", "outlier", "progress", "loss_scale", "watchpoint")


@dataclass
class Verdict:
    """``rank`` is the first diverging rank (earliest by step, then execution order);
    ``ties`` the other ranks that were equally first. ``group`` names the comparison
    group (``"<job>/<index>"``). ``evidence`` holds the group's values beside the rank's
    and the rule that fired; it is JSON-ready and bounded in size."""

    detector: str
    rank: int
    step: int
    tensor: str | None
    exec_index: int | None
    kind: str | None
    group: str
    evidence: dict[str, Any] = field(default_factory=dict)
    ties: list[int] = field(default_factory=list)
    job: str = ""
    #: Inference (token_range capture): the decode call the rank was at, else None.
    token: int | None = None
    #: A crash or hang: ranks that died or are stuck cannot pause, so the incident
    #: exports at once instead of waiting for the pause.
    urgent: bool = False
    #: False: the ranks ``[rank, *ties]`` disagree and nothing tells which one is wrong
    #: (two replicas, no majority). Such a verdict names no culprit: its incident exports
    #: and the job runs on, whatever ``on_divergence`` says.
    decided: bool = True

    @property
    def candidates(self) -> list[int]:
        return sorted({self.rank, *self.ties})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Verdict":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})

    def sort_key(self) -> tuple:
        order = TRUST_ORDER.index(self.detector) if self.detector in TRUST_ORDER else len(TRUST_ORDER)
        # A verdict that names a rank goes before one that cannot, of the same step.
        return (self.step, not self.decided, order, -1 if self.exec_index is None else self.exec_index, self.rank)

    def summary(self) -> str:
        if self.detector == "manual":
            return f"manual: bundles exported on an operator's request at step {self.step} (no divergence named)"
        where = f" tensor {self.tensor}" if self.tensor else ""
        if JOB_WIDE in self.evidence:
            return f"{self.detector}: job-wide split at step {self.step}{where}: every rank runs it, no rank named"
        if not self.decided:
            return f"{self.detector}: undecided between ranks {self.candidates} step {self.step}{where}"
        ties = f" (tied with ranks {self.ties})" if self.ties else ""
        return f"{self.detector}: rank {self.rank} step {self.step}{where}{ties}"
