"""Splits that every rank runs: a replica split that follows the job's layout is code or
configuration, not one machine.

One faulty rank leaves its replicas agreeing with each other (a majority), and two faulty
ranks in one set are a coincidence. A split where *every* replica of a set of three or
more holds its own value, or where *every* replica set of the layout splits on the same
tensor at the same step, is what a bug every rank runs makes: a parameter left out of the
gradient reduction, a reduction over the wrong group, a gradient sum forgotten between two
copies of one tensor. Such a verdict names no rank (``decided`` false, evidence
``every_rank``), says which ranks agree with which, and names the probable broken
operation from the kind of record that split.

How it can be wrong: a job that trains its replicas apart on purpose (ensembles, per-rank
fine-tuning in one job) looks the same; so would the same hardware fault on every rank at
once. Pure logic over signatures the replica detector computed.
"""
from __future__ import annotations

import numpy as np

from rankscope.coordinator.logic.detectors.named import PARAM_START
from rankscope.coordinator.logic.verdict import JOB_WIDE, Verdict
from rankscope.wire.records import Kind

RULE_ALL_DIFFER = "every replica holds its own value: a split that follows the layout, not one rank"
RULE_EVERY_SET = "every replica set of the layout splits on this tensor at this step: a split that follows the layout"

#: The fewest ranks whose all-distinct values read as systematic: with two, one faulty rank
#: and a bug look alike.
MIN_ALL_DISTINCT = 3


def classes(sig: np.ndarray) -> list[list[int]]:
    """Positions of ``sig`` grouped by equal value, groups in order of first appearance."""
    out: dict[int, list[int]] = {}
    for i, s in enumerate(sig.tolist()):
        out.setdefault(s, []).append(i)
    return list(out.values())


def all_distinct(groups: list[list[int]]) -> bool:
    """Whether every compared rank holds a value of its own (and there are enough of them)."""
    return len(groups) >= MIN_ALL_DISTINCT and all(len(g) == 1 for g in groups)


def probable_cause(tensor: str | None, kind: str | None, where: str, first_step: bool = False) -> str:
    """The operation most likely broken, from what split (one sentence). ``first_step``:
    the split is at the first step watched, before any update the probe saw."""
    name = (tensor or "").split(".")[-1] or "this tensor"
    if kind == Kind.OPT_STATE.name.lower():
        return (f"the optimizer state {tensor} differs on every replica: its gradient is not reduced {where}, "
                "or the optimizer state is sharded without the layout saying so")
    if kind == Kind.GRAD_REDUCED.name.lower():
        return (f"the reduced gradient of {name} differs on every replica: its reduction is missing or runs over "
                f"the wrong group ({where})")
    if kind == Kind.PARAM.name.lower() and tensor and tensor.startswith(PARAM_START) and first_step:
        return (f"{name} differs on every replica as the step starts: either the ranks started from different "
                f"weights, or its gradient is not reduced {where} (a parameter left out of the gradient reducer, "
                "e.g. added after the reducer was built)")
    if kind == Kind.PARAM.name.lower():
        return (f"{name} differs on every replica after an update: its gradient is not reduced {where} "
                "(a parameter left out of the gradient reducer, e.g. added after the reducer was built, or reduced "
                "over the wrong group)")
    return f"{tensor} must be identical {where} and is not on any of them: a collective missing or over the wrong group"


def mark(v: Verdict, rule: str, agree: list[list[int]], where: str, first_step: bool = False,
         cause: str | None = None) -> Verdict:
    """Turn a replica verdict into a job-wide one: no rank named, who agrees with whom, why
    (``cause``: the probable broken operation where the caller knows it better)."""
    v.decided = False
    ev = v.evidence
    ev["rule"] = rule
    ev["systematic"] = True
    ev["agreeing_sets"] = [sorted(g) for g in agree][:64]
    # No rank is off a majority (there is none): a reader of the evidence must not take
    # the first compared rank for the culprit.
    ev["deviating_ranks"] = []
    ev["probable_cause"] = cause or probable_cause(v.tensor, v.kind, where, first_step)
    ev[JOB_WIDE] = ("every rank runs this split (it follows the layout, so it is code or configuration, not "
                    f"one machine): {ev['probable_cause']}")
    return v
