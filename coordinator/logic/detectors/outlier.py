"""Peer outlier: local loss, local gradient norms and activation norms that stand out.

These legitimately differ per rank (each rank sees its own micro-batch), so they are
compared robustly on a log scale: a value is flagged against its group when
``|log v - median| > z * 1.4826 * MAD`` and the ratio to the median exceeds a floor:
``ratio``, raised to ``tail_factor`` x the spread learned for the column and its kind
(both gates: MAD alone fires on tiny differences when ranks agree closely, a fixed
ratio alone ignores how noisy a column is). Against its own history, each rank's
change from its running (EWMA) log level is compared with the changes of its peers by
the same two gates, so a shift every rank makes at once (LR warm-up, a hard batch for
all) is not a finding; with fewer than ``min_ranks`` peers the change is judged against
the rank's own running absolute deviation instead. Non-finite values are left to the
NaN detector; zeros (e.g. an unused embedding row) have no log and are skipped.
"""
from __future__ import annotations

import math

import numpy as np

from rankscope.config.detectors import OutlierSettings
from rankscope.coordinator.logic.align.aligner import StepView
from rankscope.coordinator.logic.detectors.common import (
    first_flagged,
    group_values,
    kind_mask,
    make_verdict,
    num,
    set_medians,
)
from rankscope.coordinator.logic.detectors.pairs import PairFinding, judge_pairs
from rankscope.coordinator.logic.verdict import Verdict
from rankscope.wire.records import Kind

_KINDS = frozenset({int(Kind.LOSS), int(Kind.GRAD_LOCAL), int(Kind.FORWARD)})
_SIGMA = 1.4826  # MAD -> standard deviation for normal data
_MEAN_ABS_TO_SIGMA = 1.2533  # mean absolute deviation -> standard deviation


def log_values(view: StepView, cols: np.ndarray) -> np.ndarray:
    """(R, C) log of |loss| (Mean of LOSS records) or Norm (grads, activations); NaN if unusable."""
    is_loss = view.kind[cols] == Kind.LOSS
    v = np.where(is_loss[None, :], np.abs(view.stats[:, cols, 2]), view.stats[:, cols, 3])
    ok = view.present[:, cols] & np.isfinite(v) & (v > 0)
    out = np.full(v.shape, np.nan)
    np.log(v, out=out, where=ok)
    return out


