"""The default watch's sentinel rows at a cost that does not grow past the budget.

What the full watch (``cluster.watch: "full"``) records of every parameter, optimizer
state and gradient every step (a private copy, msProbe's four statistics and a CRC-32
each) costs several passes over the whole model per step. The default records:

- every step, each gradient's norm and non-finite counts from one pass (the squared norm
  the re-run gate reads is shared, not computed twice), and the loss;
- on rotation (:mod:`rankscope.probe.vitals.budget`), the bit-exact fingerprint
  (:mod:`rankscope.probe.vitals.fingerprint`) of each weight piece as the step starts and after
  the update, of each optimizer-state piece, and of each reduced gradient piece. A
  weight's end-of-step fingerprint is taken at the step before its start one, so the
  "changed outside the optimizer" check still compares adjacent points.

Nothing is copied on CPU: fingerprints and norms read the zero-copy host view. On an
accelerator the fingerprints of a step's due pieces come back in one readback.
"""
from __future__ import annotations

import math
import time
import weakref
from typing import Any

import numpy as np

from rankscope.probe.vitals import fingerprint as fp
from rankscope.probe.vitals.budget import WARMUP, WatchBudget, due
from rankscope.probe.vitals.probe_clock import CLOCK
from rankscope.probe.tensors.stats import TensorStats, to_numpy, wait_for_device
from rankscope.wire.records import Kind
from rankscope.text.watch_line import DEFAULT_TIER



class Piece:
    __slots__ = ("name", "tensor", "a", "b", "nbytes", "dtype", "shape", "ptr", "bytes")

    def __init__(self, name: str, tensor: Any, a: int, b: int, nbytes: int, shape: list[int]) -> None:
        self.name, self.tensor, self.a, self.b, self.nbytes = name, tensor, a, b, nbytes
        self.dtype = str(getattr(tensor, "dtype", ""))
        self.shape = shape  # the row's shape: the tensor's, or the chunk's length
        #: The piece's bytes in the tensor's own host memory, and that memory's address
        #: when they were taken (see :meth:`host_bytes`).
        self.ptr: int | None = None
        self.bytes: memoryview | None = None

    def host_bytes(self, views: dict[int, np.ndarray]) -> tuple[memoryview, bool]:
        """(the piece's bytes, whether they had to be copied), without asking MindSpore for
        a host view again while the tensor keeps its memory.

        Weights and optimizer state live the whole job in one buffer the optimizer updates
        in place; on CPU ``asnumpy`` hands out that buffer itself. The view is kept with the
        buffer's address and taken again only when ``data_ptr`` says the tensor moved (a
        ``set_data``, a load): a read of a kept view is ~20x cheaper than ``asnumpy``, which
        is most of the default tier's cost on a small model."""
        data_ptr = getattr(self.tensor, "data_ptr", None)
        ptr = data_ptr() if data_ptr is not None else None
        if ptr is not None and ptr == self.ptr and self.bytes is not None:
            return self.bytes, False
        arr = views.get(id(self.tensor))
        if arr is None:  # one host view a tensor, whatever its chunks due
            arr = views[id(self.tensor)] = to_numpy(self.tensor)[0]
        raw, copied = fp.piece_bytes(arr, self.a, self.b)
        # Kept only where the view is the tensor's memory, not a copy asnumpy made.
        own = ptr is not None and not copied and not arr.flags.owndata and arr.ctypes.data == ptr
        self.ptr, self.bytes = (ptr, raw) if own else (None, None)
        return raw, copied

    def stats(self, fingerprint: int) -> TensorStats:
        return TensorStats(self.dtype, self.shape, None, None, None, None, 0, 0, self.b - self.a, fingerprint)


