"""Several ranks' STEPs in one frame: what a node agent sends an ingest shard.

A coordinator's cost per STEP frame is mostly fixed (envelope, column checks, one array
write per column per rank), so a shard that gets one frame per rank per step spends the
same per frame whatever its share of the records: K shards did K times the frame work.
A node agent therefore packs the parts it routes to one shard in one pump into one
``STEPS`` frame: the parts' columns one after the other, and a header with one row per
part: the envelope it came with (src, seq: the shard's replay filter and acks treat each
part as the rank's own STEP), rank, step, token, wall time, new names and row count
(columns too, so checking a frame costs a few array checks, not a loop over parts). On
the wire the columns and the header are each one bytes field (:mod:`rankscope.wire.columns`).

An ingest shard takes the frame as a :class:`StepPack` (the parts kept whole: its aligner
places them at once in the usual case); anything that needs a part alone gets a
:class:`StepBatch` whose arrays are views of the frame's columns, with
:attr:`StepBatch.packed` saying where.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Iterator

import numpy as np

from rankscope.wire.columns import PART_FIELDS, STEP_COLUMNS
from rankscope.wire.protocol import STEPS, Message
from rankscope.wire.records import PackedRows, StepBatch

#: A part as the packer takes it: (src, seq, batch).
Part = tuple[str, int, StepBatch]
# parts_from_message builds StepBatches positionally (the cheapest way, per part).
if tuple(f.name for f in dataclasses.fields(StepBatch))[3:3 + len(STEP_COLUMNS)] != STEP_COLUMNS:
    raise ImportError("StepBatch's array fields are not in the wire's column order")


def pack_message(job: str, src: str, seq: int, parts: Iterable[Part]) -> Message:
    """One STEPS message of ``parts`` (all of job ``job``)."""
    parts = list(parts)
    bs = [b for _, _, b in parts]
    fields = {"seq": [p[1] for p in parts], "rank": [b.rank for b in bs], "step": [b.step for b in bs],
              "token": [b.token for b in bs], "rows": [len(b) for b in bs]}
    head = {"src": [p[0] for p in parts], "names": [dict(b.new_names) for b in bs],
            "head": np.array([fields[f] for f in PART_FIELDS], np.int64).T.reshape(len(bs), len(PART_FIELDS)),
            "wall": np.array([b.wall_time for b in bs], np.float64)}
    cols = {name: np.concatenate([getattr(b, name) for b in bs]) if bs
            else getattr(StepBatch.empty(job, 0, 0), name) for name in STEP_COLUMNS}
    return Message(STEPS, job, src, seq, {"parts": head, "cols": cols})


class StepPack:
    """The parts of one decoded STEPS frame, kept whole: a receiver that can take them at
    once needs no StepBatch per part; :meth:`batches` makes them for one that cannot."""

    __slots__ = ("job", "src", "seq", "ranks", "steps", "tokens", "walls", "names", "rows", "cols", "_batches")

    def __init__(self, msg: Message) -> None:
        head = msg.body["parts"]
        self.job, self.cols = msg.job, msg.body["cols"]
        self.src: list[str] = head["src"]
        self.names: list[dict] = head["names"]
        fields = dict(zip(PART_FIELDS, head["head"].T.tolist()))
        self.seq: list[int] = fields["seq"]
        self.ranks: list[int] = fields["rank"]
        self.steps: list[int] = fields["step"]
        self.tokens: list[int] = fields["token"]
        self.rows: list[int] = fields["rows"]
        self.walls: list[float] = head["wall"].tolist()
        self._batches: list[StepBatch] | None = None

    @property
    def records(self) -> int:
        return int(self.cols["name_ids"].shape[0])

    def batches(self) -> list[StepBatch]:
        """One StepBatch per part, its arrays views of the frame's columns."""
        if self._batches is None:
            job, cols, start, out = self.job, self.cols, 0, []
            arrays = [cols[name] for name in STEP_COLUMNS]
            for rank, step, token, wall, new_names, rows in zip(self.ranks, self.steps, self.tokens, self.walls,
                                                                self.names, self.rows):
                end = start + rows
                out.append(StepBatch(job, rank, step, *[a[start:end] for a in arrays], new_names=new_names,
                                     token=token, wall_time=wall, packed=PackedRows(cols, start)))
                start = end
            self._batches = out
        return self._batches


#: What a receiver hands its core: rank steps, one by one or packed.
Steps = list  # of StepBatch | StepPack


def as_batches(items: "Steps") -> list[StepBatch]:
    """Every part as a StepBatch, in order."""
    out: list[StepBatch] = []
    for b in items:
        if type(b) is StepPack:
            out += b.batches()
        else:
            out.append(b)
    return out


def record_count(items: "Steps") -> int:
    return sum(b.records if type(b) is StepPack else len(b) for b in items)


def named_parts(items: "Steps") -> Iterator[tuple[str, int, dict]]:
    """(job, rank, new names) of every part that carries names."""
    for b in items:
        if type(b) is StepPack:
            yield from ((b.job, r, n) for r, n in zip(b.ranks, b.names) if n)
        elif b.new_names:
            yield b.job, b.rank, b.new_names


def parts_from_message(msg: Message) -> list[Part]:
    """The parts of a *decoded* (validated) STEPS message: (src, seq, batch), arrays as views."""
    pack = StepPack(msg)
    return list(zip(pack.src, pack.seq, pack.batches()))
