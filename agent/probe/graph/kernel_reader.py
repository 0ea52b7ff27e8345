"""Per-step statistics from MindSpore's kernel dump, computed off the training thread.

After each compiled step the finished iteration folders are handed to one helper thread
(:meth:`KernelReader.submit`); it loads every tensor, computes rankscope's stats, and --
when the dump is rankscope's own -- deletes the files, so at most the iterations of a
step or two are ever on disk. :meth:`collect` (at the step's end, on the training
thread) joins that work and returns the rows in the graph's execution order, which is
what NaN-origin's "earliest" means in a compiled step.

The gradient AllReduce of a data-parallel reducer gets the same names the PyNative
sentinels use: its inputs are ``Sentinel.grad_local.<param>`` (a rank's own gradients,
before the reduction could spread a fault), its outputs ``Sentinel.grad_reduced.<param>``
(with CRC-32: identical on every replica). Every other kernel tensor keeps msProbe's L2
name (kernel_files), as FORWARD or BACKWARD.
"""
from __future__ import annotations

import os
import re
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from rankscope.probe.comm import layout_probe
from rankscope.probe.graph.kernel_config import KernelDump
from rankscope.probe.tensors.stats import TensorStats, array_stats
from rankscope.files.kernel_files import (
    CsvStats,
    KernelTensor,
    execution_order,
    iteration_dirs,
    load_npy,
    parse_name,
    read_statistic_csv,
)
from rankscope.wire.records import NO_CRC, Kind

_OP_INDEX = re.compile(r"-op(\d+)$")


@dataclass
class KernelRow:
    name: str
    kind: Kind
    stats: TensorStats
    order: tuple


@dataclass
class ReaderCounters:
    iterations: int = 0
    files: int = 0
    bytes_read: int = 0
    high_water_bytes: int = 0
    high_water_iterations: int = 0
    errors: int = 0
    last_error: str = ""
    seen_kernels: set = field(default_factory=set)


