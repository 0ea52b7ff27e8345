"""Replica consistency: what data parallelism keeps identical must match bit for bit.

Parameters, optimizer state and reduced gradients (REPLICATED_KINDS; every kind in
"replicas" mode, where ranks get identical input) are compared inside each replica set
of the job's layout (:mod:`..row_sets`: the ranks holding the same shard; plain data
parallelism: every rank) by a 64-bit signature of CRC-32 + the raw bits of
Max/Min/Mean/Norm + element count. A replicating collective's output (a tensor-parallel
AllReduce) is compared among the ranks of its group, which are the ranks that have its
column. Per column the majority signature is the median of the sorted signatures (a value
held by more than half the ranks always sits in the middle), so the check is one sort
over ranks for all columns at once. Ranks off the majority are flagged.

With no majority (two replicas that disagree) the majority cannot decide: a rank whose
weights changed outside the optimizer before this step (:mod:`.moved`) is named; else
the verdict names nobody (``decided`` false), lists the ranks that disagree and says it
cannot tell which is wrong.

A split of optimizer state alone whose every statistic agrees bit for bit (only the
checksum differs: a last-bit difference, which clean CPU jobs were seen to show on one
rank for one step at a time) is held for one step: if the next step shows the rank back in step with
its replicas, nothing it fed into the weights differed and it is no finding (counted in the
detector's state); if the split is still there, or the rank is flagged anew, the verdict is
given for the step it began at. A corrupted moment that matters carries into the next step,
so this costs a real finding one step of delay and nothing else.
"""
from __future__ import annotations

import logging
from typing import NamedTuple

import numpy as np

from rankscope.coordinator.logic.align.aligner import StepView
from rankscope.coordinator.logic.detectors.common import (
    MAX_EVIDENCE_RANKS,
    crc_hex,
    first_flagged,
    kind_mask,
    make_verdict,
    stats_dict,
)
from rankscope.coordinator.logic.detectors.moved import RULE as MOVED_RULE
from rankscope.coordinator.logic.detectors.moved import movers
from rankscope.coordinator.logic.detectors import layout_copies, systematic
from rankscope.coordinator.logic.detectors.named import PARAM_START, replicated_outputs
from rankscope.coordinator.logic.verdict import Verdict
from rankscope.wire.records import NO_CRC, REPLICATED_KINDS, Kind
from rankscope.text.spans import rank_span

#: Weights that differ at the first step watched were never the same: training cannot have
#: pulled them apart yet, and MindSpore's data parallel does not make them equal by itself.
START_HINT = ("the weights already differ at the first step watched, so the ranks started from different "
              "weights: give every rank the same seed (mindspore.set_seed) before building the model, load "
              "one checkpoint everywhere, or set_auto_parallel_context(parameter_broadcast=True)")

log = logging.getLogger(__name__)

_REPL = frozenset(int(k) for k in REPLICATED_KINDS)
#: Splits that healed by the next step, remembered for the status (the newest ones).
MAX_HEALED_KEPT = 16
_ABSENT = np.uint64(0xFFFFFFFFFFFFFFFF)
_MIX = np.uint64(0x9E3779B97F4A7C15)


