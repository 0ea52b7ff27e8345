"""File-level helpers of the dump writer: atomic writes, fast JSON, msProbe's file shapes.

Kept apart from :mod:`rankscope.dump.writer` (which owns the layout and the Sink) so
each stays small; nothing here knows about steps or ranks.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import json.encoder as _json_encoder
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np

from rankscope.files.atomic import atomic_write_bytes as _atomic_write_bytes

MAPPING_HEADER = ("file_name", "original_file_name")


def _json_default(obj: Any) -> Any:
    # Entries are built on the hot path; accept NumPy scalars/arrays rather than make
    # every producer convert.
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (bytes, bytearray)):
        return obj.hex()
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temp file in the same directory and a rename."""
    _atomic_write_bytes(path, data)


def _make_encode() -> Callable[[Any], str]:
    """One reusable C-accelerated compact encoder (json builds a new one per call)."""
    c_make = getattr(_json_encoder, "c_make_encoder", None)
    if c_make is None:  # an interpreter without the _json accelerator
        return json.JSONEncoder(default=_json_default, ensure_ascii=False).encode
    # Same arguments json.JSONEncoder.iterencode passes for ensure_ascii=False, no
    # indent, no circular check (entries are trees built by the probe).
    encoder = c_make(None, _json_default, _json_encoder.encode_basestring, None,
                     ": ", ", ", False, False, True)
    return lambda obj: "".join(encoder(obj, 0))


_encode = _make_encode()


def dumps_json(obj: Any) -> str:
    """JSON text with one line per top-level key and per ``data`` entry.

    msProbe writes ``indent=1``, but Python's json only uses its C encoder without an
    indent, and the pure-Python one made a 30-entry step cost ~20 ms on the training
    thread. Each entry encoded compactly by one reused C encoder keeps the file
    readable (one entry per line, grep-able) at a fraction of the cost. Readers parse
    JSON, not whitespace. NaN/Inf are written as NaN/Infinity, which Python's json
    (and so msProbe) reads back.
    """
    if not isinstance(obj, dict) or not obj:
        return _encode(obj)
    key_text = _json_encoder.encode_basestring  # C; keys are str in everything we write
    lines = []
    for key, value in obj.items():
        if isinstance(value, dict) and value and key == "data":
            inner = ",\n".join(f"  {key_text(str(k))}: {_encode(v)}" for k, v in value.items())
            lines.append(f" {key_text(str(key))}: {{\n{inner}\n }}")
        else:
            lines.append(f" {key_text(str(key))}: {_encode(value)}")
    return "{\n" + ",\n".join(lines) + "\n}"


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_bytes(path, dumps_json(obj).encode("utf-8"))


def mapped_file_name(name: str) -> str:
    """32-digit stand-in for a file name too long for the file system.

    msProbe/MindSpore use a random 32-digit string; a digest of the name is used here
    instead so that two identical runs give bit-identical dumps.
    """
    digits = int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:16], "big") % 10**32
    suffix = ".npy" if name.endswith(".npy") else ""
    return f"{digits:032d}{suffix}"


def group_stacks(stacks: dict) -> dict:
    """Turn ``{entry name: stack}`` into msProbe's stack.json ``{"0": [[names], stack]}``.

    A mapping already in msProbe's shape (digit keys, ``[names, stack]`` values) is
    returned unchanged, so a producer may hand over either form.
    """
    if not stacks:
        return {}
    if all(isinstance(k, str) and k.isdigit() and isinstance(v, (list, tuple)) and len(v) == 2
           and isinstance(v[0], list) for k, v in stacks.items()):
        return dict(stacks)
    grouped: dict[str, tuple[Any, list[str]]] = {}
    for name, stack in stacks.items():
        try:
            key = tuple(stack) if isinstance(stack, list) else stack
            hash(key)
        except TypeError:  # nested lists/dicts: compare by their JSON text
            key = _encode(stack)
        if key not in grouped:
            grouped[key] = (stack, [])
        grouped[key][1].append(name)
    return {str(i): [names, stack] for i, (stack, names) in enumerate(grouped.values())}


def write_mapping(path: Path, file_name: str, original: str) -> None:
    """Add one row to msProbe's mapping.csv (header row, then ``mapped,original``)."""
    rows = read_mapping(path)
    rows[file_name] = original
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(MAPPING_HEADER)
    writer.writerows(sorted(rows.items()))
    atomic_write_bytes(path, text.getvalue().encode("utf-8"))


def merge_dir(src: Path, dst: Path) -> list[str]:
    """Move src's contents into dst without replacing anything; return clashing names."""
    clashes: list[str] = []
    for item in sorted(src.iterdir()):
        target = dst / item.name
        if item.is_dir() and target.is_dir():
            clashes.extend(f"{item.name}/{c}" for c in merge_dir(item, target))
            if not any(item.iterdir()):
                rmdir_quiet(item)
        elif target.exists() or target.is_symlink():
            clashes.append(item.name)
        else:
            try:
                # link+unlink, not rename: link fails if the name appeared meanwhile.
                if item.is_dir():
                    target.mkdir()
                    clashes.extend(f"{item.name}/{c}" for c in merge_dir(item, target))
                    rmdir_quiet(item)
                else:
                    _move_no_replace(item, target)
            except FileExistsError:
                clashes.append(item.name)
    return clashes


def _move_no_replace(item: Path, target: Path) -> None:
    try:
        os.link(item, target)  # fails with FileExistsError if target appeared meanwhile
    except FileExistsError:
        raise
    except OSError:
        # A file system without hard links: rename, re-checking first (small race left).
        if target.exists():
            raise FileExistsError(str(target)) from None
        os.rename(item, target)
        return
    item.unlink()


def rmdir_quiet(path: Path) -> None:
    try:
        path.rmdir()
    except OSError:
        pass


def read_mapping(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    with open(path, newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    return {r[0]: r[1] for r in rows[1:] if len(r) >= 2}


def rename_data_names(obj: Any, mapped: dict[str, str]) -> Any:
    """Copy of an entries tree with every over-long ``data_name`` replaced by its file name."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if k == "data_name" and isinstance(v, str) and v in mapped:
                out[k] = mapped[v]
            else:
                out[k] = rename_data_names(v, mapped)
        return out
    if isinstance(obj, list):
        return [rename_data_names(v, mapped) for v in obj]
    return obj
