"""What a rank keeps of an anomalous step so the step can be replayed elsewhere.

``<dump_path>/replay/rank<R>/step<S>/`` (:func:`replay_dir`) holds:

- ``inputs.npz``: the tensors the step's ``value_and_grad`` function was called with
  (``arg<i>`` positional, ``kw_<name>`` keyword);
- ``params.npz``: the parameters it differentiates, as the step started (the optimizer
  had not run yet), under their names;
- ``meta.json``: the rank, step and trigger; the call's shape (which arguments are
  tensors, the plain values of the others); the parameter names in order; MindSpore's
  RNG state before the call; what the first execution returned (the loss, and a CRC-32
  of each gradient's bytes); the command line of the process.

Written only on anomaly, and only within :data:`MAX_BYTES` (inputs and parameters
together): a step too large to keep says so in ``meta.json`` and keeps no arrays.
NumPy and JSON only: ``rankscope rerun`` reads it without the job's code.
"""
from __future__ import annotations

import json
import os
import zlib
from pathlib import Path
from typing import Any

import numpy as np

MAX_BYTES = 256 << 20
#: The folder of replay records, under a dump path and inside an exported bundle.
REPLAY = "replay"
FORMAT = 1
#: Set by ``rankscope rerun`` in the process it starts: the record to replay, and where
#: the replay writes what came out.
ENV = "RANKSCOPE_REPLAY"
OUT_ENV = "RANKSCOPE_REPLAY_OUT"


def replay_dir(dump_path: str | os.PathLike, rank: int, step: int) -> Path:
    return Path(dump_path) / REPLAY / f"rank{int(rank)}" / f"step{int(step)}"


def newest(dump_path: str | os.PathLike, rank: int) -> Path | None:
    """The rank's record of its latest re-run step, if it kept one."""
    steps = []
    for d in replay_dir(dump_path, rank, 0).parent.glob("step*"):
        if d.name[4:].isdigit() and (d / "meta.json").is_file():
            steps.append((int(d.name[4:]), d))
    return max(steps)[1] if steps else None


def bundle_copy(bundle: Path, step: int) -> Path:
    """Where an exported bundle carries the record of ``step``."""
    return Path(bundle) / REPLAY / f"step{int(step)}"


def carry(record: str | os.PathLike, bundle: str | os.PathLike) -> Path | None:
    """Copy a kept record (``.../step<S>``) into a bundle folder; None when there is none
    to copy. OSError when the copy fails."""
    import shutil
    src = Path(record)
    if not src.name[4:].isdigit() or not (src / "meta.json").is_file():
        return None
    return Path(shutil.copytree(src, bundle_copy(Path(bundle), int(src.name[4:])), dirs_exist_ok=True))


def find_in_bundle(rank_dir: str | os.PathLike, step: int) -> Path | None:
    """The record of ``step`` inside a rank's exported bundle (``rank_<R>/rdr*/replay/``)."""
    for meta in sorted(Path(rank_dir).glob(f"rdr*/{REPLAY}/step{int(step)}/meta.json")):
        return meta.parent
    return None


def crc(arr: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(arr).tobytes())


def save(where: Path, meta: dict[str, Any], inputs: dict[str, np.ndarray], params: dict[str, np.ndarray]) -> Path:
    """Write the replay folder; the arrays only when they fit :data:`MAX_BYTES`."""
    where.mkdir(parents=True, exist_ok=True)
    size = sum(a.nbytes for a in inputs.values()) + sum(a.nbytes for a in params.values())
    meta = {**meta, "format": FORMAT, "bytes": int(size)}
    if size > MAX_BYTES:
        meta["too_large"] = (f"inputs and parameters take {size / 2**20:.0f} MB, over the {MAX_BYTES >> 20} MB "
                             "a rank keeps of a step")
    else:
        np.savez(where / "inputs.npz", **inputs)
        np.savez(where / "params.npz", **params)
    tmp = where / "meta.json.tmp"
    tmp.write_text(json.dumps(meta, indent=1))
    os.replace(tmp, where / "meta.json")
    return where


def load(where: str | os.PathLike) -> tuple[dict[str, Any], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(meta, inputs, params); every problem raises ValueError naming the file."""
    where = Path(where)
    try:
        meta = json.loads((where / "meta.json").read_text())
    except OSError as exc:
        raise ValueError(f"{where / 'meta.json'}: cannot be read ({exc.strerror or exc})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where / 'meta.json'}: not valid JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{where / 'meta.json'}: not a rankscope replay record (format {FORMAT})")
    if meta.get("too_large"):
        raise ValueError(f"{where}: the rank kept no arrays of this step: {meta['too_large']}")
    arrays = []
    for name in ("inputs.npz", "params.npz"):
        try:
            with np.load(where / name, allow_pickle=False) as z:
                arrays.append({k: z[k] for k in z.files})
        except (OSError, ValueError) as exc:
            raise ValueError(f"{where / name}: cannot be read ({exc})") from None
    return meta, arrays[0], arrays[1]
