"""Finding the dumps in msProbe trees: which (step, rank) has a dump.json, and where.

msProbe writes ``dump_path/step{N}/rank{R}/dump.json`` (``proc{pid}`` while a rank id is
unknown, ``rank`` with no id in a single-process run). A user may point at the
``dump_path`` (one per node, several on the command line), at one ``step{N}`` folder,
or at one rank folder. Only folder names are read here: opening the files is
:mod:`.dump_rows`' job, step by step, so a tree of thousands of ranks costs a directory
walk before the first step is judged.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from rankscope.coordinator.offline.dump_rows import DUMP_FILE

_STEP = re.compile(r"^step(\d+)$")
#: msProbe's static-graph (L2) layout: rank_{ID}/{timestamp}/step_{N}/ holding kernel .npy files.
_KRANK = re.compile(r"^rank_(\d+)$")
_KSTEP = re.compile(r"^step_(\d+)$")
_RANK = re.compile(r"^rank(\d*)$")
_PROC = re.compile(r"^proc(\d+)$")


class TreeError(ValueError):
    """A path given on the command line holds no msProbe dump at all."""


@dataclass
class DumpTree:
    """``where[step][rank]`` is the folder holding that rank's dump.json for that step."""

    roots: list[Path]
    where: dict[int, dict[int, Path]] = field(default_factory=dict)
    #: What was odd about the layout, once each (said beside the verdict).
    notes: list[str] = field(default_factory=list)

    @property
    def steps(self) -> list[int]:
        return sorted(self.where)

    @property
    def ranks(self) -> list[int]:
        return sorted({r for by_rank in self.where.values() for r in by_rank})


def find_dumps(paths: list[str | os.PathLike]) -> DumpTree:
    """Every (step, rank) dump under ``paths``; TreeError when one of them holds none."""
    tree = DumpTree([Path(p) for p in paths])
    procs: dict[int, list[tuple[int, Path]]] = {}  # pid -> [(step, folder)]
    for root in tree.roots:
        if not root.exists():
            raise TreeError(f"{root}: no such file or directory")
        if not root.is_dir():
            raise TreeError(f"{root}: not a directory (give msProbe's dump_path, a step{{N}} folder or a rank folder)")
        found = _walk(root, tree, procs)
        if not found:
            raise TreeError(f"{root}: no msProbe dump here (expected step{{N}}/rank{{R}}/{DUMP_FILE} below it, "
                        "or rank_{ID}/{timestamp}/step_{N}/*.npy of a static-graph dump)")
    _place_procs(tree, procs)
    return tree


def _walk(root: Path, tree: DumpTree, procs: dict[int, list[tuple[int, Path]]]) -> int:
    m = _STEP.match(root.name)
    if (root / DUMP_FILE).is_file():  # a rank folder itself: its step is its parent's
        step = _STEP.match(root.parent.name)
        return _add(tree, procs, int(step.group(1)) if step else 0, root)
    if m:
        return _step(tree, procs, int(m.group(1)), root)
    km = _KRANK.match(root.name)
    if km:
        return _kernel_rank(tree, int(km.group(1)), root)
    found = 0
    for entry in _dirs(root):
        sm, km = _STEP.match(entry.name), _KRANK.match(entry.name)
        if sm:
            found += _step(tree, procs, int(sm.group(1)), Path(entry.path))
        elif km:
            found += _kernel_rank(tree, int(km.group(1)), Path(entry.path))
    return found


def _kernel_rank(tree: DumpTree, rank: int, folder: Path) -> int:
    """``rank_{ID}/[{timestamp}/]step_{N}/``: a later timestamp folder's step wins."""
    found = 0
    for sub in [folder, *(Path(e.path) for e in _dirs(folder))]:
        for e in _dirs(sub):
            m = _KSTEP.match(e.name)
            if m:
                tree.where.setdefault(int(m.group(1)), {})[rank] = Path(e.path)
                found += 1
    return found


def _step(tree: DumpTree, procs: dict[int, list[tuple[int, Path]]], step: int, folder: Path) -> int:
    return sum(_add(tree, procs, step, Path(e.path)) for e in _dirs(folder))


def _add(tree: DumpTree, procs: dict[int, list[tuple[int, Path]]], step: int, folder: Path) -> int:
    rm, pm = _RANK.match(folder.name), _PROC.match(folder.name)
    if not (rm or pm):
        return 0
    if pm:
        procs.setdefault(int(pm.group(1)), []).append((step, folder))
        return 1
    rank = int(rm.group(1)) if rm.group(1) else 0
    by_rank = tree.where.setdefault(step, {})
    if rank in by_rank:
        tree.notes.append(f"step {step} rank {rank} is in two places: {by_rank[rank]} used, {folder} left out")
        return 1
    by_rank[rank] = folder  # a folder without dump.json stays: reading it says what is missing
    return 1


def _place_procs(tree: DumpTree, procs: dict[int, list[tuple[int, Path]]]) -> None:
    """``proc{pid}`` folders: a process that never knew its rank. One pid is one process
    across steps; they take the ranks after the highest rank id seen, in pid order."""
    if not procs:
        return
    first = max(tree.ranks, default=-1) + 1
    placed = []
    for i, pid in enumerate(sorted(procs)):
        for step, folder in procs[pid]:
            tree.where.setdefault(step, {})[first + i] = folder
        placed.append(f"proc{pid} as rank {first + i}")
    tree.notes.append(f"{len(placed)} process folder(s) had no rank id and are numbered here: "
                      + ", ".join(placed[:8]) + (" ..." if len(placed) > 8 else ""))


def _dirs(folder: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(folder) as it:
            return sorted((e for e in it if e.is_dir()), key=lambda e: e.name)
    except OSError:
        return []
