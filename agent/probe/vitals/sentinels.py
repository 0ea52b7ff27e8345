"""DP sentinels: the few records divergence hunting needs, cheap enough to keep always on.

- ``Sentinel.loss``: the loss returned by a ``value_and_grad`` function (or reported by
  the Model.train callback).
- ``Sentinel.grad_local.<param>``: every gradient entering ``nn.DistributedGradReducer``
  (a rank's own fault shows here before AllReduce spreads it); without a reducer, the
  gradients handed to the optimizer.
- ``Sentinel.grad_reduced.<param>``: the reducer's output, identical across replicas.
- ``Sentinel.param.<name>`` / ``Sentinel.opt_state.<name>``: CRC-32 + stats of every
  parameter and optimizer state when the optimizer is called, i.e. the values this step
  started from (nothing changes them between forward and the update).
- ``Sentinel.param_end.<name>``: the same once the optimizer is done. A parameter whose
  next step starts from another value was changed outside the optimizer.

That is the full tier (``cluster.watch: "full"``). The default tier records the same rows
at a bounded cost (rankscope.probe.vitals.vital): gradients with a norm and non-finite counts
from one pass, and weights, optimizer state and reduced gradients with a bit-exact
fingerprint instead of a CRC-32 of a copy, spread over steps when they do not fit.

Optimizers and reducers are Cells, so a forward(-pre) hook on the instance is enough;
instances are found through a constructor patch (while any debugger is attached) plus
one scan of live objects at attach time. ``mindspore.value_and_grad`` is patched to see
the loss, and it and ``mindspore.grad`` to tell autoattach which model is trained.
Only grad functions created after the patch are seen: the debugger attaches at
construction, which msProbe's usage places before the model and its grad function.
"""
from __future__ import annotations

import gc
import weakref
from typing import Any, Callable

from rankscope.probe.comm import layout_probe
from rankscope.probe.graph import compile_guard
from rankscope.probe.hooks.recorder import Recorder
from rankscope.probe.vitals.loss_scale import LossScales
from rankscope.probe.vitals.probe_clock import CLOCK
from rankscope.probe.vitals.sentinel_patches import _active, _install_patches, _patches, _reducer_names, _restore_patches
from rankscope.probe.comm.sync_tracker import SyncTracker
from rankscope.probe.vitals.vital import VitalSigns
from rankscope.wire.records import Kind