class KernelReader:
    def __init__(self, dump: KernelDump, on_error: Callable[[str, Exception], None]) -> None:
        self.dump = dump
        self.on_error = on_error
        self.counters = ReaderCounters()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rankscope-kernels")
        self._done: set[Path] = set()
        self._future: Future | None = None
        self._orders: dict[int, tuple] = {}
        #: Gradient parameter names in the reducer's order (set by the graph watch).
        self.grad_names: list[tuple[str, tuple]] = []

    def submit(self, keep_in: Path | None = None) -> None:
        """Hand every iteration folder not read yet to the helper thread; ``keep_in``:
        move the tensor files there (msProbe's static-graph L2 layout) instead of
        deleting them."""
        if self._future is not None:  # the previous step's: finish it first (rare: no collect)
            self.collect()  # its failure is reported there, once, not raised at every step after
        # Listed here, between steps: every folder that exists now is complete. Listed on
        # the helper thread, it could include the next step's, which MindSpore is still
        # writing -- and then delete it under MindSpore, failing the user's step.
        try:
            dirs = list(iteration_dirs(self.dump.root))
        except OSError as exc:
            self.on_error("listing the kernel dump", exc)
            return
        self._future = self._pool.submit(self._read_new, keep_in, dirs)

    def collect(self) -> list[KernelRow]:
        fut, self._future = self._future, None
        if fut is None:
            return []
        try:
            return fut.result()
        except Exception as exc:  # noqa: BLE001
            self.counters.errors += 1
            self.on_error("reading the kernel dump", exc)
            return []

    def idle(self) -> None:
        """Wait until every queued read, move and deletion is done."""
        self._pool.submit(lambda: None).result()

    def close(self) -> None:
        """Finish what was handed over; then rankscope's own scratch folder (its config, the
        execution-order files, what MindSpore wrote after the last read) goes too."""
        self._pool.shutdown(wait=True, cancel_futures=False)
        if self.dump.own:
            shutil.rmtree(self.dump.root, ignore_errors=True)
            if self.dump.root.parent.name == "rankscope-kernels":
                try:
                    self.dump.root.parent.rmdir()  # the temp folder's, once no process uses it
                except OSError:
                    pass

    # ------------------------------------------------------------------ helper thread
    def _read_new(self, keep_in: Path | None = None, dirs: list | None = None) -> list[KernelRow]:
        root = self.dump.root
        dirs = list(iteration_dirs(root)) if dirs is None else dirs
        todo = [(g, it, d) for g, it, d in dirs if d not in self._done]
        c = self.counters
        c.high_water_iterations = max(c.high_water_iterations, len(todo))
        rows: list[KernelRow] = []
        on_disk = 0
        for graph_id, iteration, it_dir in todo:
            order = self._order_of(root, graph_id)
            try:
                got, names, size = self._read_iteration(it_dir, graph_id, order)
            except FileNotFoundError:
                # Listed on the training thread while its deletion, queued after the
                # last read, had not run yet: read and gone already.
                continue
            rows += _in_run_order(got, (graph_id, iteration))
            on_disk += size
            c.iterations += 1
            if self.dump.own:
                self._dispose(it_dir, names, keep_in)
            else:
                self._done.add(it_dir)
        c.high_water_bytes = max(c.high_water_bytes, on_disk)
        rows.sort(key=lambda r: r.order)
        return self._name_grads(rows)

    def _dispose(self, it_dir: Path, names: list[str], keep_in: Path | None) -> None:
        """Move or delete a read iteration after its rows are handed back: queued behind
        the read on the same thread, so the training thread never waits for the
        deletion and the next read still starts with the disk cleared."""
        def run() -> None:
            if keep_in is not None:
                _move_all(it_dir, keep_in)
            _remove(it_dir, [] if keep_in is not None else names)
        try:
            self._pool.submit(run)
        except RuntimeError:  # closing: no queue any more
            run()

    def _order_of(self, root: Path, graph_id: int) -> dict[str, int]:
        """The graph's execution order, read again only when MindSpore rewrites it."""
        stamp = _stamp(root, graph_id)
        hit = self._orders.get(graph_id)
        if hit is None or hit[0] != stamp:
            hit = self._orders[graph_id] = (stamp, execution_order(root, graph_id))
        return hit[1]

    def _read_iteration(self, it_dir: Path, graph_id: int,
                        order: dict[str, int]) -> tuple[list[KernelRow], list[str], int]:
        """(rows, every file name seen, bytes on disk) of one iteration folder."""
        rows: list[KernelRow] = []
        names: list[str] = []
        size = 0
        c = self.counters
        with os.scandir(it_dir) as entries:
            for entry in entries:
                names.append(entry.name)
                try:
                    nbytes = entry.stat().st_size
                    size += nbytes
                    if entry.name == "statistic.csv":
                        rows += [self._csv_row(s, graph_id, order) for s in read_statistic_csv(Path(entry.path))]
                        continue
                    t = parse_name(entry.name)
                    if t is None or (nbytes <= _SCALAR_FILE and _constant_input(t)):
                        continue
                    arr = load_npy(entry.path)
                    c.files += 1
                    c.bytes_read += nbytes
                    st = array_stats(arr, _dtype_name(t.dtype), crc=_is_reduced(t))
                    rows.append(KernelRow(t.record_name, _kind(t), st, _order(t, graph_id, order)))
                    c.seen_kernels.add(t.op_type)
                except Exception as exc:  # noqa: BLE001 - one bad file never loses the rest
                    c.errors += 1
                    c.last_error = f"{entry.name}: {exc!r}"
        return rows, names, size

    def _csv_row(self, s: CsvStats, graph_id: int, order: dict[str, int]) -> KernelRow:
        st = TensorStats(s.tensor.dtype, list(s.shape), s.max, s.min, s.mean, s.norm, s.nan, s.inf, s.numel,
                         NO_CRC)  # statistics files carry no checksum
        self.counters.seen_kernels.add(s.tensor.op_type)
        return KernelRow(s.tensor.record_name, _kind(s.tensor), st, _order(s.tensor, graph_id, order))

    def _name_grads(self, rows: list[KernelRow]) -> list[KernelRow]:
        """Reducer AllReduce rows -> Sentinel.grad_local/grad_reduced.<param>.

        MindSpore numbers the reducer's AllReduce kernels in an order of its own; the
        parameters' shapes say which kernel carries which gradient (parameters of the
        same shape keep the direction the uniquely-shaped ones show)."""
        if not self.grad_names:
            return rows
        for kind, prefix in ((Kind.GRAD_LOCAL, "Sentinel.grad_local"), (Kind.GRAD_REDUCED, "Sentinel.grad_reduced")):
            seq = [r for r in rows if r.kind is kind]
            if not seq:
                continue
            names = match_by_shape([(_op_slot(r)[0], tuple(r.stats.shape)) for r in seq], self.grad_names)
            if names is None:
                continue
            for r, name in zip(seq, names):
                r.name = f"{prefix}.{name}"
        return rows


