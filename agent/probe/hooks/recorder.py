"""The per-step record store every hook writes into.

One :class:`Recorder` per debugger. Hooks hand it tensors with a name and a Kind; it
computes the stats once, appends a row to the step's StepBatchBuilder (what streams)
and returns the msProbe entry dict (what the dump writer writes). Nothing here touches
MindSpore ops: stats go through NumPy (see rankscope.probe.tensors.stats), so a hook can never recurse
into a wrapped API or change the graph.
"""
from __future__ import annotations

import copy
import linecache
import sys
import traceback
from typing import Any, Callable

from rankscope.probe.graph import compile_guard
from rankscope.probe.hooks.grad_hooks import GradHooks
from rankscope.probe.tensors.stats import TensorStats, is_tensor, tensor_stats, wait_for_device
from rankscope.wire.records import NO_CRC, Kind, NameTable, StepBatchBuilder

_DEVICE_FLOATS = frozenset({"Float32", "Float16", "BFloat16", "Float64"})

_SKIP_DIRS = (f"{__package__.split('.')[0]}/hooks/", "/agent/sentinels.py", "/agent/debugger.py",
              "/agent/token_range.py", "/agent/callback.py", "/agent/autoattach.py")
_MAX_STACK = 40


_PARAMETER: list[type] = []


def is_parameter(value: Any) -> bool:
    """A mindspore.Parameter: the optimizer updates it in place, so a read deferred past
    the update would record the next step's value."""
    if not _PARAMETER:
        try:
            from mindspore import Parameter
        except Exception:  # noqa: BLE001 - no MindSpore: nothing is one
            return False
        _PARAMETER.append(Parameter)
    return isinstance(value, _PARAMETER[0])


