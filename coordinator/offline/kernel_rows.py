"""One rank's step of a static-graph (L2) kernel dump as rows: msProbe's static-graph
layout, as ``rankscope collect`` gathers a compiled job's kernel tensors
(``rank_{ID}/{timestamp}/step_{N}/<Op>.<scope>.<task>.<stream>.<ts>.<io>.<slot>.<fmt>.<dtype>.npy``).

No dump.json there: each tensor is loaded and measured with the same statistics a rank
computes (exact NaN and Inf counts, CRC-32), one file at a time. Rows are in the kernels'
timestamp order, which is their execution order; a kernel under ``Gradients`` is the
backward. The names are the ones a live GRAPH rank streams (``kernel_files``), so a
kernel AllReduce is a collective to the detectors.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from rankscope.coordinator.offline.dump_rows import DumpReadError, RankStep
from rankscope.files.array_stats import NP_TO_MS, array_stats
from rankscope.files.kernel_files import load_npy, parse_name
from rankscope.wire.records import Kind


def has_kernel_files(folder: str | os.PathLike) -> bool:
    try:
        with os.scandir(folder) as it:
            return any(e.name.endswith(".npy") for e in it)
    except OSError:
        return False


def read_kernel_step(folder: str | os.PathLike) -> RankStep:
    folder = Path(folder)
    try:
        names = os.listdir(folder)
    except OSError as exc:
        raise DumpReadError(f"{folder}: unreadable ({exc.strerror or exc})") from None
    tensors = sorted((kt for kt in (parse_name(n, folder / n) for n in names) if kt is not None),
                     key=lambda kt: (kt.timestamp, kt.record_name))
    if not tensors:
        raise DumpReadError(f"{folder}: no kernel tensor files (msProbe's static-graph L2 names)")
    rows: list[tuple[str, int, tuple, int, int, int, int]] = []
    bad = []
    for kt in tensors:
        try:
            arr = load_npy(str(kt.path))
        except (OSError, ValueError) as exc:
            bad.append(f"{kt.path.name}: {exc}")
            continue
        st = array_stats(arr, NP_TO_MS.get(arr.dtype.name, kt.dtype), crc=True)
        kind = Kind.BACKWARD if kt.backward else Kind.FORWARD
        rows.append((kt.record_name, int(kind), st.row(), st.nan, st.inf, st.numel, st.crc))
    if not rows:
        raise DumpReadError(f"{folder}: no kernel tensor could be read ({bad[0]})")
    n = len(rows)
    return RankStep([r[0] for r in rows], np.asarray([r[1] for r in rows], np.uint8),
                    np.asarray([r[2] for r in rows], np.float64).reshape(n, 4),
                    np.asarray([r[3] for r in rows], np.int64), np.asarray([r[4] for r in rows], np.int64),
                    np.asarray([r[5] for r in rows], np.int64), np.asarray([r[6] for r in rows], np.int64),
                    "mindspore", "tensor", "L2")