class Sentinels:
    def __init__(self, rec: Recorder, on_optimizer_done: Callable[[], None] | None = None) -> None:
        self.rec = rec
        #: Told when the gradient reducer's collective is entered and left.
        self.sync: SyncTracker | None = None
        self.enabled = False
        #: False (cluster.sentinels off): the hooks stay, only to read queued tensors
        #: before the optimizer changes parameters in place; nothing is recorded.
        self.record = True
        self.on_optimizer_done = on_optimizer_done  # autoattach: the optimizer call ends a step
        self._handles: list[Any] = []
        self._hooked: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self._reduced_this_step = False
        self.unreduced_steps = 0  # optimizer calls with no nn.DistributedGradReducer before them
        self._loss_recorded = False
        self._snapshot_taken = False
        self._layouts: "weakref.WeakKeyDictionary[Any, tuple]" = weakref.WeakKeyDictionary()
        #: Optimizers actually called: only these are snapshotted (an attach-time scan
        #: also finds abandoned ones that the garbage collector has not freed yet).
        self.stepping: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self.optimizers: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self.grad_fns_seen = 0
        #: Called with (fn, weights) when a value_and_grad/grad function is created:
        #: autoattach uses it to find the model.
        self.on_grad_fn: Callable[[Any, Any], None] | None = None
        #: Re-runs an anomalous value_and_grad call (rankscope.probe.rerun.rerun.Rerunner), or None.
        self.rerun: Any = None
        #: The job's loss scale (float16): one record a step, and the end of a step whose
        #: update was skipped for overflowed gradients (no optimizer call ends it).
        self.loss_scales = LossScales(rec, self._step_done)
        #: The default tier's rows (rankscope.probe.vitals.vital): fingerprints on rotation, one
        #: pass per gradient; None under ``cluster.watch: "full"`` (every tensor, every step).
        self.vital: VitalSigns | None = None

    # ------------------------------------------------------------------ attach
    def attach(self) -> None:
        from mindspore import nn
        self.enabled = True
        try:
            self.loss_scales.attach()
        except Exception as exc:  # noqa: BLE001 - the rest is watched as before
            self.rec.error("finding the loss scale", exc)
        if self not in _active:
            _active.append(self)
        if not _patches:
            _install_patches()
        for obj in gc.get_objects():  # instances created before we were attached
            try:
                if isinstance(obj, nn.Optimizer):
                    self._hook_optimizer(obj)
                elif isinstance(obj, nn.DistributedGradReducer):
                    self._hook_reducer(obj)
            except ReferenceError:
                continue  # a dead weakref.proxy met in the scan
            except Exception as exc:  # noqa: BLE001
                self.rec.error("sentinel attach", exc)

    def detach(self) -> None:
        self.enabled = False
        self.loss_scales.detach()
        for h in self._handles:
            try:
                h.remove()
            except Exception:  # noqa: BLE001
                pass
        self._handles.clear()
        self._hooked = weakref.WeakSet()
        if self in _active:
            _active.remove(self)
        if not _active:
            _restore_patches()

    def new_step(self) -> None:
        if self.vital is not None:
            self.vital.step_ended()
        self.loss_scales.new_step()
        self._reduced_this_step = False
        self._loss_recorded = False
        self._snapshot_taken = False
        self.rec.param_cache.clear()

    def snapshot(self, only: Any = None, state: bool = True) -> None:
        """PARAM + OPT_STATE rows (CRC-32 + stats) as the step starts.

        Taken at the first of: ``start()``, the root model's forward, the optimizer call
        (fallback). Reading a tensor drains MindSpore's queue; at step start the queue is
        (nearly) empty because loops read the loss at step end, whereas at the optimizer
        call it holds the whole backward. Parameter stats are kept for L0 to reuse.
        ``state=False``: parameters only, CRC-32 computed at once (compiled steps: the
        helper thread's copy and hand-off cost more than the checksum of a weight).
        """
        if not self.enabled or not self.record or (self._snapshot_taken and only is None):
            return
        if not any(True for _ in self.stepping):
            return  # no optimizer has run yet: the optimizer call takes the snapshot
        if only is None:
            self._snapshot_taken = True
        r = self.rec
        if self.vital is None:
            _drain(r)  # the vital signs wait themselves, and only when a piece is due
        state_rows = state
        r.resolve()  # keep record order: everything queued goes first
        for opt in [only] if only is not None else list(self.stepping):
            params, state = self._layout_of(opt)
            if self.vital is not None:
                self.vital.snapshot(opt, params, state, with_state=state_rows)
                continue
            for name, p in params:
                st = _stats_crc_later(p) if state_rows else _stats_crc_now(p)
                r.param_cache[id(p)] = st
                r.row_known(f"Sentinel.param.{name}", Kind.PARAM, st)
            for name, p in state if state_rows else ():
                r.row_known(f"Sentinel.opt_state.{name}", Kind.OPT_STATE, _stats_crc_later(p))

    def snapshot_end(self, only: Any = None, now: bool = False) -> None:
        """PARAM rows of the values the optimizer left (``now``: CRC-32 on this thread, as
        between compiled steps)."""
        if not self.enabled or not self.record:
            return
        r = self.rec
        if self.vital is None:
            # The vital signs wait only when a piece is due: a wait for the update on every
            # step would keep the next step's Python from running ahead of its kernels.
            _drain(r)
        for opt in [only] if only is not None else list(self.stepping):
            if self.vital is not None:
                self.vital.snapshot_end(opt, *self._layout_of(opt))
                continue
            for name, p in self._layout_of(opt)[0]:
                r.row_known(f"Sentinel.param_end.{name}", Kind.PARAM, _crc_only(p, now))

    def note_stepping(self, opt: Any) -> None:
        """An optimizer is being stepped: its parameters are what this rank trains (a layout
        fact, said again when they change)."""
        if opt not in self.stepping:
            self.stepping.add(opt)
            layout_probe.note_trained()

    def trained_shapes(self) -> list[str]:
        """``name:shape`` of every trained parameter: equal on the tensor-parallel shards of
        one stage (each holds a piece of the same weights), different between stages."""
        return [f"{name}:{tuple(getattr(p, 'shape', ()))}" for opt in list(self.stepping)
                for name, p in self._layout_of(opt)[0]]

    def _layout_of(self, opt: Any) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
        """(model parameters, optimizer state) as (name, tensor) pairs, cached: reading
        ``Parameter.name`` waits for MindSpore's pipeline, so names are read once, at a
        step start, never in the optimizer hook."""
        layout = self._layouts.get(opt)
        if layout is None:
            params = [(p.name, p) for p in getattr(opt, "parameters", ())]
            ids = {id(p) for _, p in params}
            state = [(n, p) for n, p in opt.parameters_and_names() if id(p) not in ids]
            layout = (params, state)
            self._layouts[opt] = layout
        return layout

    # ------------------------------------------------------------------ hooks
    def _hook_optimizer(self, opt: Any) -> None:
        if opt in self._hooked:
            return
        self._hooked.add(opt)
        self.optimizers.add(opt)
        self._handles.append(compile_guard.register(opt, self._optimizer_pre_hook, pre=True))
        self._handles.append(compile_guard.register(opt, self._optimizer_post_hook))

    def _hook_reducer(self, reducer: Any) -> None:
        if reducer in self._hooked:
            return
        self._hooked.add(reducer)
        # The ranks it averages over hold the same weights: the job's replicas.
        layout_probe.note_reducer(getattr(getattr(reducer, "allgather", None), "group", None))
        self._handles.append(compile_guard.register(reducer, self._reducer_pre_hook, pre=True))
        self._handles.append(compile_guard.register(reducer, self._reducer_hook))

    def record_loss(self, loss: Any) -> None:
        """For callers that see the loss directly (the Model.train callback)."""
        if self.enabled and self.record and loss is not None and not self._loss_recorded:
            try:
                self.rec.row("Sentinel.loss", Kind.LOSS, loss)
                self._loss_recorded = True
            except Exception as exc:  # noqa: BLE001
                self.rec.error("loss sentinel", exc)

    def _optimizer_pre_hook(self, opt: Any, args: tuple) -> None:
        if not self.enabled:
            return None
        with CLOCK:
            self._before_update(opt, args)
        return None

    def _before_update(self, opt: Any, args: tuple) -> None:
        r = self.rec
        try:
            if opt not in self.stepping:  # first call of this optimizer: snapshot it now
                self.note_stepping(opt)
                self.snapshot(only=opt)
                self._snapshot_taken = True
            elif self.record and not self._snapshot_taken:
                self.snapshot()  # nothing marked the step start: take it now
            if r.has_unread_params():
                r.resolve()  # the optimizer updates parameters in place next
            if not self._reduced_this_step:
                self.unreduced_steps += 1
            if self.record and not self._reduced_this_step and args:
                # fresh tensors the update does not touch: read at step end
                self._record_grads("Sentinel.grad_local", Kind.GRAD_LOCAL, args[0],
                                   [n for n, _ in self._layout_of(opt)[0]])
        except Exception as exc:  # noqa: BLE001
            r.error("optimizer sentinel", exc)

    def _optimizer_post_hook(self, opt: Any, args: tuple, output: Any) -> None:
        if self.enabled:
            with CLOCK:
                try:
                    self.snapshot_end(only=opt)
                except Exception as exc:  # noqa: BLE001
                    self.rec.error("step-end parameter sentinel", exc)
        self._step_done()
        return None

    def _step_done(self) -> None:
        """The step's update ran, or was skipped for overflowed gradients: it ends here."""
        if self.enabled and self.on_optimizer_done is not None:
            try:
                self.on_optimizer_done()
            except Exception as exc:  # noqa: BLE001 - RankscopeTerminated is raised elsewhere
                from rankscope.probe.gate import RankscopeTerminated
                if isinstance(exc, RankscopeTerminated):
                    raise
                self.rec.error("step end after optimizer", exc)

    def _reducer_pre_hook(self, reducer: Any, args: tuple) -> None:
        if self.enabled and self.sync is not None:
            self.sync.enter("AllReduce")
        return None

    def _reducer_hook(self, reducer: Any, args: tuple, output: Any) -> None:
        if self.enabled and self.sync is not None:
            self.sync.leave("AllReduce")
        if not self.enabled or not self.record:
            return None
        try:
            names = _reducer_names.get(reducer) or self._optimizer_names(len(output))
            self._record_grads("Sentinel.grad_local", Kind.GRAD_LOCAL, args[0] if args else (), names)
            self._record_grads("Sentinel.grad_reduced", Kind.GRAD_REDUCED, output, names)
            self._reduced_this_step = True
        except Exception as exc:  # noqa: BLE001
            self.rec.error("grad reducer sentinel", exc)
        return None

    def _optimizer_names(self, n: int) -> list[str]:
        for opt in self.optimizers:
            names = [name for name, _ in self._layout_of(opt)[0]]
            if len(names) == n:
                return names
        return [str(i) for i in range(n)]

    def _record_grads(self, prefix: str, kind: Kind, grads: Any, names: list[str]) -> None:
        if self.vital is not None:
            self.vital.grad_rows(prefix, kind, grads, names)
            return
        if not isinstance(grads, (tuple, list)):
            grads = (grads,)
        r = self.rec
        for i, g in enumerate(grads):
            pname = names[i] if i < len(names) else str(i)
            r.row(f"{prefix}.{pname}", kind, g, crc=kind is Kind.GRAD_REDUCED)


