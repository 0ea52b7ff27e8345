"""Weights the layout keeps as copies beyond the data-parallel replicas, which must match.

Megatron-style jobs keep two kinds of copies the replica comparison (inside a shard's
replica set) cannot see:

- *Tensor-parallel copies*: the normalisation weights, whole on every shard of a replica.
  Each shard's gradient of its copy is only its part (the shard's half of the layer behind
  it) until it is summed over the tensor-parallel group, which the backward of "copy to
  the tensor-parallel region" (or a sequence-parallel norm's gradient all-reduce) does.
- *Pipeline copies*: a word embedding tied between the first stage (the input lookup) and
  the last (the output projection). Each stage's gradient is its use only until the two
  are summed over the embedding group.

Forget that sum and the copies drift apart from the first update while the replicas of one
shard or stage still agree with each other.

Which weights: step-start parameters whose name says normalisation (a dotted part holding
"norm", a GPT-style ``ln``/``ln_1``/``ln_f``, or a LayerNorm's ``gamma``/``beta``), compared
among the ranks of one data replica and one stage; and parameters whose name holds
"embed", compared among the stages of one data replica that hold one by the same name.
Learned per name: the ranks of a group must hold it equal the first time they are
compared, so a norm sharded on purpose and loaded per shard, or an untied output layer,
is never taken for a copy. Groups come from
:class:`~rankscope.coordinator.logic.job.row_sets.RowSets`: a row's data replica and stage.

How it can be wrong: a norm sharded on purpose but started alike on every shard (a
per-head norm over a sharded head dimension, initialised to ones), or two untied
embedding tables of one name on two stages started from one seed, start equal and split
at the first update: they are then named as a missing reduction. Pure logic over a view.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import numpy as np

from rankscope.coordinator.logic.align.aligner import StepView
from rankscope.coordinator.logic.detectors import systematic
from rankscope.coordinator.logic.detectors.common import MAX_EVIDENCE_RANKS, crc_hex
from rankscope.coordinator.logic.detectors.named import PARAM_START
from rankscope.text.spans import rank_span

_NORM_PART = re.compile(r"norm(?!al)|^ln(_\w+|\d*)$", re.IGNORECASE)
_NORM_LEAF = frozenset({"gamma", "beta"})
_EMBED = re.compile(r"embed", re.IGNORECASE)


def is_norm_param(name: str) -> bool:
    """Whether a parameter's name says it belongs to a normalisation layer."""
    parts = name.split(".")
    return parts[-1] in _NORM_LEAF or any(_NORM_PART.search(p) for p in parts)


def is_embedding_param(name: str) -> bool:
    return bool(_EMBED.search(name))


def tensor_parallel_groups(view: StepView) -> list[np.ndarray]:
    return [] if view.sets is None else view.sets.tensor_parallel_groups()


def pipeline_groups(view: StepView) -> list[np.ndarray]:
    return [] if view.sets is None else view.sets.pipeline_groups()


@dataclass(frozen=True)
class Copies:
    """One kind of copy: which parameters, among which rows, and what a split means."""
    key: str
    matches: Callable[[str], bool]
    groups: Callable[[StepView], list[np.ndarray]]
    rule: str
    across: str  # where the copies are, as "across ..." reads it
    summed: str  # the group their gradients must be summed over
    missing: str  # the operation a split says is missing

    def columns(self, view: StepView, state: dict) -> np.ndarray:
        """Step-start parameter columns of this kind (a view's key table only grows: the
        names are scanned once)."""
        names = view.keys.names
        upto, found = state.get(self.key + "_cols", (0, []))
        width = view.present.shape[1]
        if upto < width:
            found = found + [c for c in range(upto, width)
                             if names[c].startswith(PARAM_START) and self.matches(names[c][len(PARAM_START):])]
            state[self.key + "_cols"] = (width, found)
        return np.array([c for c in found if c < width], np.int64)

    def learned(self, view: StepView, state: dict, groups: list[np.ndarray], cols: np.ndarray,
                equal: Callable[[np.ndarray, np.ndarray], bool]) -> np.ndarray:
        """The columns of ``cols`` learned as copies: held equal in every group the first
        step two or more of its rows had them (``equal(rows, cols)``: whether the present
        cells hold one value per column)."""
        seen: dict[str, bool] = state.setdefault(self.key, {})
        names = view.keys.names
        keep = []
        for c in cols.tolist():
            name = names[c]
            if name not in seen:
                compared = [g for g in groups if view.present[g, c].sum() >= 2]
                if not compared:
                    continue
                one = np.array([c], np.int64)
                seen[name] = all(equal(g, one) for g in compared)
            if seen[name]:
                keep.append(c)
        return np.array(keep, np.int64)

    def mark(self, findings: list, groups: list[np.ndarray], view: StepView, first_step: bool,
             sig: np.ndarray) -> None:
        """Mark job-wide the findings when every group split on one weight: no rank named,
        which ranks agree with which across the job, the sum that is missing. ``sig``:
        (rows,) signatures of the findings' column over every row."""
        open_ = [f for f in findings if not f.verdict.decided]
        if len(groups) < 2 or len(open_) != len(groups) or len({f.verdict.tensor for f in open_}) != 1:
            return
        col = open_[0].col
        rows = np.flatnonzero(view.present[:, col])
        agree = [[int(view.ranks[rows[i]]) for i in g] for g in systematic.classes(sig[rows])]
        where = "; ".join(rank_span(sorted(int(view.ranks[r]) for r in g if view.present[r, col])) for g in groups)
        name = view.keys.names[col][len(PARAM_START):]
        cause = (f"{name} is copied on {self.across} and the copies differ after an update: its gradient is not "
                 f"summed across {self.summed} ({where}); {self.missing}")
        crc = view.crc[:, col]
        by_rank = {str(int(view.ranks[r])): crc_hex(crc[r]) for r in rows[:MAX_EVIDENCE_RANKS]}
        copy_groups = [sorted(int(view.ranks[r]) for r in g if view.present[r, col]) for g in groups][:64]
        for f in open_:
            systematic.mark(f.verdict, self.rule, agree, f"across {self.across} ({where})", first_step, cause=cause)
            ev = f.verdict.evidence
            ev.pop("replica_set", None)  # the rows compared were a group of copies, not replicas
            ev["copy_groups"], ev["crc32_by_rank"] = copy_groups, by_rank


TENSOR_PARALLEL = Copies(
    "tp_copies", is_norm_param, tensor_parallel_groups,
    "every tensor-parallel group splits on this replicated weight at this step, each replica of a shard agreeing "
    "with the others: a split that follows the layout",
    "the tensor-parallel ranks of each replica", "the tensor-parallel group",
    "the backward of the copy into the tensor-parallel region (or a sequence-parallel norm's gradient all-reduce) "
    "is missing")
PIPELINE = Copies(
    "pp_copies", is_embedding_param, pipeline_groups,
    "every replica's stages split on this tied weight at this step, each replica of a stage agreeing with the "
    "others: a split that follows the layout",
    "the pipeline stages of each replica", "the embedding group",
    "the all-reduce of the tied embedding's gradient over the embedding group (first and last stage) is missing")
KINDS = (TENSOR_PARALLEL, PIPELINE)
