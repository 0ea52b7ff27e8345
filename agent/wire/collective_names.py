"""One spelling for the records of a collective's input and output, and one reader of it.

A rank records the tensors going into and coming out of each collective it calls from
Python as ``Sentinel.collective.<group>.<Op>.<n>.<input|output>.<slot>`` (``n``: the
call's index among this step's calls of that op in that group). The group is in the
name, so the record's column exists on exactly the ranks of the group. A compiled step's
collectives arrive through the kernel dump as ``<Op>.<scope>.<task>.<stream>.<io>.<slot>``
(:mod:`rankscope.files.kernel_files`). msProbe's own dumps name a communication call
``<Api>.<function>.<n>.forward`` (``Distributed.all_reduce.0.forward`` in PyTorch,
``MintDistributed.all_reduce.0.forward`` in MindSpore) with msProbe's row suffixes
``.input.<i>`` / ``.output.<i>``. :func:`parse_collective` reads all three, so the
coordinator can tell a value a rank made from one it only received.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

PREFIX = "Sentinel.collective."

#: Collective primitives and what MindSpore's kernel dump calls them.
COLLECTIVE_OPS = frozenset({
    "AllReduce", "AllGather", "ReduceScatter", "Broadcast", "AlltoAll", "AlltoAllV", "AllToAll",
    "Send", "Receive", "NeighborExchange", "NeighborExchangeV2", "Reduce", "CollectiveScatter",
    "CollectiveGather", "BatchISendIRecv", "AllGatherV", "ReduceScatterV",
})
#: Ops whose output is the same on every rank of the group.
REPLICATING_OPS = frozenset({"AllReduce", "AllGather", "Broadcast", "AllGatherV"})

#: msProbe's API prefixes of communication calls (its support_wrap_ops lists).
MSPROBE_COMM_APIS = frozenset({"Distributed", "MintDistributed", "CommFunc", "Communication"})
#: msProbe's function names of communication calls -> the collective they are.
MSPROBE_COMM_OPS = {
    "all_reduce": "AllReduce", "all_gather": "AllGather", "all_gather_into_tensor": "AllGather",
    "_all_gather_base": "AllGather", "reduce_scatter": "ReduceScatter", "reduce_scatter_tensor": "ReduceScatter",
    "_reduce_scatter_base": "ReduceScatter", "broadcast": "Broadcast", "all_to_all": "AlltoAll",
    "all_to_all_single": "AlltoAll", "all_to_all_single_with_output_shape": "AlltoAll",
    "all_to_all_with_output_shape": "AlltoAll", "send": "Send", "isend": "Send", "recv": "Receive",
    "irecv": "Receive", "reduce": "Reduce", "gather": "CollectiveGather", "gather_into_tensor": "CollectiveGather",
    "scatter": "CollectiveScatter", "scatter_tensor": "CollectiveScatter", "batch_isend_irecv": "BatchISendIRecv",
}

_UNSAFE = re.compile(r"[^A-Za-z0-9_\-]")


def safe_group(group: str) -> str:
    """A group name as it appears inside a record name (no dots: they separate fields)."""
    return _UNSAFE.sub("_", str(group))[:96] or "_"


def collective_record(group: str, op: str, n: int, io: str, slot: int) -> str:
    return f"{PREFIX}{safe_group(group)}.{op}.{n}.{io}.{slot}"


@dataclass(frozen=True)
class CollectiveIO:
    """One record of a collective call: ``call`` names the call (its input and output
    records share it), ``io`` is "input" or "output"."""

    call: str
    io: str
    op: str
    group: str | None  # None: a kernel-dump record, whose group the file name does not say

    @property
    def replicated_output(self) -> bool:
        """An output every rank of the group must hold bit for bit."""
        return self.io == "output" and self.op in REPLICATING_OPS and self.group is not None


def parse_collective(name: str) -> CollectiveIO | None:
    """The collective call a record belongs to, or None for any other record."""
    if name.startswith(PREFIX):
        parts = name[len(PREFIX):].split(".")
        if len(parts) != 5 or parts[3] not in ("input", "output"):
            return None
        group, op, n, io, _slot = parts
        return CollectiveIO(f"{PREFIX}{group}.{op}.{n}", io, op, group)
    op = name.split(".", 1)[0]
    if op in MSPROBE_COMM_APIS:
        return _msprobe_collective(name)
    if op not in COLLECTIVE_OPS:
        return None
    parts = name.rsplit(".", 2)
    if len(parts) != 3 or parts[1] not in ("input", "output"):
        return None
    return CollectiveIO(parts[0], parts[1], op, None)


def _msprobe_collective(name: str) -> CollectiveIO | None:
    """``<Api>.<function>.<n>.forward.<input|output>.<i>[...]``: msProbe's row of a call."""
    parts = name.split(".")
    if len(parts) < 6 or parts[3] != "forward" or parts[4] not in ("input", "output") \
            or parts[1] not in MSPROBE_COMM_OPS:
        return None
    return CollectiveIO(".".join(parts[:4]), parts[4], MSPROBE_COMM_OPS[parts[1]], None)
