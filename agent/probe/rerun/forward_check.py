"""Whether a NaN a step's forward made comes again when the step is re-run.

A NaN made inside the forward and swallowed before the loss (ReLU maps NaN to 0 on CPU)
leaves the loss and the gradients finite, so comparing the re-run's outputs with the
first call's cannot tell a device that miscomputed once from code that makes the NaN
every time. The Cell whose record held the NaN is found by the record's name, and for the
re-run only a forward hook on it looks at its inputs and outputs: NaN again is
"reproduced", none is "transient".
"""
from __future__ import annotations

from typing import Any

import numpy as np

from rankscope.probe.tensors.stats import is_tensor, to_numpy

_FORWARD = ".forward."


def cell_path(record: str) -> str | None:
    """The Cell's path in its model from a record name
    (``Cell.left.0.Dense.forward.0.output.0`` -> ``left.0``), or None for a record that
    names no Cell (an API call, a sentinel)."""
    if not record.startswith("Cell.") or _FORWARD not in record:
        return None
    head = record[len("Cell."):record.index(_FORWARD)]
    path, _, cls = head.rpartition(".")
    return path if cls else None


def find_cell(root: Any, path: str) -> Any:
    """The sub-Cell of ``root`` at ``path`` (``root`` itself for ""), or None."""
    if root is None:
        return None
    if path == "":
        return root
    for name, cell in root.cells_and_names():
        if name == path:
            return cell
    return None


def _has_nan(value: Any) -> bool:
    if isinstance(value, (tuple, list)):
        return any(_has_nan(v) for v in value)
    if not is_tensor(value):
        return False
    arr, _ = to_numpy(value)
    return arr.dtype.kind == "f" and bool(np.isnan(arr).any())


class Tap:
    """A forward hook on one Cell for the length of a re-run: did NaN pass it again?"""

    def __init__(self, cell: Any) -> None:
        self.seen = False
        self._handle = None
        if cell is not None:
            self._handle = cell.register_forward_hook(self._hook)

    @property
    def placed(self) -> bool:
        return self._handle is not None

    def _hook(self, cell: Any, inputs: Any, output: Any) -> None:
        if not self.seen:
            self.seen = _has_nan(inputs) or _has_nan(output)

    def close(self) -> bool:
        """Removes the hook; whether the NaN came again."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        return self.seen


def tap(cell_of: Any, models: list, record: str) -> Tap:
    """A tap on the Cell ``record`` names: the one the Cell hooks know by that name
    (``cell_of``), else the sub-Cell of the first of ``models`` at its path; an unplaced
    tap when neither is found (the caller falls back to comparing outputs)."""
    cell = cell_of(record) if cell_of is not None else None
    path = cell_path(record)
    if cell is None and path is not None:
        for root in models:
            cell = find_cell(root, path)
            if cell is not None:
                break
    return Tap(cell)
