"""A plain-MindSpore reference trace of one worker's decode, independent of rankscope.

Forward hooks on every block and on the LM head record, per forward call (0 = prefill,
k = decode iteration k), a CRC-32 of the output bytes and its max/min/mean. Comparing
two workers' traces says whether they computed bit-identical things and, if not, the
first call and the first layer where they part: the ground truth the rankscope tests
hold the coordinator's verdict against.
"""
from __future__ import annotations

import zlib
from dataclasses import asdict, dataclass

import numpy as np
from mindspore import nn


@dataclass(frozen=True)
class TraceRow:
    call: int
    cell: str
    crc32: int
    max: float
    min: float
    mean: float


class ReplicaTrace:
    """Records block and head outputs per root-model forward call."""

    def __init__(self, model: nn.Cell) -> None:
        self.rows: list[TraceRow] = []
        self._call = -1
        self._handles = [model.register_forward_pre_hook(self._on_root_call)]
        for name, cell in model.cells_and_names():
            if name.count(".") == 1 and name.startswith("layers.") or name == "head":
                self._handles.append(cell.register_forward_hook(self._recorder(name)))

    def _on_root_call(self, _cell, _inputs) -> None:
        self._call += 1

    def _recorder(self, name: str):
        def hook(_cell, _inputs, output) -> None:
            arr = output.asnumpy()
            wide = arr.astype(np.float64)
            self.rows.append(TraceRow(self._call, name, zlib.crc32(arr.tobytes()),
                                      float(wide.max()), float(wide.min()), float(wide.mean())))
        return hook

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def to_json(self) -> list[dict]:
        return [asdict(r) for r in self.rows]


def first_divergence(a: list[dict], b: list[dict]) -> tuple[int, str] | None:
    """(call, cell) of the first row where two traces differ, or None when identical."""
    for ra, rb in zip(a, b):
        if (ra["call"], ra["cell"]) != (rb["call"], rb["cell"]):
            raise ValueError(f"traces are not aligned: {ra['call']}/{ra['cell']} vs {rb['call']}/{rb['cell']}")
        if ra["crc32"] != rb["crc32"]:
            return ra["call"], ra["cell"]
    if len(a) != len(b):
        shorter = min(len(a), len(b))
        row = (a if len(a) > shorter else b)[shorter]
        return row["call"], row["cell"]
    return None