def _drain(rec: Recorder) -> None:
    """Parameters and optimizer state are read only once MindSpore has finished writing them."""
    from rankscope.probe.tensors.stats import wait_for_device
    try:
        wait_for_device()
    except Exception as exc:  # noqa: BLE001 - read as it is; the verdict may then be wrong, said here
        rec.error("waiting for MindSpore before reading the parameters", exc)


def _stats_crc_later(p: Any) -> Any:
    """Stats now (cheap), CRC-32 on the helper thread (see crc32_later), both of one private
    copy: a CPU tensor's host array is the tensor's own memory, so stats and checksum read
    from it at two moments could describe two different contents."""
    import numpy as np

    from rankscope.probe.tensors.stats import array_stats, crc32_later, to_numpy
    arr, dtype_name = to_numpy(p)
    copy = np.array(arr, copy=True, order="C")
    st = array_stats(copy, dtype_name)
    st.crc = crc32_later(copy, private=True)
    return st


def _crc_only(p: Any, now: bool) -> Any:
    """A parameter's CRC-32 and nothing else (what the end-of-step record is compared by):
    half of what the step-start snapshot costs; ``now``: on this thread."""
    from rankscope.probe.tensors.stats import TensorStats, crc32_later, crc32_of, to_numpy
    arr, dtype_name = to_numpy(p)
    return TensorStats(dtype_name, list(arr.shape), None, None, None, None, 0, 0, int(arr.size),
                       crc32_of(arr) if now else crc32_later(arr))


def _stats_crc_now(p: Any) -> Any:
    from rankscope.probe.tensors.stats import array_stats, to_numpy
    arr, dtype_name = to_numpy(p)
    return array_stats(arr, dtype_name, crc=True)
