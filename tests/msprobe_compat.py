"""Harness around the published msProbe's compare tool (PyPI ``mindstudio-probe``).

rankscope promises msProbe's on-disk layout so that msProbe's own offline compare
reads our dumps (DESIGN "On disk"). This module runs that tool exactly as a user
would -- the ``msprobe compare -tp TARGET -gp GOLDEN -o OUT`` command line, in a
separate process -- and reads its result table back, so tests can check the rows
against the entries we wrote.

How msProbe 26.x compares MindSpore dumps (read from its source):
- ``-tp/-gp`` two ``dump.json`` (or ``debug.json``) files: one comparison, result
  ``compare_result_<timestamp>.csv`` (``debug_compare_result_...`` for debug.json); ``.npy`` files are read from the sibling
  ``dump_tensor_data/`` by each leaf's ``data_name``; ``stack.json`` and
  ``construct.json`` must both exist beside dump.json (or both be absent).
- ``-tp/-gp`` two step directories (``step{N}``): one comparison per paired
  ``rank{ID}`` folder (falls back to a single ``proc{pid}`` folder), results
  ``compare_result_rank{ID}_<timestamp>.csv``.
- The framework comes from dump.json's ``"framework": "mindspore"``; the mode from
  ``"task"`` (tensor -> real data, statistics -> summary, or md5 when leaves carry
  ``"md5"``).
- Row names: ``{entry}.input.{i}`` (input_args), ``{entry}.input.{kwarg}``,
  ``{entry}.output.{i}``, ``{entry}.parameters.{name}``, ``{entry}.{param}`` for a
  ``parameters_grad`` entry, nested sequences add ``.{j}``, a ``save`` entry
  ``{name}.{n}.debug`` walks its whole body (``.data``, ``.data.{key}``); in tensor mode a row is
  named by its ``data_name`` minus the extension.
- The tool exits 0 even when a comparison is skipped, so success here means "a new
  result file appeared"; it also logs an unrelated "[ERROR] ... CANN environment"
  line on machines without Ascend, which is not a failure.

The debugger tests reuse :func:`run_msprobe_compare` on real PrecisionDebugger dumps.
"""
from __future__ import annotations

import csv
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable

JSON_NAMES = ("dump.json", "debug.json")
RESULT_GLOB = "*compare_result*"  # debug.json gives debug_compare_result_*.csv


class MsprobeCompareError(RuntimeError):
    """msProbe's compare ran but produced no result; carries the tail of its log."""


def msprobe_available() -> bool:
    return importlib.util.find_spec("msprobe") is not None


def msprobe_command() -> list[str]:
    """The ``msprobe`` console script of this interpreter's environment."""
    script = Path(sys.executable).with_name("msprobe")
    if script.exists():
        return [str(script)]
    found = shutil.which("msprobe")
    if found:
        return [found]
    # Same entry point the console script calls (mindstudio-probe's entry_points.txt).
    return [sys.executable, "-c", "import sys; from msprobe.msprobe import main; sys.exit(main())"]


def _dump_json_of(path: Path) -> Path:
    """A dump.json/debug.json itself, a rank folder holding one, or a chain of single folders."""
    path = Path(path)
    while path.is_dir():
        for name in JSON_NAMES:
            if (path / name).is_file():
                return path / name
        subdirs = [p for p in path.iterdir() if p.is_dir()]
        if len(subdirs) != 1:
            raise ValueError(f"{path}: expected dump.json or exactly one step/rank folder, found "
                             f"{sorted(p.name for p in subdirs)} (use run_msprobe_compare_ranks for a step)")
        path = subdirs[0]
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such dump")
    return path


