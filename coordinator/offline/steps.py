"""Reading one step of every rank: in worker processes where there are many ranks.

Parsing JSON holds the GIL, so threads would not help; a pool of processes reads the
rank folders of one step and hands back their rows (a few hundred bytes per tensor).
One step is in memory at a time (two more while the replicated columns are learned),
whatever the number of steps in the tree.
"""
from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
from pathlib import Path

from rankscope.coordinator.offline.dump_rows import DUMP_FILE, DumpReadError, RankStep, read_rank_step
from rankscope.coordinator.offline.kernel_rows import has_kernel_files, read_kernel_step

#: Below this many ranks a step is read in this process: a pool costs more than it saves.
POOL_FROM = 16


def _read(folder: str) -> RankStep | str:
    try:
        if not os.path.exists(os.path.join(folder, DUMP_FILE)) and has_kernel_files(folder):
            return read_kernel_step(folder)
        return read_rank_step(folder)
    except DumpReadError as exc:
        return str(exc)
    except Exception as exc:  # noqa: BLE001 - one bad file must not end the analysis
        return f"{folder}/dump.json: {type(exc).__name__}: {exc}"


class StepReader:
    def __init__(self, jobs: int | None = None) -> None:
        self.jobs = max(1, jobs if jobs else min(4, os.cpu_count() or 1))
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None

    def read(self, where: dict[int, Path]) -> dict[int, RankStep | str]:
        """rank -> its rows, or the reason they could not be read."""
        ranks = sorted(where)
        folders = [str(where[r]) for r in ranks]
        if self.jobs == 1 or len(ranks) < POOL_FROM:
            return dict(zip(ranks, map(_read, folders)))
        if self._pool is None:
            # spawn: the parent may hold threads (and MindSpore) that fork would copy half-way.
            self._pool = concurrent.futures.ProcessPoolExecutor(
                self.jobs, mp_context=multiprocessing.get_context("spawn"))
        chunk = max(1, len(folders) // (self.jobs * 4))
        return dict(zip(ranks, self._pool.map(_read, folders, chunksize=chunk)))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