class Recorder(GradHooks):
    """Holds one step's records: batch rows, dump.json entries, stacks, construct."""

    def __init__(self, *, task: str = "statistics", summary_mode: str = "statistics",
                 data_mode: list[str] | None = None, scope: list[str] | None = None,
                 api_list: list[str] | None = None,
                 write_tensor: Callable[[int, str, str, Any], str] | None = None,
                 log_error: Callable[[int, str, str], None] | None = None,
                 rank_label: Callable[[], str] = lambda: "proc0") -> None:
        self.task = task
        self.crc = summary_mode == "md5"
        modes = set(data_mode or ["all"])
        self._dirs = {m for m in modes if m in ("forward", "backward")} or {"forward", "backward"}
        self._ios = {m for m in modes if m in ("input", "output")} or {"input", "output"}
        self.scope = list(scope or [])
        self._in_scope = False
        self._unwanted: set[str] = set()  # backward entries this step's filters left out
        self.api_list = list(api_list or [])
        self._write_tensor = write_tensor
        self._log_error = log_error
        self.rank_label = rank_label
        self.names = NameTable()
        self.builder = StepBatchBuilder(self.names)
        self.step = 0
        #: L0/L1/save records are taken only while True (start..stop, selected step
        #: and rank, inside token_range); sentinels ignore it.
        self.dumping = False
        self.token = -1
        self.errors = 0
        self.entries: dict[str, dict] = {}
        self.stacks: dict[str, list] = {}
        self.construct: dict[str, str | None] = {}
        self._stack_cache: dict[tuple, list[str]] = {}
        self._pending: list[tuple] = []
        #: Whether parameters must be read when the forward uses them. True unless an
        #: optimizer is hooked: then its pre-hook resolves everything before the update,
        #: which is exact and costs one pipeline drain per step instead of one per cell.
        #: Without one (inference), weights may change within a step (e.g. between
        #: decode iterations), so they are read at once.
        self.params_now: Callable[[], bool] = lambda: True
        #: On an accelerator, compute stats device-side and read all of a step's scalars
        #: back in one transfer (rankscope.probe.tensors.stats.device_stats_batch); on CPU, NumPy over the
        #: zero-copy host view is the device pass.
        self.device_side = False
        #: While a hooked root model's forward runs, grad-hook registrations are queued
        #: here and done at the end of that forward: registering a hook on a tensor still
        #: being computed waits for MindSpore's pipeline, so one batch = one wait.
        self.queued_hooks: list[tuple[Any, Any]] | None = None
        self._step_hooks: list[Any] = []  # handles of this step's tensor hooks
        #: Stats of parameters read at step start (sentinel snapshot), by id: L0 reuses
        #: them instead of reading a parameter again.
        self.param_cache: dict[int, TensorStats] = {}
        #: The Cells' parameters and parameter gradients are left to the sentinels once an
        #: optimizer is stepping (the default tier under launch, rankscope.probe.vitals.vital).
        self.lean_cells = False
        #: Values asked for at this step (rankscope.probe.tensors.capture.Captures): every queued
        #: tensor is offered by its record name while one is.
        self.capture: Any = None
        #: Called when a hooked root model's forward begins (the step's start in loops
        #: that never call start() per step).
        self.on_step_start: Callable[[], None] | None = None

    # ------------------------------------------------------------------ filters
    def wants(self, name: str) -> bool:
        """config ``list`` (name contains any item) and ``scope``: msProbe's [start, end]
        range, every record from the one named start to the one named end, in the order
        they are recorded (called once per record, so the range follows the step)."""
        if self.scope:
            if name == self.scope[0]:
                self._in_scope = True
            inside = self._in_scope
            if name == self.scope[-1]:
                self._in_scope = False
            if not inside:
                return False
        if self.api_list and not any(item in name for item in self.api_list):
            return False
        return True

    def wants_io(self, direction: str, io: str) -> bool:
        return direction in self._dirs and io in self._ios

    # ------------------------------------------------------------------ records
    def stats(self, value: Any, crc: bool | None = None) -> TensorStats:
        return tensor_stats(value, self.crc if crc is None else crc)

    def add_stats(self, name: str, kind: Kind, st: TensorStats, value: Any = None) -> dict:
        """Append a row for precomputed stats; return the dump.json entry dict."""
        self.builder.add(name, kind, st.row(), st.nan, st.inf, st.numel, st.crc)
        data_name = self._save_tensor(name, value) if self.task == "tensor" and value is not None else None
        return st.entry(data_name)

    def row(self, name: str, kind: Kind, value: Any, crc: bool | None = None) -> None:
        """A streamed row only: no dump.json entry, no tensor file (the sentinels)."""
        self._pending.append((name, kind, value, self.crc if crc is None else crc, None, None))

    def known(self, name: str, kind: Kind, st: TensorStats) -> dict:
        """Queue a record whose stats are already known (a parameter read at step start)."""
        if not self.crc and st.crc != NO_CRC:
            st = copy.copy(st)
            st.crc = NO_CRC
        entry: dict = {}
        self._pending.append((name, kind, None, False, entry, st))
        return entry

    def row_known(self, name: str, kind: Kind, st: TensorStats) -> None:
        """Queue a streamed row whose stats are known; ``st.crc`` may be a Future
        (rankscope.probe.tensors.stats.crc32_later), joined when the row is resolved."""
        self._pending.append((name, kind, None, False, None, st))

    def insert_known(self, rows: list[tuple[str, Kind, TensorStats]]) -> None:
        """Queue rows computed elsewhere (a compiled step's kernels) where they ran:
        after the step-start snapshot, before the step's loss."""
        at = next((i for i, item in enumerate(self._pending) if item[1] == Kind.LOSS), len(self._pending))
        self._pending[at:at] = [(name, kind, None, False, None, st) for name, kind, st in rows]

    def hold_loss(self) -> Callable[[], None]:
        """Take the step's queued loss record out of the queue; the returned call queues it
        again. Records made in between (a re-run's forward and backward) then come before
        the loss, where they come when they run as the step's own."""
        at = next((i for i in range(len(self._pending) - 1, -1, -1) if self._pending[i][1] == Kind.LOSS), None)
        held = self._pending.pop(at) if at is not None else None

        def release() -> None:
            if held is not None:
                self._pending.append(held)
        return release

    def capturing(self) -> Any:
        """The step's capture requests (rankscope.probe.tensors.capture.Captures) while any waits
        for its tensor, else None: one check a step where nothing was asked."""
        cap = self.capture
        return cap if cap is not None and cap.active else None

    def has_unread_params(self) -> bool:
        """Queued parameter records still to be read (before an optimizer changes them):
        a cell's parameters, and a Parameter handed to an API as its argument."""
        return any(item[5] is None and (item[1] == Kind.PARAM or is_parameter(item[2])) for item in self._pending)

    def tensor(self, name: str, kind: Kind, value: Any, crc: bool | None = None) -> dict:
        """Queue a tensor; its entry dict is filled in by :meth:`resolve`.

        Why deferred: reading a tensor (even its shape) waits for MindSpore's async
        pipeline to drain. Reading in every hook serialises the whole step; keeping a
        reference and reading everything at one point per step costs one drain.
        Activations and gradients are fresh tensors, so reading them later is exact;
        parameters are resolved before the optimizer updates them (sentinels).
        """
        entry: dict = {}
        self._pending.append((name, kind, value, self.crc if crc is None else crc, entry, None))
        return entry

    def tensor_now(self, name: str, kind: Kind, value: Any, crc: bool | None = None) -> dict:
        """Read a tensor immediately (after everything queued, to keep record order)."""
        self.resolve()
        return self.add_stats(name, kind, self.stats(value, crc), value)

    def resolve(self) -> None:
        """Compute every queued tensor's stats, in record order (one pipeline drain)."""
        pending, self._pending = self._pending, []
        on_device = self._device_rows(pending) if self.device_side and pending else {}
        if not self.device_side and any(item[5] is None and item[2] is not None for item in pending):
            # The one drain, made here: asnumpy would make it too, but spinning on the
            # training thread and inside the probe's own time (rankscope.probe.tensors.device_wait).
            wait_for_device()
        cap = self.capturing()
        for idx, (name, kind, value, crc, entry, st) in enumerate(pending):
            try:
                if cap is not None and value is not None:
                    cap.offer(name, value)
                if st is None:
                    st = on_device.get(idx) or tensor_stats(value, crc)
                elif callable(st):  # computed now, in record order (rankscope.probe.vitals.vital)
                    st = st()
                elif not isinstance(st.crc, int):  # a CRC still being computed
                    st.crc = st.crc.result()
                self.builder.add(name, kind, st.row(), st.nan, st.inf, st.numel, st.crc)
                if entry is not None:
                    data_name = self._save_tensor(name, value) if self.task == "tensor" and value is not None \
                        else None
                    entry.update(st.entry(data_name))
            except Exception as exc:  # noqa: BLE001
                self.error(f"stats of {name}", exc)

    def forward_nan(self) -> str:
        """The name of the step's first queued forward record holding a NaN, or "" (an Inf
        is no anomaly here: attention masks carry -inf on every step).
        Its statistics are computed now, in place, so the queue keeps its order and
        :meth:`resolve` does not compute them again (the same work, earlier in the step)."""
        if self.device_side:
            return ""
        for i, (name, kind, value, crc, entry, st) in enumerate(self._pending):
            if kind != Kind.FORWARD:
                continue
            if st is None:
                st = tensor_stats(value, crc)
                self._pending[i] = (name, kind, value, crc, entry, st)
            if isinstance(st, TensorStats) and st.nan:
                return name
        return ""

    def value(self, name: str, kind: Kind, value: Any) -> Any:
        """dump.json form of any argument: tensors get stats, containers recurse."""
        if is_tensor(value):
            if self.params_now() and is_parameter(value):
                return self.tensor_now(name, kind, value)
            return self.tensor(name, kind, value)
        if isinstance(value, (list, tuple)):
            return [self.value(f"{name}.{i}", kind, v) for i, v in enumerate(value)]
        if isinstance(value, dict):
            return {str(k): self.value(f"{name}.{k}", kind, v) for k, v in value.items()}
        if value is None:
            return None
        if isinstance(value, (bool, int, float, str)):
            return {"type": type(value).__name__, "value": value}
        return {"type": type(value).__name__}

    def values(self, prefix: str, kind: Kind, items: Any) -> list:
        if items is None:
            return []
        if not isinstance(items, (list, tuple)):
            items = (items,)
        return [self.value(f"{prefix}.{i}", kind, v) for i, v in enumerate(items)]

    def save_point(self, name: str, n: int, variable: Any, save_backward: bool) -> None:
        """msProbe's ``save``: ``{name}.{n}.debug`` for the value, ``{name}_grad.{n}.debug``
        for its gradient when it gets one."""
        key = f"{name}.{n}.debug"
        self.entries[key] = self.value(key, Kind.SAVED, variable)
        self.construct.setdefault(key, None)
        if not (save_backward and hasattr(variable, "register_hook")):
            return
        bkey = f"{name}_grad.{n}.debug"

        def record(grad):  # noqa: ANN001
            try:
                self.entries[bkey] = self.tensor(bkey, Kind.SAVED, grad)
                self.construct.setdefault(bkey, None)
            except Exception as exc:  # noqa: BLE001
                self.error(f"save {name} backward", exc)
        try:
            variable.register_hook(compile_guard.graph_safe_hook(record))
        except Exception:  # noqa: BLE001 - not in a graph: no gradient to save
            pass

    def _device_rows(self, pending: list[tuple]) -> dict[int, TensorStats]:
        """Float tensors that need no CRC and no file: stats on the device, one readback."""
        from rankscope.probe.tensors.stats import device_stats_batch, stats_from_device_row
        picked, meta = [], []
        for idx, (_name, _kind, value, crc, entry, known) in enumerate(pending):
            if known is not None or crc or (entry is not None and self.task == "tensor") or not is_tensor(value):
                continue
            try:
                dtype_name, shape = str(value.dtype), list(value.shape)
            except Exception:  # noqa: BLE001
                continue
            if dtype_name in _DEVICE_FLOATS and all(d > 0 for d in shape):  # empty: host path
                picked.append(idx)
                meta.append((value, dtype_name, shape))
        if not picked:
            return {}
        try:
            rows = device_stats_batch([m[0] for m in meta])
        except Exception as exc:  # noqa: BLE001 - fall back to the host path
            self.error("device-side stats", exc)
            return {}
        return {idx: stats_from_device_row(rows[i], meta[i][1], meta[i][2]) for i, idx in enumerate(picked)}

    def _save_tensor(self, name: str, value: Any) -> str | None:
        import numpy as np

        from rankscope.probe.tensors.stats import to_numpy
        arr, dtype_name = to_numpy(value)
        if dtype_name == "BFloat16":  # .npy has no bf16: store the exact float32 widening
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        try:
            return self._write_tensor(self.step, self.rank_label(), f"{name}.npy", arr)
        except Exception as exc:  # noqa: BLE001
            self.error(f"saving tensor {name}", exc)
            return None

    def put(self, name: str, entry: dict, parent: str | None = None, stack: bool = True) -> None:
        """Store one dump.json entry (merging into an existing one, e.g. param grads)."""
        old = self.entries.get(name)
        if old is None:
            self.entries[name] = entry
        else:
            old.update(entry)
        self.construct.setdefault(name, parent)
        if stack and name not in self.stacks:
            self.stacks[name] = self._stack()

    # ------------------------------------------------------------------ stacks
    def _stack(self) -> list[str]:
        """The user's call stack, formatted like msProbe, cached per call site chain."""
        frame = sys._getframe(2)  # noqa: SLF001 - cheap frame walk, no inspect.stack()
        frames = []
        while frame is not None and len(frames) < _MAX_STACK:
            path = frame.f_code.co_filename
            if not any(s in path for s in _SKIP_DIRS):
                frames.append((path, frame.f_lineno, frame.f_code.co_name))
            frame = frame.f_back
        key = tuple(frames)
        cached = self._stack_cache.get(key)
        if cached is None:
            cached = [f"File {p}, line {ln}, in {fn}, \n {linecache.getline(p, ln).strip()}"
                      for p, ln, fn in frames]
            if len(self._stack_cache) < 4096:
                self._stack_cache[key] = cached
        return cached

    # ------------------------------------------------------------------ errors
    def error(self, where: str, exc: BaseException) -> None:
        """A hook failed: count it, log it, carry on (the probe never breaks training)."""
        self.errors += 1
        if self._log_error is None:
            return
        try:
            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=4))
            self._log_error(self.step, self.rank_label(), f"{where}: {exc!r}\n{tb}")
        except Exception:  # noqa: BLE001
            pass

    # ------------------------------------------------------------------ step end
    def take(self) -> tuple[dict, dict, dict]:
        self.resolve()
        out = (self.entries, self.stacks, self.construct)
        self.entries, self.stacks, self.construct = {}, {}, {}
        self._in_scope = False  # a range never runs on into the next step
        self._unwanted = set()
        return out
