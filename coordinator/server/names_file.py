"""An ingest shard's file of the ranks' tensor names, read again by its restarted process.

Ranks send their names once; a restarted shard would otherwise see only name ids. The
ranks of a data-parallel job mostly send the same table, so each distinct table is written
once (``{"table": id, "names": {...}}``) and a rank's line refers to it (``[job, rank, id]``);
a table beyond ``MAX_TABLES`` distinct ones is written in full on the rank's line.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from rankscope.wire.layout import rank_from_wire
from rankscope.wire.step_pack import named_parts

MAX_TABLES = 1024


class NamesFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        cut = path.is_file() and path.stat().st_size > 0 and _last_byte(path) != b"\n"
        self._out = open(path, "a", encoding="utf-8")
        if cut:  # the old process died mid-line: end it, or this process's first line joins it
            self._out.write("\n")
        self._ids: dict[tuple, int] = {}

    def write(self, batches: list) -> None:
        lines = []
        for job, rank, names in named_parts(batches):
            if rank_from_wire(rank) is None:
                continue
            content = tuple(names.items())
            ref = self._ids.get(content)
            if ref is None and len(self._ids) < MAX_TABLES:
                ref = self._ids[content] = len(self._ids)
                lines.append(json.dumps({"table": ref, "names": names}))
            lines.append(json.dumps([job, rank, names if ref is None else ref]))
        if lines:
            self._out.write("\n".join(lines) + "\n")
            self._out.flush()

    def close(self) -> None:
        self._out.close()

    @staticmethod
    def read(path: Path) -> Iterator[tuple[str, Any, dict]]:
        """(job, rank, names) as written; a line cut short by the old process's death is skipped."""
        if not path.is_file():
            return
        tables: dict[int, dict] = {}
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    x = json.loads(line)
                    if isinstance(x, dict):
                        tables[int(x["table"])] = x["names"]
                        continue
                    job, rank, names = x
                except (ValueError, KeyError, TypeError):
                    continue
                names = tables.get(names) if isinstance(names, int) else names
                if isinstance(names, dict):
                    yield job, rank, names


def _last_byte(path: Path) -> bytes:
    with open(path, "rb") as f:
        f.seek(-1, 2)
        return f.read(1)