def signatures(view: StepView, cols: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
    """(R, len(cols)) uint64: equal iff CRC, numel and every stat's bits are equal (w.h.p.).
    A column where some present rank carries no checksum is compared without checksums:
    under the default watch a rank fingerprints a reduced gradient only on the steps its
    rotation makes it due, and replicas may rotate at different rates (probe.vitals.budget)."""
    pick = (slice(None) if rows is None else rows[:, None], cols)
    bits = np.ascontiguousarray(view.stats[pick]).view(np.uint64)
    crc = view.crc[pick]
    unchecked = ((crc == NO_CRC) & view.present[pick]).any(axis=0)
    if unchecked.any():
        crc = np.where(unchecked[None, :], NO_CRC, crc)
    h = crc.astype(np.uint64) ^ (view.numel[pick].astype(np.uint64) << np.uint64(32))
    with np.errstate(over="ignore"):
        for i in range(4):
            h = (h ^ bits[:, :, i]) * _MIX
            h ^= h >> np.uint64(29)
    h[h == _ABSENT] -= np.uint64(1)  # keep the absent marker unique
    return h


def _all_equal_to_first_row(view: StepView, cols: np.ndarray) -> bool:
    # Compared over every column in place, then picked: gathering ``cols`` first copied
    # the (ranks x cols x 4) stats twice, which cost more than comparing them all. Reduced
    # over ranks first: numpy's reduction along the long axis is vectorised, along the
    # four stats of a cell it is not (4x slower at 16k ranks).
    bits = view.stats.view(np.uint64)
    same = ((bits == bits[:1]).all(axis=0).all(axis=1) & (view.crc == view.crc[:1]).all(axis=0)
            & (view.numel == view.numel[:1]).all(axis=0))
    return bool(same[cols].all())


def _unequal_sets(view: StepView, cols: np.ndarray, groups: list[np.ndarray]) -> list[np.ndarray]:
    """The replica sets some of whose rows differ from their set's first row in ``cols``:
    one comparison over every row at once, so a clean step of many sets costs no hashing."""
    if not groups:
        return []
    rep = np.arange(view.ranks.shape[0])
    for g in groups:
        rep[g] = g[0]
    bits = np.ascontiguousarray(view.stats[:, cols, :]).view(np.uint64)
    same = ((bits == bits[rep]).all(axis=2) & (view.crc[:, cols] == view.crc[rep][:, cols])
            & (view.numel[:, cols] == view.numel[rep][:, cols])
            & (view.present[:, cols] == view.present[rep][:, cols])).all(axis=1)
    return [g for g in groups if not same[g].all()]


def _equal_rows(view: StepView, rows: np.ndarray, cols: np.ndarray) -> bool:
    """Whether the present cells of ``rows`` x ``cols`` hold one value per column."""
    pres = view.present[rows[:, None], cols]
    if not pres.any():
        return True
    sig = np.where(pres, signatures(view, cols, rows), _ABSENT)
    lo = np.where(pres, sig, _ABSENT).min(axis=0)
    return bool(((sig == lo[None, :]) | ~pres).all())


def healed_summary(states: list[dict]) -> dict:
    """The splits that healed, over the replica detector's state of several groups: how
    many, and the newest ones (what status and coverage show)."""
    return {"count": sum(st.get("healed", 0) for st in states),
            "last": [x for st in states for x in st.get("healed_last", ())][-MAX_HEALED_KEPT:]}


class Finding(NamedTuple):
    verdict: Verdict
    #: Optimizer state only, every statistic equal: held a step before it is a verdict.
    round_off: bool
    row: int
    col: int
    rows: np.ndarray  # the rows compared
    #: With no majority: the compared ranks grouped by the value they hold (else []).
    classes: list[list[int]]


class ReplicaDetector:
    name = "replica"

    def __init__(self, kinds: frozenset[int] = _REPL) -> None:
        self.kinds = kinds

    def judge(self, view: StepView, state: dict) -> list[Verdict]:
        first_step = state.setdefault("first_step", view.step)
        sets = view.sets
        kinds = self.kinds
        if sets is not None and not sets.opt_state_replicated:
            kinds = kinds - {int(Kind.OPT_STATE)}
        cols = np.flatnonzero(np.ones_like(view.kind, bool) if view.replicas_mode else kind_mask(view.kind, kinds))
        if view.ranks.shape[0] < 2:
            return []
        units: list[tuple[np.ndarray | None, np.ndarray]] = []
        if sets is None or sets.whole or view.replicas_mode:
            if cols.shape[0] and not (view.present[:, cols].all() and _all_equal_to_first_row(view, cols)):
                units.append((None, cols))  # the clean case above costs no hashing or sorting
        elif cols.shape[0]:
            units += [(rows, cols) for rows in _unequal_sets(view, cols, sets.replica_groups())]
        in_sets = len(units)
        if not view.replicas_mode:
            units += self._collective_units(view)
        judged = [self._judge_rows(view, rows, c, first_step) for rows, c in units]
        if sets is not None and not sets.whole and not view.replicas_mode:
            _every_set_splits([f for f in judged[:in_sets] if f is not None], len(sets.replica_groups()), view,
                              view.step == first_step)
            judged += self._copies(view, state, first_step)
        found = [f for f in judged if f is not None]
        out = self._settle_held(view, state, found)
        hard = [f for f in found if not f.round_off]
        if hard:
            out.append(_first(hard).verdict)
        elif found:
            state["held"] = _first(found)
        return out

    @staticmethod
    def _settle_held(view: StepView, state: dict, found: list[Finding]) -> list[Verdict]:
        """The round-off split held from the step before: a verdict if it lasted, else counted."""
        held: Finding | None = state.pop("held", None)
        if held is None:
            return []
        v = held.verdict
        seen = view.step == v.step + 1 and _seen(view, held)
        split = seen and _still_split(view, held)
        if seen and not split and not any(f.row == held.row for f in found):
            state["healed"] = state.get("healed", 0) + 1
            kept = state.setdefault("healed_last", [])
            kept.append({"step": v.step, "rank": v.rank, "tensor": v.tensor})
            del kept[:-MAX_HEALED_KEPT]
            log.info("rank %d's %s differed from its replicas in the last bit at step %d and agreed again at "
                     "step %d: no finding", v.rank, v.tensor, v.step, view.step)
            return []
        v.evidence["held_one_step"] = (
            "only the checksum differed at first (a possible last-bit rounding difference); "
            + (f"still split at step {view.step}" if split else f"the rank flagged again at step {view.step}" if seen
               else f"the rank's cell not seen at step {v.step + 1}"))
        return [v]

    def _copies(self, view: StepView, state: dict, first_step: int) -> list[Finding]:
        """Copies the layout keeps beyond the replicas (layout_copies) that split."""
        out: list[Finding] = []
        for copies in layout_copies.KINDS:
            groups = copies.groups(view)
            if not groups:
                continue
            cols = copies.learned(view, state, groups, copies.columns(view, state),
                                  lambda rows, c: _equal_rows(view, rows, c))
            if not cols.shape[0]:
                continue
            found = [f for f in (self._judge_rows(view, g, cols, first_step) for g in groups
                                 if not _equal_rows(view, g, cols)) if f is not None]
            if found:
                sig = signatures(view, np.array([found[0].col], np.int64))[:, 0]
                copies.mark(found, groups, view, view.step == first_step, sig)
            out += found
        return out

    @staticmethod
    def _collective_units(view: StepView) -> list[tuple[np.ndarray, np.ndarray]]:
        """A replicating collective's outputs, judged among the ranks that have each
        column (its group), grouped by which ranks those are."""
        outs = replicated_outputs(view.keys, view.present.shape[1])
        if not outs.shape[0]:
            return []
        patterns, which = np.unique(view.present[:, outs].T, axis=0, return_inverse=True)
        units = []
        for i, pattern in enumerate(patterns):
            rows = np.flatnonzero(pattern)
            c = outs[which.reshape(-1) == i]
            if rows.shape[0] >= 2 and not _equal_rows(view, rows, c):
                units.append((rows, c))
        return units

    def _judge_rows(self, view: StepView, rows: np.ndarray | None, cols: np.ndarray,
                    first_step: int) -> Finding | None:
        """The first deviating record among ``rows`` (None: every row) x ``cols``."""
        sel = slice(None) if rows is None else rows
        pres = view.present[sel][:, cols]
        n = pres.sum(axis=0)
        if not (n >= 2).any():
            return None
        sig = np.where(pres, signatures(view, cols, rows), _ABSENT)
        srt = np.sort(sig, axis=0)
        ref = np.take_along_axis(srt, (n // 2)[None, :], axis=0)[0]
        same = pres & (sig == ref[None, :])
        dev = pres & ~same & (n >= 2)[None, :]
        if not dev.any():
            return None
        idx = np.arange(view.ranks.shape[0]) if rows is None else rows
        flag = np.zeros_like(view.present)
        flag[idx[:, None], cols[None, :]] = dev
        row, col, ties = first_flagged(view, flag)  # type: ignore[misc]
        j = int(np.flatnonzero(cols == col)[0])
        count, total = int(same[:, j].sum()), int(n[j])
        majority = 2 * count > total
        deviants = [int(idx[r]) for r in np.flatnonzero(dev[:, j])]
        compared = [int(idx[r]) for r in np.flatnonzero(pres[:, j])]
        compared_ids = [int(view.ranks[r]) for r in compared]
        decided, rule = True, "replicated record differs from the group majority (CRC-32 + stats, bit for bit)"
        agree: list[list[int]] = []
        if majority:
            ties = sorted(set(ties) | set(deviants) - {row})
        else:
            changed = movers(view)
            moved = [r for r in compared if changed[r]]
            if len(moved) == 1:  # the one whose weights changed outside the optimizer
                row, ties, rule = moved[0], [], f"replicated record differs with no majority; {MOVED_RULE}"
            else:  # nobody can be told apart: the verdict names every rank of the column
                decided, rule = False, "replicated record differs and no majority exists"
                ties = [r for r in compared if r != row]
                p = pres[:, j]
                agree = [[int(view.ranks[idx[p][i]]) for i in g] for g in systematic.classes(sig[p, j])]
        ref_row = next((int(idx[r]) for r in np.flatnonzero(same[:, j]) if int(idx[r]) != row), None)
        if ref_row is None:
            ref_row = next(r for r in compared if r != row)
        crc = view.crc[:, col]
        evidence = {
            "rule": rule, "majority": majority, "agreeing_ranks": count, "compared_ranks": total,
            "crc32": crc_hex(crc[row]), "majority_crc32": crc_hex(crc[ref_row]),
            "stats": stats_dict(view, row, col), "majority_stats": stats_dict(view, ref_row, col),
            "deviating_ranks": sorted(int(view.ranks[r]) for r in deviants)[:MAX_EVIDENCE_RANKS],
            "columns_differing": int(dev.any(axis=0).sum()),
            # Every compared rank's checksum (flagged ranks first), so a reader sees the groups.
            "crc32_by_rank": {str(int(view.ranks[r])): crc_hex(crc[r])
                              for r in list(dict.fromkeys([row, *deviants, *compared]))[:MAX_EVIDENCE_RANKS]},
        }
        if rows is not None:
            evidence["replica_set"] = sorted(int(view.ranks[r]) for r in rows)[:MAX_EVIDENCE_RANKS]
        if view.step == first_step and view.keys.names[col].startswith(PARAM_START):
            evidence["hint"] = START_HINT
        stats_agree = _stats_agree(view, idx, cols, dev, same)
        evidence["stats_agree"] = stats_agree
        v = make_verdict(self.name, view, row, col, ties, evidence)
        v.decided = decided
        if not decided and systematic.all_distinct(agree):
            systematic.mark(v, systematic.RULE_ALL_DIFFER, agree, f"across the replicas {rank_span(compared_ids)}",
                            view.step == first_step)
        dev_kinds = view.kind[cols[dev.any(axis=0)]]
        round_off = stats_agree and bool((dev_kinds == int(Kind.OPT_STATE)).all())
        return Finding(v, round_off, row, col, idx[pres[:, j]], agree)


def _every_set_splits(found: list[Finding], sets: int, view: StepView, first_step: bool) -> None:
    """Mark the findings job-wide when every replica set of the layout (two or more) split
    with no majority on the same tensor at this step: the layout's pattern, not a rank's."""
    open_ = [f for f in found if not f.verdict.decided and not f.verdict.evidence.get("systematic")]
    if sets < 2 or len(open_) != sets or len({f.verdict.tensor for f in open_}) != 1:
        return
    agree = [g for f in open_ for g in f.classes]
    where = "; ".join(rank_span(sorted(int(view.ranks[r]) for r in f.rows)) for f in open_)
    for f in open_:
        systematic.mark(f.verdict, systematic.RULE_EVERY_SET, agree, f"across the replicas of each set ({where})",
                        first_step)


def _first(found: list[Finding]) -> Finding:
    return min(found, key=lambda f: (not f.verdict.decided, f.verdict.exec_index if f.verdict.exec_index is not None
                                     else 1 << 62, f.verdict.rank))


def _stats_agree(view: StepView, idx: np.ndarray, cols: np.ndarray, dev: np.ndarray, same: np.ndarray) -> bool:
    """Whether every deviating cell's statistics, NaN/Inf counts and size equal, bit for bit,
    those of a rank holding the column's reference value: only the checksum tells them apart."""
    di, dj = np.nonzero(dev)
    ref = idx[np.argmax(same, axis=0)][dj]
    r, c = idx[di], cols[dj]
    return bool((view.stats[r, c].view(np.uint64) == view.stats[ref, c].view(np.uint64)).all()
                and (view.numel[r, c] == view.numel[ref, c]).all() and (view.nan[r, c] == view.nan[ref, c]).all()
                and (view.inf[r, c] == view.inf[ref, c]).all())


def _seen(view: StepView, held: Finding) -> bool:
    """Whether this step has the held rank's cell (a cell not there cannot show it healed)."""
    c = held.col
    return c < view.present.shape[1] and int(held.rows.max()) < view.present.shape[0] and \
        bool(view.present[held.row, c])


def _still_split(view: StepView, held: Finding) -> bool:
    """Whether the held rank's cell still differs from the others it was compared with."""
    rows, c = held.rows, held.col
    rows = rows[view.present[rows, c]]
    sig = signatures(view, np.array([c]), rows)[:, 0]
    return bool((sig != sig[rows == held.row][0]).any())
