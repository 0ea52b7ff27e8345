"""A data-parallel job's msProbe dump tree, written without the job: for the scale benchmark
and the tests of ``rankscope analyze`` that need thousands of ranks.

Laid out and named as msProbe's PyTorch dumps are (``step{N}/rank{R}/dump.json`` with
``stack.json`` and ``construct.json``; ``Functional.linear.{l}.forward``, its backward,
``Module.layers.{l}.Linear.parameters_grad.0``, ``Distributed.all_reduce.{l}.forward``,
the optimizer's ``Tensor.add_.{l}.forward``). Activations and local gradients differ per
rank, weights and reduced gradients are the same on every rank and move every step.

Faults (``kind:rank:step``): ``nan`` (a NaN in that rank's input: its forward and local
gradients go NaN, the all_reduce hands it to every rank), ``scale`` (its local gradients
x50), ``drift`` (its copy of layer 0's weight moves off the others from that step on).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

NAN = float("nan")


def _leaf(stats: tuple[float, float, float, float], shape: list[int]) -> dict:
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": shape, "Max": stats[0], "Min": stats[1],
            "Mean": stats[2], "Norm": stats[3], "requires_grad": True}


def _stats(rs: np.random.RandomState, scale: float) -> tuple[float, float, float, float]:
    m = float(rs.uniform(0.5, 1.5)) * scale
    return (m, -m * float(rs.uniform(0.8, 1.2)), m * float(rs.uniform(-0.05, 0.05)), m * float(rs.uniform(3, 5)))


def _nan(stats: tuple[float, float, float, float], bad: bool) -> tuple[float, float, float, float]:
    return (NAN,) * 4 if bad else stats


def rank_step(rank: int, step: int, layers: int, fault: tuple[str, int, int] | None) -> dict:
    kind, frank, fstep = fault or ("", -1, -1)
    nan = kind == "nan" and step == fstep
    own_nan = nan and rank == frank
    data: dict[str, dict] = {}
    act = np.random.RandomState((rank * 1_000_003 + step * 7919) % 2**31)
    shared = np.random.RandomState(step * 7919 + 1)  # the same on every rank: weights, reduced grads
    weights = [_stats(shared, 0.3) for _ in range(layers)]
    if nan and step > fstep:
        weights = [(NAN,) * 4 for _ in weights]
    if kind == "drift" and rank == frank and step >= fstep:
        w = weights[0]
        weights[0] = (w[0] + 1e-3, w[1] + 1e-3, w[2] + 1e-3, w[3] * (1 + 1e-4))
    for layer in range(layers):
        data[f"Functional.linear.{layer}.forward"] = {
            "input_args": [_leaf(_nan(_stats(act, 1.0), own_nan), [32, 64]), _leaf(weights[layer], [64, 64])],
            "input_kwargs": {}, "output": [_leaf(_nan(_stats(act, 2.0), own_nan), [32, 64])]}
        data[f"Functional.relu.{layer}.forward"] = {
            "input_args": [_leaf(_nan(_stats(act, 2.0), own_nan), [32, 64])], "input_kwargs": {},
            "output": [_leaf(_nan(_stats(act, 1.0), own_nan), [32, 64])]}
    for layer in reversed(range(layers)):
        data[f"Functional.linear.{layer}.backward"] = {
            "input": [_leaf(_nan(_stats(act, 0.1), own_nan), [32, 64])],
            "output": [_leaf(_nan(_stats(act, 0.1), own_nan), [32, 64])]}
        grad = _stats(act, 0.05)
        if kind == "scale" and rank == frank and step == fstep:
            grad = tuple(v * 50 for v in grad)
        data[f"Module.layers.{layer}.Linear.parameters_grad.0"] = {
            "weight": [_leaf(_nan(grad, own_nan), [64, 64])]}
    for layer in range(layers):
        local = _nan(_stats(act, 0.05), own_nan)
        if kind == "scale" and rank == frank and step == fstep:
            local = tuple(v * 50 for v in local)
        reduced = _nan(_stats(shared, 0.05), nan)
        data[f"Distributed.all_reduce.{layer}.forward"] = {
            "input_args": [_leaf(local, [64, 64])], "input_kwargs": {}, "output": [_leaf(reduced, [64, 64])]}
        data[f"Tensor.add_.{layer}.forward"] = {
            "input_args": [_leaf(weights[layer], [64, 64]), _leaf(reduced, [64, 64])], "input_kwargs": {},
            "output": [_leaf(_nan(weights[layer], nan), [64, 64])]}
    return data


def write_tree(root: str | Path, ranks: int, steps: int, layers: int = 8,
               fault: tuple[str, int, int] | None = None) -> Path:
    """Write the tree; returns ``root``. About 2.4 KB of dump.json per layer per rank-step."""
    root = Path(root)
    for step in range(steps):
        for rank in range(ranks):
            folder = root / f"step{step}" / f"rank{rank}"
            folder.mkdir(parents=True, exist_ok=True)
            data = rank_step(rank, step, layers, fault)
            doc = {"task": "statistics", "level": "mix", "framework": "pytorch", "dump_data_dir": None, "data": data}
            (folder / "dump.json").write_text(json.dumps(doc, allow_nan=True))
            (folder / "stack.json").write_text("{}")
            (folder / "construct.json").write_text(json.dumps({k: None for k in data}))
    return root


def parse_fault(text: str | None) -> tuple[str, int, int] | None:
    if not text:
        return None
    kind, rank, step = text.split(":")
    if kind not in ("nan", "scale", "drift"):
        raise ValueError(f"fault kind: nan, scale or drift, got {kind!r}")
    return kind, int(rank), int(step)

