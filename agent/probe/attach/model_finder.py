"""Which Cell a training step trains: what autoattach hooks, and whose buffers a re-run
puts back. Reads objects only; imports MindSpore when asked."""
from __future__ import annotations

from typing import Any


def _unwrap_network(net: Any) -> Any:
    """Model's network may be a WithLossCell / TrainOneStepCell: dump the backbone."""
    seen = 0
    while net is not None and seen < 4:
        inner = getattr(net, "_backbone", None) or getattr(net, "network", None)
        if inner is None or not hasattr(inner, "cells_and_names"):
            return net
        net, seen = inner, seen + 1
    return net


def find_model(fn: Any, weights: Any) -> Any:
    """The Cell a grad function differentiates: ``fn`` itself if it is a Cell (its
    backbone if it wraps a loss), else the smallest Cell reachable from ``fn``'s
    closure, globals or bound self that holds every weight."""
    from mindspore import nn
    if isinstance(fn, nn.Cell):
        return _unwrap_network(fn)
    wanted = {id(w) for w in (weights or ())} if not hasattr(weights, "asnumpy") else {id(weights)}
    candidates: list[Any] = []
    cells = [c.cell_contents for c in (getattr(fn, "__closure__", None) or ()) if _has_contents(c)]
    cells += list(getattr(fn, "__globals__", {}).values())
    if getattr(fn, "__self__", None) is not None:
        cells.append(fn.__self__)
    for obj in cells:
        if isinstance(obj, nn.Cell) and obj not in candidates:
            candidates.append(obj)
    best, best_n = None, None
    for cell in candidates:
        ids = {id(p) for p in cell.get_parameters()}
        if wanted and not wanted <= ids:
            continue
        if not ids:
            continue
        if best_n is None or len(ids) < best_n:
            best, best_n = cell, len(ids)
    return _unwrap_network(best) if best is not None else None


def _has_contents(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018
        return True
    except ValueError:
        return False