class VitalSigns:
    """Rows of the default tier, with their cost measured and planned."""

    def __init__(self, rec: Any, fraction: float, device_side: bool = False) -> None:
        self.rec = rec
        self.budget = WatchBudget(fraction)
        self.device_side = device_side
        self.step = 0
        #: Rotating pieces per optimizer: (weights, optimizer state), in layout order.
        self._pieces: "weakref.WeakKeyDictionary[Any, tuple[list[Piece], list[Piece]]]" = \
            weakref.WeakKeyDictionary()
        self._index: dict[str, list[int]] = {}  # weight name -> its pieces' rotation indexes
        self._count = 0
        self._cycle_bytes = 0
        #: id(gradient) -> (gradient, (squared norm, view, dtype)) this step: read once, by
        #: whoever asks first.
        self.norms: dict[int, tuple[Any, tuple[float, np.ndarray, str]]] = {}
        #: Gradients were handed over since the last wait: ops that made them (a clip, a
        #: reduction) may still be queued, and the first read waits for them, so that no
        #: ``asnumpy`` waits inside the probe's own time (spinning on the training thread).
        self._unwaited = False
        self._t_step = time.perf_counter()
        self._vital = self._rotating = 0.0
        self._done = self._read = self._copied = 0

    # ------------------------------------------------------------------ layout
    def pieces_of(self, opt: Any, params: list[tuple[str, Any]], state: list[tuple[str, Any]]
                  ) -> tuple[list[Piece], list[Piece]]:
        got = self._pieces.get(opt)
        if got is None:
            got = (self._split(params), self._split(state))
            self._pieces[opt] = got
            self._renumber()
        return got

    @staticmethod
    def _split(named: list[tuple[str, Any]]) -> list[Piece]:
        out = []
        for name, t in named:
            shape = tuple(getattr(t, "shape", ()) or ())
            size = int(np.prod(shape)) if shape else 1
            width = fp._itemsize(getattr(t, "dtype", "float32"))  # noqa: SLF001 - one spelling of a dtype's width
            parts = fp.chunks(size * width, width)
            whole = len(parts) == 1
            out += [Piece(fp.chunk_name(name, k, len(parts)), t, a, b, (b - a) * width,
                          list(shape) if whole else [b - a])
                    for k, (a, b) in enumerate(parts)]
        return out

    def _renumber(self) -> None:
        self._index.clear()
        i = total = 0
        for params, state in self._pieces.values():
            for p in params:
                self._index.setdefault(fp.tensor_name(p.name), []).append(i)
                i += 1
            i += len(state)
            total += sum(p.nbytes for p in params) + sum(p.nbytes for p in state)
        self._count, self._cycle_bytes = i, total

    def rotation_index(self, opt: Any) -> tuple[int, int]:
        """(first index of ``opt``'s weights, first of its state) in the rotation."""
        i = 0
        for o, (params, state) in self._pieces.items():
            if o is opt:
                return i, i + len(params)
            i += len(params) + len(state)
        return i, i

    # ------------------------------------------------------------------ rows
    def snapshot(self, opt: Any, params: list[tuple[str, Any]], state: list[tuple[str, Any]],
                 with_state: bool = True) -> None:
        """Fingerprints of the pieces due this step, as the step starts."""
        wp, sp = self.pieces_of(opt, params, state)
        i0, s0 = self.rotation_index(opt)
        due_p = [p for i, p in enumerate(wp) if due(i0 + i, self.step, self.budget.every)]
        due_s = [p for i, p in enumerate(sp) if due(s0 + i, self.step, self.budget.every)] if with_state else []
        self._offer("Sentinel.param.", wp)
        self._offer("Sentinel.opt_state.", sp)
        self._rows("Sentinel.param.", Kind.PARAM, due_p)
        self._rows("Sentinel.opt_state.", Kind.OPT_STATE, due_s)

    def snapshot_end(self, opt: Any, params: list[tuple[str, Any]], state: list[tuple[str, Any]]) -> None:
        """Fingerprints after the update of the weight pieces the next step starts with."""
        wp, _ = self.pieces_of(opt, params, state)
        i0, _ = self.rotation_index(opt)
        self._offer("Sentinel.param_end.", wp)
        self._rows("Sentinel.param_end.", Kind.PARAM,
                   [p for i, p in enumerate(wp) if due(i0 + i, self.step + 1, self.budget.every)])

    def _offer(self, prefix: str, pieces: list[Piece]) -> None:
        """Every piece, due or not, to a capture asked for this step (its values, not its
        fingerprint: a weight out of this step's rotation is still there to read)."""
        cap = self.rec.capturing()
        if cap is not None:
            if not self.device_side:
                wait_for_device()  # a kept view is read without asnumpy's own wait
            for p in pieces:
                cap.offer(prefix + p.name, p.tensor)

    def _rows(self, prefix: str, kind: Kind, pieces: list[Piece]) -> None:
        if not pieces:
            return
        t0 = time.perf_counter()
        if self.device_side:
            prints = fp.device_fingerprints([(p.tensor, p.a, p.b) for p in pieces])
            self._copied += 16 * len(pieces)  # the readback: two int64 a piece
        else:
            # A kept view is read without asnumpy, which would have waited for the writes
            # queued on its tensor: wait for them all, once.
            wait_for_device()
            prints, views = [], {}
            for p in pieces:
                raw, copied = p.host_bytes(views)
                if copied:
                    self._copied += p.nbytes
                prints.append(fp.hash_bytes(raw))
        for p, value in zip(pieces, prints):
            self.rec.row_known(prefix + p.name, kind, p.stats(value))
            self._read += p.nbytes
        self._done += len(pieces)
        self._rotating += time.perf_counter() - t0

    def grad_rows(self, prefix: str, kind: Kind, grads: Any, names: list[str]) -> None:
        """One row per gradient: norm and non-finite counts every step; a reduced gradient's
        fingerprint on rotation (where its weight's pieces are due). On an accelerator the
        recorder's one-readback device statistics take the gradients instead."""
        if not isinstance(grads, (tuple, list)):
            grads = (grads,)
        self._unwaited = True
        cap = self.rec.capturing()
        for i, g in enumerate(grads):
            name = names[i] if i < len(names) else str(i)
            if cap is not None:
                cap.offer(f"{prefix}.{name}", g)
            if self.device_side:
                self.rec.row(f"{prefix}.{name}", kind, g, crc=False)
                continue
            idx = self._index.get(name)
            fingerprint = kind is Kind.GRAD_REDUCED and (
                idx is None or any(due(j, self.step, self.budget.every) for j in idx))
            self.rec.row_known(f"{prefix}.{name}", kind, _Later(self, g, fingerprint))

    def squared_norm(self, g: Any) -> float:
        """A gradient's squared norm, read once a step (also by the re-run gate)."""
        return self.read(g)[0]

    def read(self, g: Any) -> tuple[float, np.ndarray, str]:
        """(squared norm, host view, dtype name) of a gradient, read once a step."""
        got = self.norms.get(id(g))
        if got is not None and got[0] is g:
            return got[1]
        if not self.norms or self._unwaited:  # what made the gradients is not the probe's time
            wait_for_device()
            self._unwaited = False
        t0 = time.perf_counter()
        arr, dtype_name = to_numpy(g)
        sq = fp.host_squared_norm(arr)
        self._read += arr.nbytes
        if arr.dtype.itemsize < 4 and arr.dtype.kind == "f":
            self._copied += arr.size * 4
        self._vital += time.perf_counter() - t0
        self.norms[id(g)] = (g, (sq, arr, dtype_name))
        return sq, arr, dtype_name

    # ------------------------------------------------------------------ step end
    def step_ended(self) -> None:
        now = time.perf_counter()
        # Everything else the probe did on the training thread this step counts as vital:
        # it is paid every step, whatever K is.
        fixed = max(self._vital, CLOCK.lap() - self._rotating)
        self.budget.note_step(now - self._t_step, fixed, self._rotating, self._done, self._count,
                              self._read, self._copied, self._cycle_bytes)
        self._t_step = now
        self._vital = self._rotating = 0.0
        self._done = self._read = self._copied = 0
        self.norms.clear()
        self.step += 1

    def cost(self) -> dict[str, Any]:
        """What the rank's watch costs, for its watch status and coverage.json."""
        b = self.budget
        share = b.share()
        planned = b.noted >= WARMUP  # K is a guess until the first plan
        return {"tier": DEFAULT_TIER, "budget": b.fraction, "every": b.every if planned else None,
                "share": None if share is None else round(share, 4),
                "host_bytes": b.last_bytes_copied, "read_bytes": b.last_bytes_read}


