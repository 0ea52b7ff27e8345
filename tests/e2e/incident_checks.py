"""What the multi-node e2e tests (two nodes, Slurm) check of a gradient-fault incident."""
from __future__ import annotations

import json
from pathlib import Path


def grad_incident(incidents: Path, rank: int, step: int, ranks: int, explain: str) -> tuple[dict, list[dict]]:
    """The one incident under ``incidents``: an outlier in local gradients at ``rank``/``step``,
    every rank's bundle with its recorder; returns it and its rank-map rows."""
    found = sorted(incidents.glob("*/incident.json"))
    assert len(found) == 1, explain
    inc = json.loads(found[0].read_text())
    assert (inc["first_diverging_rank"], inc["step"]) == (rank, step), explain
    assert inc["tensor"].startswith("Sentinel.grad_local"), explain
    assert sorted(inc["bundles"]) == [str(r) for r in range(ranks)], explain
    for r in range(ranks):
        assert (found[0].parent / f"rank_{r}" / "rdr").is_dir(), explain
    return inc, json.loads((found[0].parent / "rank_map.json").read_text())["entries"]
