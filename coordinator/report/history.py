"""Per-rank, per-step summaries the report plots: local loss, local grad norm, and
non-finite counts. Kept by the coordinator as steps arrive (a bounded window) and
saved beside incident.json so ``rankscope report DIR`` can re-render offline.

Work per StepBatch is a handful of NumPy reductions over its columns, never a loop
over its tensors.
"""
from __future__ import annotations

import collections
import json
import math
from pathlib import Path
from typing import Iterable

import numpy as np

from agent.records import Kind, StepBatch

HISTORY_FILE = "history.json"
_MEAN, _NORM = 2, 3  # STAT_COLUMNS indices


class StepHistory:
    """The last ``max_steps`` steps of every rank, per job."""

    def __init__(self, max_steps: int = 256) -> None:
        self.max_steps = max_steps
        # job -> step -> rank -> (loss, grad_norm, nonfinite)
        self._jobs: dict[str, dict[int, dict[int, tuple[float, float, int]]]] = \
            collections.defaultdict(dict)

    def add(self, batches: Iterable[StepBatch]) -> None:
        for b in batches:
            steps = self._jobs[b.job]
            row = steps.get(b.step)
            if row is None:
                row = steps[b.step] = {}
                if len(steps) > self.max_steps:
                    del steps[min(steps)]
            row[b.rank] = summarise(b)

    def jobs(self) -> list[str]:
        return list(self._jobs)

    def to_dict(self, job: str) -> dict:
        steps_map = self._jobs.get(job, {})
        steps = sorted(steps_map)
        ranks = sorted({r for row in steps_map.values() for r in row})
        rix = {r: i for i, r in enumerate(ranks)}
        shape = (len(ranks), len(steps))
        loss, gnorm = np.full(shape, np.nan), np.full(shape, np.nan)
        nonfinite = np.zeros(shape, np.int64)
        for j, s in enumerate(steps):
            for r, (lv, gv, nf) in steps_map[s].items():
                i = rix[r]
                loss[i, j], gnorm[i, j], nonfinite[i, j] = lv, gv, nf
        return {"job": job, "ranks": ranks, "steps": steps, "loss": _jsonable(loss),
                "grad_norm": _jsonable(gnorm), "nonfinite": nonfinite.tolist()}

    def save(self, path: Path, job: str) -> Path:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_dict(job)))
        tmp.replace(path)
        return path


def summarise(b: StepBatch) -> tuple[float, float, int]:
    """(local loss, L2 norm over local gradients, records with a NaN/Inf) of one batch."""
    kinds = b.kinds
    loss_rows = np.flatnonzero(kinds == Kind.LOSS)
    loss = float(b.stats[loss_rows[0], _MEAN]) if loss_rows.size else math.nan
    g = b.stats[kinds == Kind.GRAD_LOCAL, _NORM]
    gnorm = float(np.sqrt(np.square(g).sum())) if g.size else math.nan
    nonfinite = int(np.count_nonzero((b.nan_count > 0) | (b.inf_count > 0)))
    return loss, gnorm, nonfinite


def _jsonable(a: np.ndarray) -> list:
    """NaN/Inf are not JSON: missing or non-finite values become null."""
    return [[float(v) if math.isfinite(v) else None for v in row] for row in a.tolist()]


def load_history(incident_dir: Path) -> dict | None:
    path = incident_dir / HISTORY_FILE
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def deviation(history: dict) -> list[list[float | None]]:
    """Rank x step deviation: the larger robust z-score (log scale, median/MAD over the
    ranks of that step) of loss and grad norm; a record with NaN/Inf counts as the
    maximum. Missing cells are null."""
    ranks, steps = history.get("ranks", []), history.get("steps", [])
    if not ranks or not steps:
        return []
    out = np.zeros((len(ranks), len(steps)))
    present = np.zeros_like(out, dtype=bool)
    for key in ("loss", "grad_norm"):
        m = np.array([[np.nan if v is None else v for v in row] for row in history[key]], float)
        present |= np.isfinite(m)
        logs = np.log(np.abs(m) + 1e-30)
        with np.errstate(all="ignore"):
            med = np.nanmedian(logs, axis=0) if np.isfinite(logs).any() else np.zeros(len(steps))
            mad = np.nanmedian(np.abs(logs - med), axis=0)
            z = np.abs(logs - med) / np.maximum(1.4826 * np.nan_to_num(mad), 0.05)
        out = np.fmax(out, np.nan_to_num(z, nan=0.0))
    nonfinite = np.asarray(history.get("nonfinite", np.zeros_like(out)), float) > 0
    out[nonfinite] = max(float(out.max(initial=0.0)), 10.0)
    present |= nonfinite
    return [[round(float(v), 3) if p else None for v, p in zip(row, prow)]
            for row, prow in zip(out, present)]