def _run(target: Path, golden: Path, out_dir: Path, timeout: float, extra_args: Iterable[str]) -> list[Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    before = set(out_dir.glob(RESULT_GLOB))
    cmd = msprobe_command() + ["compare", "-tp", str(target), "-gp", str(golden), "-o", str(out_dir),
                               *extra_args]
    env = {**os.environ, "GLOG_v": "3"}  # keep MindSpore's import chatter out of the log
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    made = sorted(set(out_dir.glob(RESULT_GLOB)) - before)
    if proc.returncode != 0 or not made:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
        raise MsprobeCompareError(f"msprobe compare exited {proc.returncode} with "
                                  f"{len(made)} result file(s): {' '.join(cmd)}\n{tail}")
    return made


def run_msprobe_compare(npu_dump_dir: str | os.PathLike, bench_dump_dir: str | os.PathLike,
                        out_dir: str | os.PathLike, *, timeout: float = 300.0,
                        extra_args: Iterable[str] = ()) -> Path:
    """Compare one rank's dump against another's with msProbe; return the result csv/xlsx.

    Each side may be a dump.json, a ``rank{ID}``/``proc{pid}`` folder, or a folder
    leading to exactly one of those (a dump root with one step and one rank).
    ``extra_args`` go to ``msprobe compare`` as given (e.g. ``["--xlsx"]``).
    """
    made = _run(_dump_json_of(Path(npu_dump_dir)), _dump_json_of(Path(bench_dump_dir)),
                Path(out_dir), timeout, extra_args)
    if len(made) != 1:
        raise MsprobeCompareError(f"expected one result file, got {[p.name for p in made]}")
    return made[0]


def run_msprobe_compare_ranks(npu_step_dir: str | os.PathLike, bench_step_dir: str | os.PathLike,
                              out_dir: str | os.PathLike, *, timeout: float = 300.0) -> dict[str, Path]:
    """msProbe's multi-rank compare of two ``step{N}`` folders; ``{"rank0": result, ...}``."""
    made = _run(Path(npu_step_dir), Path(bench_step_dir), Path(out_dir), timeout, ())
    results: dict[str, Path] = {}
    for path in made:
        # compare_result_rank3_<timestamp>.csv (or _proc<pid>_)
        parts = path.stem.split("_")
        label = next((p for p in parts if p.startswith(("rank", "proc"))), path.stem)
        results[label] = path
    return results


def read_compare_result(path: str | os.PathLike) -> list[dict[str, str]]:
    """Rows of a result table as dicts keyed by msProbe's column headers."""
    path = Path(path)
    if path.suffix == ".xlsx":
        import pandas as pd  # msProbe depends on pandas; only needed for --xlsx output

        frame = pd.read_excel(path, dtype=str, keep_default_na=False)
        return frame.to_dict("records")
    with open(path, newline="", encoding="utf-8-sig") as fh:
        return list(csv.DictReader(fh))


def _is_leaf(node: Any) -> bool:
    return isinstance(node, dict) and isinstance(node.get("type"), str)


def _walk(node: Any, name: str, out: dict[str, dict | None], tensor_names: bool, in_grad: bool) -> None:
    if node is None:
        out[name] = None  # msProbe still lists it: a row of N/A ("unsupported")
        return
    if _is_leaf(node):
        data_name = node.get("data_name")
        key = data_name.rsplit(".", 1)[0] if tensor_names and data_name else name
        out[key] = node
    elif isinstance(node, list):
        for i, item in enumerate(node):
            # A parameters_grad entry lists one gradient per parameter without an index.
            _walk(item, name if in_grad else f"{name}.{i}", out, tensor_names, in_grad)
    elif isinstance(node, dict):
        for key, item in node.items():
            _walk(item, f"{name}.{key}", out, tensor_names, in_grad)


_IO_SUFFIX = {"input_args": ".input", "input_kwargs": ".input", "input": ".input",
              "output": ".output", "parameters": ".parameters"}


def expected_rows(entries: dict[str, dict], tensor_names: bool = False) -> dict[str, dict | None]:
    """msProbe's row name -> our leaf dict, for every leaf in dump.json entries.

    ``tensor_names`` names rows after ``data_name`` as msProbe does in tensor mode.
    A ``None`` leaf (e.g. a backward output MindSpore did not compute) maps to None:
    msProbe lists it as a row without values.
    """
    out: dict[str, dict | None] = {}
    for entry, body in entries.items():
        parts = entry.split(".")
        if parts[-1] == "debug":  # PrecisionDebugger.save entries (debug.json): whole body
            _walk(body, entry, out, tensor_names, in_grad=False)
            continue
        if parts[-1] == "parameters_grad" or (len(parts) >= 2 and parts[-2] == "parameters_grad"):
            _walk(body, entry, out, tensor_names, in_grad=True)
            continue
        for section, suffix in _IO_SUFFIX.items():
            if section in body:
                _walk(body[section], entry + suffix, out, tensor_names, in_grad=False)
    return out