class _Later:
    """A gradient row's stats, computed when the recorder resolves its queue (so reading
    the gradient never waits for MindSpore's pipeline earlier than the rows around it)."""

    __slots__ = ("vital", "g", "fingerprint")

    def __init__(self, vital: VitalSigns, g: Any, fingerprint: bool) -> None:
        self.vital, self.g, self.fingerprint = vital, g, fingerprint

    def __call__(self) -> TensorStats:
        v = self.vital
        sq, arr, dtype_name = v.read(self.g)
        nan = inf = 0
        if not math.isfinite(sq):  # counted only when there is something to count
            flat = arr.reshape(-1)
            nan = int(np.isnan(flat).sum()) if flat.dtype.kind == "f" else 0
            inf = int(np.isinf(flat).sum()) if flat.dtype.kind == "f" else 0
        crc = -1
        if self.fingerprint:
            t0 = time.perf_counter()
            crc = fp.host_fingerprint(arr)
            v._read += arr.nbytes  # noqa: SLF001
            v._rotating += time.perf_counter() - t0  # noqa: SLF001
        norm = math.sqrt(sq) if math.isfinite(sq) and sq >= 0 else (math.inf if not nan else math.nan)
        return TensorStats(dtype_name, list(arr.shape), None, None, None, norm, nan, inf, int(arr.size), crc)
