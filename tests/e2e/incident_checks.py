"""What the multi-node e2e tests (two nodes, Slurm) check of an incident: the one incident
of the run names the rank, step and detector, with every rank's bundle and the job-wide
rank map."""
from __future__ import annotations

import json
from pathlib import Path


def named_incident(incidents: Path, detector: str, rank: int, step: int, ranks: int,
                   explain: str) -> tuple[dict, list[dict]]:
    """The one incident under ``incidents``: ``detector`` named ``rank`` at ``step``, and
    every rank's bundle with its recorder; returns it and its rank-map rows."""
    found = sorted(incidents.glob("*/incident.json"))
    assert len(found) == 1, explain
    inc = json.loads(found[0].read_text())
    assert (inc["detector"], inc["first_diverging_rank"], inc["step"]) == (detector, rank, step), \
        f"{inc['detector']} named rank {inc['first_diverging_rank']} at step {inc['step']}\n{explain}"
    assert sorted(inc["bundles"]) == [str(r) for r in range(ranks)], explain
    for r in range(ranks):
        assert (found[0].parent / f"rank_{r}" / "rdr").is_dir(), explain
    return inc, json.loads((found[0].parent / "rank_map.json").read_text())["entries"]


def grad_incident(incidents: Path, rank: int, step: int, ranks: int, explain: str) -> tuple[dict, list[dict]]:
    """The one incident: an outlier in ``rank``'s local gradients at ``step``."""
    inc, rows = named_incident(incidents, "outlier", rank, step, ranks, explain)
    assert inc["tensor"].startswith("Sentinel.grad_local"), explain
    return inc, rows
