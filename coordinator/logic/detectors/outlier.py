"""Peer outlier: local loss, local gradient norms and activation norms that stand out.

These legitimately differ per rank (each rank sees its own micro-batch), so they are
compared robustly on a log scale: a value is flagged against its group when
``|log v - median| > z * 1.4826 * MAD`` and the ratio to the median exceeds
``ratio`` (both gates: MAD alone fires on tiny differences when ranks agree closely,
the ratio alone ignores how noisy the group is). Against its own history, each rank's
change from its running (EWMA) log level is compared with the changes of its peers by
the same two gates, so a shift every rank makes at once (LR warm-up, a hard batch for
all) is not a finding; with fewer than ``min_ranks`` peers the change is judged against
the rank's own running absolute deviation instead. Non-finite values are left to the
NaN detector; zeros (e.g. an unused embedding row) have no log and are skipped.
"""
from __future__ import annotations

import math

import numpy as np

from agent.records import Kind
from coordinator.logic.aligner import StepView
from coordinator.logic.detectors.common import first_flagged, group_values, kind_mask, make_verdict, nanmedian0, num
from coordinator.logic.settings import OutlierSettings
from coordinator.logic.verdict import Verdict

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

    def _peer(self, y: np.ndarray, z: float, log_floor: float, kinds: np.ndarray,
              tails: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        n = np.isfinite(y).sum(axis=0)
        med = nanmedian0(y)
        ad = np.abs(y - med[None, :])
        mad = nanmedian0(ad)
        floor = self._tail_floor(tails, kinds, log_floor)
        with np.errstate(invalid="ignore"):
            flag = (ad > z * _SIGMA * mad[None, :]) & (ad > floor[None, :]) & (n >= self.s.min_ranks)[None, :]
        self._tail_update(tails, kinds, np.where(flag | ~np.isfinite(ad), -np.inf, ad))
        return flag, med, mad, floor

    # Heavy-tailed but healthy values (local loss of small micro-batches late in a run)
    # would defeat a fixed floor. So each kind (loss, local grad norms, activation norms)
    # learns its usual spread: an EWMA over steps of the pooled scale of log deviations
    # over all ranks and columns of that kind (1.2533 x mean |deviation|, the exact zero of
    # each column's median element left out, flagged values excluded). The floor is then
    # max(ratio, tail_factor x that scale): in a quiet kind a x10 rank is found; in a kind
    # where ranks routinely differ by 5x it takes far more. Until a kind has _TAIL_WARMUP
    # steps the floor is ratio squared, since nothing is known about its spread yet.
    _TAIL_ALPHA = 0.05
    _TAIL_WARMUP = 5

    def _tail_floor(self, tails: dict, kinds: np.ndarray, log_floor: float) -> np.ndarray:
        ew = tails.setdefault("scale", np.zeros(16))
        cnt = tails.setdefault("n", np.zeros(16, np.int64))
        learned = cnt[kinds] >= self._TAIL_WARMUP
        return np.where(learned, np.maximum(log_floor, self.s.tail_factor * ew[kinds]), 2 * log_floor)

    def _tail_update(self, tails: dict, kinds: np.ndarray, ad: np.ndarray) -> None:
        ew, cnt = tails["scale"], tails["n"]
        for k in np.unique(kinds):
            vals = ad[:, kinds == k]
            vals = vals[np.isfinite(vals) & (vals > 0)]
            if vals.shape[0] == 0:
                continue
            scale = 1.2533 * float(vals.mean())
            ew[k] = scale if cnt[k] == 0 else ew[k] + self._TAIL_ALPHA * (scale - ew[k])
            cnt[k] += 1

    def judge(self, view: StepView, state: dict) -> list[Verdict]:
        cols = np.flatnonzero(kind_mask(view.kind, _KINDS))
        if cols.shape[0] == 0:
            return []
        y = log_values(view, cols)
        kinds = view.kind[cols].astype(np.int64)
        flag_peer, med, mad, floor = self._peer(y, self.s.z, self.log_ratio, kinds, state.setdefault("tail", {}))
        view.cache["log_norms"] = (cols, y, med)  # reused by the report series
        flag_hist, level = self._history(y, cols, kinds, state, view.ranks.shape[0])
        flag = flag_peer | flag_hist
        if not flag.any():
            return []
        full = np.zeros_like(view.present)
        full[:, cols] = flag
        row, col, ties = first_flagged(view, full)  # type: ignore[misc]
        j = int(np.flatnonzero(cols == col)[0])
        is_loss = view.kind[col] == Kind.LOSS
        value_name = "|loss|" if is_loss else "Norm"
        vals = np.exp(y[:, j])
        evidence = {
            "rule": ("peer" if flag_peer[row, j] else "") + ("+" if flag_peer[row, j] and flag_hist[row, j] else "")
            + ("history" if flag_hist[row, j] else ""),
            "value": value_name, "rank_value": num(vals[row]), "group_median": num(math.exp(med[j])) if np.isfinite(med[j]) else None,
            "ratio_to_median": num(math.exp(y[row, j] - med[j])) if np.isfinite(med[j]) else None,
            "robust_z": num(abs(y[row, j] - med[j]) / (_SIGMA * mad[j])) if mad[j] > 0 else "inf",
            "rank_history_level": num(math.exp(level[row, j])) if np.isfinite(level[row, j]) else None,
            "thresholds": {"z": self.s.z, "ratio": self.s.ratio, "history_z": self.s.history_z,
                           "history_ratio": self.s.history_ratio,
                           "effective_ratio": num(math.exp(floor[j]))},
            "group_values": group_values(view, col, np.where(view.present[:, col], vals, np.nan), [row]),
        }
        return [make_verdict(self.name, view, row, col, ties, evidence)]

    def _history(self, y: np.ndarray, cols: np.ndarray, kinds: np.ndarray, state: dict, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """Flag changes against each rank's own EWMA level, then fold this step in."""
        k = int(cols.max()) + 1
        mean, absdev, count = state.get("mean"), state.get("absdev"), state.get("count")
        if mean is None or mean.shape[0] < rows or mean.shape[1] < k:
            r2, k2 = max(rows, 0 if mean is None else mean.shape[0]), max(k, 0 if mean is None else mean.shape[1])
            new_mean, new_abs, new_cnt = np.zeros((r2, k2)), np.zeros((r2, k2)), np.zeros((r2, k2), np.int64)
            if mean is not None:
                new_mean[: mean.shape[0], : mean.shape[1]] = mean
                new_abs[: mean.shape[0], : mean.shape[1]] = absdev
                new_cnt[: mean.shape[0], : mean.shape[1]] = count
            mean, absdev, count = state["mean"], state["absdev"], state["count"] = new_mean, new_abs, new_cnt
        m, a, c = mean[:rows, cols], absdev[:rows, cols], count[:rows, cols]
        fin = np.isfinite(y)
        level = np.where(c > 0, m, np.nan)
        flag = np.zeros(y.shape, bool)
        if self.s.history:
            d = np.where(fin & (c >= self.s.min_history), y - m, np.nan)
            if (np.isfinite(d).sum(axis=0) >= self.s.min_ranks).any():
                flag, _, _, _ = self._peer(d, self.s.history_z, self.log_hist_ratio, kinds,
                                           state.setdefault("hist_tail", {}))
            else:
                lim = np.maximum(self.s.history_z * _MEAN_ABS_TO_SIGMA * a, self.log_hist_ratio)
                with np.errstate(invalid="ignore"):
                    flag = np.abs(d) > lim
        # A flagged value must not become the baseline it is judged against next step.
        upd = fin & ~flag
        first = upd & (c == 0)
        alpha = self.s.history_alpha
        dev = np.abs(np.where(upd, y, 0.0) - m)
        m_new = np.where(first, y, np.where(upd, m + alpha * (np.where(upd, y, m) - m), m))
        a_new = np.where(upd & ~first, a + alpha * (dev - a), a)
        mean[:rows, cols], absdev[:rows, cols], count[:rows, cols] = m_new, a_new, c + upd
        return flag, level