class OutlierDetector:
    name = "outlier"

    def __init__(self, settings: OutlierSettings) -> None:
        self.s = settings
        self.log_ratio = math.log(settings.ratio)
        self.log_hist_ratio = math.log(settings.history_ratio)

    def _peer(self, y: np.ndarray, z: float, log_floor: float, kinds: np.ndarray, cols: np.ndarray,
              tails: dict, groups: list[np.ndarray] | None = None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Flags against each row's set (``groups``: the layout's role sets; None: every
        row one set), and the (R, C) set medians and MADs, and the (C,) floor."""
        med, n = set_medians(y, groups)
        dev = y - med
        ad = np.abs(dev)
        mad, _ = set_medians(ad, groups)
        floor, learned = self._tail_floor(tails, kinds, cols, log_floor)
        with np.errstate(invalid="ignore"):
            # Before a column has history only a high-side jump counts: values that
            # collapse on one rank (sparse / MoE layers given few tokens) are routine.
            beyond = np.where(learned[None, :], ad, dev) > floor[None, :]
            flag = (ad > z * _SIGMA * mad) & beyond & (n >= self.s.min_ranks)
        self._tail_update(tails, kinds, cols, np.where(flag | ~np.isfinite(ad), np.nan, ad))
        return flag, med, mad, floor

    # Heavy-tailed but healthy values (local loss of small micro-batches late in a run,
    # the gradient of an MoE expert that got few tokens on one rank) would defeat a fixed
    # floor. So each kind (loss, local grad norms, activation norms) and each column learn
    # their usual spread: an EWMA over steps of 1.2533 x the mean |log deviation| from the
    # median (the exact zero of a column's median element left out, flagged values
    # excluded), pooled over the kind's ranks and columns, and per column. The floor is
    # max(ratio, tail_factor x spread): a column noisier than its kind uses its own
    # spread; a quieter one the geometric mean of its own and the kind's. The pool keeps
    # a column whose first steps happened to agree from false alarms, yet it must not
    # lend a quiet column the spread of noisy ones (biases and a small head whose ranks
    # differ 3x every step would lift a conv weight's floor from x4 to x100). So in a
    # quiet column a x10 rank is found; where ranks routinely differ by 5x it takes far
    # more. Until a column has _TAIL_WARMUP steps the floor is ratio squared and only
    # rises count: nothing is known of its spread yet.
    _TAIL_ALPHA = 0.05
    _TAIL_WARMUP = 5

    @staticmethod
    def _grow(tails: dict, k: int) -> tuple[np.ndarray, np.ndarray]:
        cs, cn = tails.get("col_scale"), tails.get("col_n")
        if cs is None or cs.shape[0] < k:
            size = max(k, 64 if cs is None else 2 * cs.shape[0])
            new_s, new_n = np.zeros(size), np.zeros(size, np.int64)
            if cs is not None:
                new_s[: cs.shape[0]], new_n[: cn.shape[0]] = cs, cn
            cs, cn = tails["col_scale"], tails["col_n"] = new_s, new_n
        return cs, cn

    def _tail_floor(self, tails: dict, kinds: np.ndarray, cols: np.ndarray,
                    log_floor: float) -> tuple[np.ndarray, np.ndarray]:
        ew = tails.setdefault("scale", np.zeros(16))
        cs, cn = self._grow(tails, int(cols.max()) + 1)
        learned = cn[cols] >= self._TAIL_WARMUP
        own, pool = cs[cols], ew[kinds]
        spread = np.maximum(own, np.sqrt(own * pool))
        return np.where(learned, np.maximum(log_floor, self.s.tail_factor * spread), 2 * log_floor), learned

    def _tail_update(self, tails: dict, kinds: np.ndarray, cols: np.ndarray, ad: np.ndarray) -> None:
        ew = tails["scale"]
        cs, cn = tails["col_scale"], tails["col_n"]
        ok = np.isfinite(ad) & (ad > 0)
        cnt = ok.sum(axis=0)
        col_scale = 1.2533 * np.where(ok, ad, 0.0).sum(axis=0) / np.maximum(cnt, 1)
        has = cnt > 0
        c = cols[has]
        cn[c] += 1
        # A plain mean over the first 1/alpha steps, an EWMA after: the first step alone
        # must not stand for the column's spread.
        cs[c] += np.maximum(1.0 / cn[c], self._TAIL_ALPHA) * (col_scale[has] - cs[c])
        kn = tails.setdefault("kind_n", np.zeros(16, np.int64))
        for k in np.unique(kinds[has]):
            sel = has & (kinds == k)
            scale = float((col_scale[sel] * cnt[sel]).sum() / cnt[sel].sum())  # pooled over cells
            kn[k] += 1
            ew[k] += max(1.0 / kn[k], self._TAIL_ALPHA) * (scale - ew[k])

    def judge(self, view: StepView, state: dict) -> list[Verdict]:
        cols = np.flatnonzero(kind_mask(view.kind, _KINDS))
        if cols.shape[0] == 0:
            return []
        y = log_values(view, cols)
        kinds = view.kind[cols].astype(np.int64)
        sets = view.sets
        groups = None if sets is None or sets.whole else sets.role_groups()
        tails = state.setdefault("tail", {})
        learned = self._learned(tails, cols)  # before this step's values are learned from
        flag_peer, med, mad, floor = self._peer(y, self.s.z, self.log_ratio, kinds, cols, tails, groups)
        view.cache["log_norms"] = (cols, y, med)  # reused by the report series
        # Two replicas, no majority: a two-rank set, or a whole job of two (plain DP 2).
        two = groups if groups else [np.arange(2)] if view.ranks.shape[0] == 2 else None
        pairs = self._pairs(view, y, cols, floor, learned, two, state) if two else None
        flag_hist, level = self._history(y, cols, kinds, state, view.ranks.shape[0], groups)
        flag = flag_peer | flag_hist
        if pairs is not None:
            flag = flag | pairs.flag
        if not flag.any():
            return self._undecided(view, cols, y, pairs) if pairs is not None and pairs.undecided else []
        full = np.zeros_like(view.present)
        full[:, cols] = flag
        row, col, ties = first_flagged(view, full)  # type: ignore[misc]
        j = int(np.flatnonzero(cols == col)[0])
        is_loss = view.kind[col] == Kind.LOSS
        value_name = "|loss|" if is_loss else "Norm"
        vals = np.exp(y[:, j])
        m, d = med[row, j], mad[row, j]
        evidence = {
            "rule": ("peer" if flag_peer[row, j] else "") + ("+" if flag_peer[row, j] and flag_hist[row, j] else "")
            + ("history" if flag_hist[row, j] else ""),
            "value": value_name, "rank_value": num(vals[row]),
            "group_median": num(math.exp(m)) if np.isfinite(m) else None,
            "ratio_to_median": num(math.exp(y[row, j] - m)) if np.isfinite(m) else None,
            "robust_z": num(abs(y[row, j] - m) / (_SIGMA * d)) if d > 0 else "inf",
            "rank_history_level": num(math.exp(level[row, j])) if np.isfinite(level[row, j]) else None,
            "thresholds": {"z": self.s.z, "ratio": self.s.ratio, "history_z": self.s.history_z,
                           "history_ratio": self.s.history_ratio,
                           "effective_ratio": num(math.exp(floor[j]))},
            "group_values": group_values(view, col, np.where(view.present[:, col], vals, np.nan), [row]),
        }
        if d > 0:  # each rank's score on the rule's scale, beside the threshold z
            with np.errstate(divide="ignore", invalid="ignore"):
                z_all = np.abs(y[:, j] - med[:, j]) / (_SIGMA * mad[:, j])
            evidence["robust_z_by_rank"] = {r: num(z_all[int(np.flatnonzero(view.ranks == int(r))[0])])
                                            for r in evidence["group_values"]["by_rank"]}
        if pairs is not None and (row, j) in pairs.evidence and not (flag_peer[row, j] or flag_hist[row, j]):
            evidence.update(pairs.evidence[(row, j)])
            evidence["other_replica"] = int(view.ranks[_pair_of(groups or [np.arange(2)], row)])
        if groups is not None:
            evidence["compared_with"] = sorted(int(view.ranks[r]) for r in _set_of(groups, row))[:64]
        return [make_verdict(self.name, view, row, col, ties, evidence)]

    def _learned(self, tails: dict, cols: np.ndarray) -> np.ndarray:
        """Per column: whether it has learned its spread (the floor is then its own)."""
        _, cn = self._grow(tails, int(cols.max()) + 1)
        return cn[cols] >= self._TAIL_WARMUP

    def _pairs(self, view: StepView, y: np.ndarray, cols: np.ndarray, floor: np.ndarray, learned: np.ndarray,
               groups: list[np.ndarray], state: dict) -> PairFinding | None:
        """Two-rank role sets (two replicas), judged by the evidence that needs no majority."""
        two = [g for g in groups if g.shape[0] == 2]
        if not two:
            return None
        rows = view.ranks.shape[0]
        h = self._history_arrays(state, cols, rows)
        count = h["count"][:rows].copy()
        level = np.where(count > 0, h["mean"][:rows], np.nan)
        peers = {int(r): view.sets.peers_in_replica(int(r)) for g in two for r in g}
        return judge_pairs(y, two, peers, level, count, floor, learned, self.log_ratio, self.log_hist_ratio)

    def _undecided(self, view: StepView, cols: np.ndarray, y: np.ndarray, pairs: PairFinding) -> list[Verdict]:
        """The earliest disagreement no evidence could settle: a verdict naming nobody."""
        j, a, b, ev = min(pairs.undecided, key=lambda u: (int(min(view.exec[u[1], cols[u[0]]],
                                                                   view.exec[u[2], cols[u[0]]])), u[1]))
        col = int(cols[j])
        row, other = (a, b) if view.ranks[a] < view.ranks[b] else (b, a)
        ev = {**ev, "value": "|loss|" if view.kind[col] == Kind.LOSS else "Norm",
              "by_rank": {str(int(view.ranks[r])): num(math.exp(y[r, j])) for r in (row, other)}}
        v = make_verdict(self.name, view, row, col, [other], ev)
        v.decided = False
        return [v]

    @staticmethod
    def _history_arrays(state: dict, cols: np.ndarray, rows: int) -> dict:
        """Per (rank, column) EWMA state, kept compact for the current column set.

        The judged columns rarely change, so the arrays are stored for exactly these
        columns and updated in place; when columns or ranks are added they are rebuilt,
        carrying the history of every column that stays.
        """
        h = state.get("hist")
        if h is not None and h["mean"].shape[0] >= rows and np.array_equal(h["cols"], cols):
            return h
        cap = max(rows, 0 if h is None else h["mean"].shape[0])
        new = {"cols": cols.copy(), "mean": np.zeros((cap, cols.shape[0])),
               "absdev": np.zeros((cap, cols.shape[0])), "count": np.zeros((cap, cols.shape[0]), np.int64)}
        if h is not None:
            old_pos = {int(c): i for i, c in enumerate(h["cols"])}
            pairs = [(j, old_pos[int(c)]) for j, c in enumerate(cols) if int(c) in old_pos]
            if pairs:
                dst, src = map(list, zip(*pairs))
                r = h["mean"].shape[0]
                for key in ("mean", "absdev", "count"):
                    new[key][:r, dst] = h[key][:, src]
        state["hist"] = new
        return new

    def _own_limit(self, absdev: np.ndarray) -> np.ndarray:
        """How far a change may go against the rank's own running deviation."""
        return np.maximum(self.s.history_z * _MEAN_ABS_TO_SIGMA * absdev, self.log_hist_ratio)

    def _history(self, y: np.ndarray, cols: np.ndarray, kinds: np.ndarray, state: dict,
                 rows: int, groups: list[np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Flag changes against each rank's own EWMA level, then fold this step in."""
        h = self._history_arrays(state, cols, rows)
        m, a, c = h["mean"][:rows], h["absdev"][:rows], h["count"][:rows]
        fin = np.isfinite(y)
        level = np.where(c > 0, m, np.nan)
        flag = np.zeros(y.shape, bool)
        if self.s.history:
            d = np.where(fin & (c >= self.s.min_history), y - m, np.nan)
            if groups is not None:
                # Each cell against its set's changes where the set has enough ranks, else
                # against the rank's own running deviation.
                peer, _, _, _ = self._peer(d, self.s.history_z, self.log_hist_ratio, kinds, cols,
                                           state.setdefault("hist_tail", {}), groups)
                _, n = set_medians(d, groups)
                with np.errstate(invalid="ignore"):
                    flag = np.where(n >= self.s.min_ranks, peer, np.abs(d) > self._own_limit(a))
            elif (np.isfinite(d).sum(axis=0) >= self.s.min_ranks).any():
                flag, _, _, _ = self._peer(d, self.s.history_z, self.log_hist_ratio, kinds, cols,
                                           state.setdefault("hist_tail", {}))
            else:
                with np.errstate(invalid="ignore"):
                    flag = np.abs(d) > self._own_limit(a)
        # A flagged value must not become the baseline it is judged against next step.
        upd = fin & ~flag
        first = upd & (c == 0)
        later = upd & ~first
        alpha = self.s.history_alpha
        with np.errstate(invalid="ignore"):
            diff = y - m  # NaN where y is unusable; every write below is masked
            np.add(a, alpha * (np.abs(diff) - a), out=a, where=later)
            np.add(m, alpha * diff, out=m, where=later)
        np.copyto(m, y, where=first)
        c += upd
        return flag, level


def _set_of(groups: list[np.ndarray], row: int) -> np.ndarray:
    return next((g for g in groups if row in g), np.array([row]))


def _pair_of(groups: list[np.ndarray], row: int) -> int:
    return int(next(r for r in _set_of(groups, row) if r != row))