def match_by_shape(kernels: list[tuple[int, tuple]], params: list[tuple[str, tuple]]) -> list[str] | None:
    """Parameter name for each (op index, shape), or None when shapes do not match."""
    if len(kernels) != len(params) or sorted(map(str, (s for _, s in kernels))) != \
            sorted(map(str, (s for _, s in params))):
        return None
    by_shape: dict[tuple, list[int]] = {}
    for i, (_, shape) in enumerate(params):
        by_shape.setdefault(shape, []).append(i)
    unique = sorted((by_shape[s][0], op) for op, s in kernels if len(by_shape[s]) == 1)
    rising = sum(1 for a, b in zip(unique, unique[1:]) if b[1] > a[1])
    # undecided (fewer than two unique shapes): MindSpore's HyperMap numbers the last first
    descending = rising < (len(unique) - 1) / 2 if len(unique) > 1 else True
    out: list[str | None] = [None] * len(kernels)
    for shape, idxs in by_shape.items():
        ks = sorted((op, k) for k, (op, s) in enumerate(kernels) if s == shape)
        if descending:
            ks.reverse()
        for (_, k), i in zip(ks, idxs):
            out[k] = params[i][0]
    return out  # type: ignore[return-value]


def _in_run_order(rows: list[KernelRow], where: tuple) -> list[KernelRow]:
    """Order keys for one iteration folder's rows, led by ``where`` (graph, iteration).

    A graph run more than once before its folder is read (a jit helper called by every
    layer of an eager forward) leaves one file per run under the same name, told apart
    only by the timestamp in the file name; the folder lists them in no set order. So
    the k-th run of a kernel, by timestamp, is run k: every rank then hands the
    coordinator the runs in the same order, and its call index pairs run k with run k."""
    runs: dict[str, int] = {}
    for r in sorted(rows, key=lambda r: r.order[-1]):
        k = runs.get(r.name, 0)
        runs[r.name] = k + 1
        r.order = (*where, k, *r.order[1:-1])
    return rows


def _move_all(src: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for entry in os.scandir(src):
        os.replace(entry.path, dest / entry.name)


def _op_slot(r: KernelRow) -> tuple:
    head = r.name.rsplit(".", 4)[0]  # <OpType>.<op_name>
    m = _OP_INDEX.search(head)
    return (int(m.group(1)) if m else 0, r.name)


def _is_reduced(t: KernelTensor) -> bool:
    return t.op_type == "AllReduce" and t.io == "output" and "DistributedGradReducer" in t.op_name


def _kind(t: KernelTensor) -> Kind:
    if t.op_type == "AllReduce" and "DistributedGradReducer" in t.op_name:
        return Kind.GRAD_LOCAL if t.io == "input" else Kind.GRAD_REDUCED
    if t.op_type == "AllReduce" and t.io == "output" and not layout_probe.collectives_in_own_groups():
        # With no collective in a group of the script's own, an AllReduce is the gradients'
        # (a reducer inside a jit function loses its Cell scope): what every rank received,
        # never a value a rank made itself. A tensor-parallel layer's stays a forward
        # record, which the coordinator reads as received by its name.
        return Kind.GRAD_REDUCED
    return Kind.BACKWARD if t.backward else Kind.FORWARD


def _order(t: KernelTensor, graph_id: int, order: dict[str, int]) -> tuple:
    """(graph, position in its execution order, input before output, slot, timestamp)."""
    pos = order.get(t.op_name, len(order) + 1)
    return (graph_id, pos, 0 if t.io == "input" else 1, t.slot, t.timestamp)


def _dtype_name(dtype: str) -> str:
    return dtype[:1].upper() + dtype[1:] if dtype else "Float32"


#: An .npy of one element of at most 8 bytes: NumPy's header (128 bytes) and the value.
_SCALAR_FILE = 136


def _constant_input(t: KernelTensor) -> bool:
    """A one-element bool/integer input: an operator attribute MindSpore passes as an
    input (MatMul's transpose flags, a convolution's stride). It cannot be non-finite
    and is the same every step, so it is not read."""
    return t.io == "input" and t.dtype[:1].lower() in ("b", "i", "u")


def _remove(it_dir: Path, names: list[str]) -> None:
    """Delete a read iteration folder by the names already listed (no second walk)."""
    try:
        for name in names:
            os.unlink(os.path.join(it_dir, name))
        os.rmdir(it_dir)
    except OSError:  # something new or a sub-folder appeared: the slow way
        shutil.rmtree(it_dir, ignore_errors=True)


def _stamp(root: Path, graph_id: int) -> tuple:
    try:
        return tuple(p.stat().st_mtime_ns for p in
                     root.glob(f"rank_*/execution_order/ms_execution_order_graph_{graph_id}.csv"))
    except OSError:
        return ()
