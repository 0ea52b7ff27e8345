"""The per-rank curves the report plots, in the report's (rank x step) orientation.

The numbers come from the logic core's SeriesRecorder (local loss, local gradient
norm and deviation per judged step, bounded window); this module only reshapes
them and keeps them beside incident.json as history.json, so ``rankscope report
DIR`` re-renders offline.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rankscope.files.atomic import atomic_write_bytes

HISTORY_FILE = "history.json"
#: How a non-finite value is spelled in history.json and incident.json.
NONFINITE = ("nan", "inf", "-inf")


def history_from_series(series: dict[str, Any] | None, around: dict[str, Any] | None = None) -> dict | None:
    """SeriesRecorder.to_dict(group)[group] (step-major) -> rank-major history.

    ``around`` (RecentSteps' ``tensor_window`` and ``nonfinite_chain``, taken when the
    incident was written) is kept as is under those keys."""
    if not series or not series.get("ranks"):
        return dict(around) if around else None
    ranks, steps = list(series["ranks"]), list(series["steps"])
    order = sorted(range(len(ranks)), key=ranks.__getitem__)  # group order is arrival order

    def rank_major(key: str) -> list[list]:
        rows = series.get(key) or [[None] * len(ranks) for _ in steps]
        return [[_num(rows[j][i]) if i < len(rows[j]) else None for j in range(len(steps))] for i in order]

    return {"ranks": [ranks[i] for i in order], "steps": steps, "loss": rank_major("loss"),
            "grad_norm": rank_major("grad_norm"), "deviation": rank_major("deviation"), **(around or {})}


def _num(v: Any) -> float | str | None:
    """A finite number, a non-finite one as "nan"/"inf"/"-inf" (strict JSON), or None."""
    if isinstance(v, str) and v in NONFINITE:
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else str(float(v))


def save_history(incident_dir: Path, history: dict) -> Path:
    path = incident_dir / HISTORY_FILE
    atomic_write_bytes(path, json.dumps(history).encode("utf-8"))
    return path


def load_history(incident_dir: Path) -> dict | None:
    path = incident_dir / HISTORY_FILE
    if not path.is_file():
        return None
    return json.loads(path.read_text())
