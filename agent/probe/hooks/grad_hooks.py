"""The backward half of L0/L1 records: tensor-level grad hooks on each recorded call's
inputs and outputs, registered in one batch after the root forward and removed once
the step is over (a mixin of :class:`~rankscope.probe.hooks.recorder.Recorder`, whose
record store they fill)."""
from __future__ import annotations

from typing import Any, Callable

from rankscope.probe.graph import compile_guard
from rankscope.wire.records import Kind


class GradHooks:
    """Needs the recorder's ``queued_hooks``, ``_step_hooks``, ``entries``, ``dumping``,
    ``wants``/``wants_io``, ``put``, ``tensor`` and ``error``."""

    queued_hooks: list[tuple[Any, Any]] | None
    _step_hooks: list[Any]

    def hook_grads(self, fwd_name: str, parent: str | None, args: Any, output: Any) -> None:
        """Tensor-level grad hooks on a call's outputs (backward ``input``) and inputs
        (backward ``output``), filling ``{name}.backward.{n}`` as gradients arrive.

        Why not Cell.register_backward_hook: it inserts a CellBackwardHook op per call and
        costs ~50% of the step on the MLP bench; tensor hooks cost next to nothing, and
        the forward call index is known here, so backward.{n} pairs with forward.{n}
        exactly. Caveat: a tensor's grad is its total grad, so for an input that also
        feeds other cells (a residual), "output" includes their share too.
        """
        # Cell names carry the index after the direction, API names before it
        if fwd_name.endswith(".forward"):
            bname = fwd_name[: -len("forward")] + "backward"
        else:
            bname = fwd_name.replace(".forward.", ".backward.")
        bparent = parent.replace(".forward.", ".backward.") if parent else None
        outs = output if isinstance(output, (tuple, list)) else (output,)
        ins = args if isinstance(args, (tuple, list)) else (args,)
        r = self
        for io, tensors, want in (("input", outs, r.wants_io("backward", "input")),
                                  ("output", ins, r.wants_io("backward", "output"))):
            if not want:
                continue
            for i, t in enumerate(tensors):
                reg = getattr(t, "register_hook", None)
                if reg is None or getattr(t, "asnumpy", None) is None:
                    continue
                hook = self._grad_hook(bname, bparent, io, i, len(tensors))
                if self.queued_hooks is not None:
                    self.queued_hooks.append((reg, hook))
                    continue
                try:
                    self._step_hooks.append(reg(compile_guard.graph_safe_hook(hook)))
                except Exception:  # noqa: BLE001 - a tensor outside autograd: nothing to record
                    pass

    def register_queued_hooks(self) -> None:
        """One hook per tensor, calling every record's hook on it (a cell's output is the
        next cell's input): MindSpore keeps memory for each further hook on one tensor
        for the life of the process, ~70 B a registration."""
        queued, self.queued_hooks = self.queued_hooks or [], None
        per_tensor: dict[int, tuple[Any, list]] = {}
        for reg, hook in queued:
            per_tensor.setdefault(id(getattr(reg, "__self__", reg)), (reg, []))[1].append(hook)
        for reg, hooks in per_tensor.values():
            try:
                # Graph-safe only here, where a hook meets a tensor: one per tensor, not per record.
                self._step_hooks.append(reg(compile_guard.graph_safe_hook(hooks[0] if len(hooks) == 1 else
                                                                          _fan_out(hooks))))
            except Exception:  # noqa: BLE001 - a tensor outside autograd: nothing to record
                pass

    def drop_step_hooks(self) -> None:
        """Remove the step's tensor hooks once its backward is over: a tensor that outlives
        the step (an input built once and fed every step) would gather one per step, each
        called by every later backward."""
        hooks, self._step_hooks = self._step_hooks, []
        for h in hooks:
            try:
                h.remove()
            except Exception:  # noqa: BLE001 - a handle whose tensor is gone
                pass

    def _grad_hook(self, bname: str, bparent: str | None, io: str, i: int, n: int) -> Callable[[Any], None]:
        """What one record does with a gradient (its own errors caught and logged); made
        graph-safe where it is registered."""
        r = self

        def record(grad):  # noqa: ANN001
            try:
                if not r.dumping:
                    return
                entry = r.entries.get(bname)
                if entry is None:
                    if bname in r._unwanted or not r.wants(bname):
                        r._unwanted.add(bname)  # its other gradients are not asked again
                        return
                    entry = {"input": [], "output": []}
                    r.put(bname, entry, bparent)
                slots = entry[io]
                if len(slots) < n:
                    slots.extend([None] * (n - len(slots)))
                slots[i] = r.tensor(f"{bname}.{io}.{i}", Kind.BACKWARD, grad)
            except Exception as exc:  # noqa: BLE001
                r.error(f"{bname} grad hook", exc)
        return record


def _fan_out(hooks: list) -> Callable[[Any], None]:
    def record(grad):  # noqa: ANN001
        for hook in hooks:
            hook(grad)
    return record
