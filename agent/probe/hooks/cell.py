"""L0: cell-level hooks with msProbe's names.

``Cell.{path}.{Class}.forward.{n}`` (inputs, outputs, the cell's own parameters),
``Cell.{path}.{Class}.backward.{n}`` (grads of outputs as ``input``, grads of inputs as
``output``) and ``Cell.{path}.{Class}.parameters_grad.{n}``; ``Cell.{i}.`` prefixes the
path when a list of models is given. The root cell itself is not dumped (msProbe's rule).

Why these hook types: Cell forward(-pre) hooks plus tensor-level grad hooks registered
on each call's outputs/inputs (and on parameters) cost next to nothing here, whereas a
Cell backward hook (or msProbe's per-call CellBackwardHook op) roughly doubles the cost
of a PyNative step. See :meth:`Recorder.hook_grads`.
"""
from __future__ import annotations

from typing import Any

from rankscope.probe.graph import compile_guard
from rankscope.probe.hooks.recorder import Recorder
from rankscope.wire.records import Kind


class CellHooks:
    """Attaches L0 hooks to one or more models and removes them again."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self._handles: list[Any] = []
        self._fwd_count: dict[str, int] = {}
        self._pgrad_count: dict[str, int] = {}
        self._pgrad_seen: dict[str, set[str]] = {}
        self._active: list[str] = []  # forward names of cells currently running (construct)
        self._root_depth = 0
        self.attached: set[int] = set()
        #: What attach() was given, in order: what resume() attaches again.
        self._given: list[Any] = []
        #: True while the hooks are taken off to save their cost (rankscope.probe.vitals.cell_plan).
        self.suspended = False
        #: Each hooked Cell by its record prefix (``Cell.{path}.{Class}``): what a record's
        #: name leads back to (a re-run watches the Cell a forward NaN came from).
        self.by_prefix: dict[str, Any] = {}

    # ------------------------------------------------------------------ attach
    def attach(self, models: Any) -> None:
        if self.suspended:  # remembered; attached when the hooks are resumed
            if not any(m is models for m in self._given):
                self._given.append(models)
            return
        if not any(m is models for m in self._given):
            self._given.append(models)
        roots = list(models) if isinstance(models, (list, tuple)) else [models]
        multi = isinstance(models, (list, tuple))
        for index, root in enumerate(roots):
            if id(root) in self.attached:
                continue
            self.attached.add(id(root))
            self._handles.append(compile_guard.register(root, self._root_pre, pre=True))
            self._handles.append(compile_guard.register(root, self._root_post, always_call=True))
            for path, cell in root.cells_and_names():
                if not path:
                    continue  # the input layer itself is not dumped
                prefix = f"Cell.{index}.{path}" if multi else f"Cell.{path}"
                self._attach_cell(f"{prefix}.{type(cell).__name__}", cell)

    def _root_pre(self, cell: Any, args: tuple) -> None:
        self._root_depth += 1
        if self._root_depth == 1 and self.rec.on_step_start is not None:
            try:
                self.rec.on_step_start()
            except Exception as exc:  # noqa: BLE001
                self.rec.error("step-start snapshot", exc)
        if self._root_depth == 1 and self.rec.dumping and self.rec.queued_hooks is None:
            self.rec.queued_hooks = []
        return None

    def _root_post(self, cell: Any, args: tuple, output: Any) -> None:
        self._root_depth = max(0, self._root_depth - 1)
        if self._root_depth == 0 and self.rec.queued_hooks is not None:
            try:
                self.rec.register_queued_hooks()  # before backward starts
            except Exception as exc:  # noqa: BLE001
                self.rec.error("registering grad hooks", exc)
        return None

    def cell_of(self, record: str) -> Any:
        """The Cell a forward record of this process names, or None."""
        at = record.find(".forward.")
        return self.by_prefix.get(record[:at]) if at > 0 else None

    def _attach_cell(self, prefix: str, cell: Any) -> None:
        self.by_prefix[prefix] = cell
        self._handles.append(compile_guard.register(cell, self._pre_hook(prefix), pre=True))
        self._handles.append(compile_guard.register(cell, self._fwd_hook(prefix), with_kwargs=True))
        for pname, param in getattr(cell, "_params", {}).items():
            if param is not None and getattr(param, "requires_grad", False):
                self._handles.append(compile_guard.register_tensor_hook(param, self._pgrad_hook(prefix, pname)))

    def suspend(self) -> None:
        """Take every hook off, keeping what to attach again (:meth:`resume`)."""
        if not self.suspended:
            self._remove()
            self.suspended = True

    def resume(self) -> None:
        if self.suspended:
            self.suspended = False
            for models in list(self._given):
                self.attach(models)

    def detach(self) -> None:
        self._remove()
        self._given.clear()
        self.suspended = False

    def _remove(self) -> None:
        for h in self._handles:
            try:
                h.remove()
            except Exception:  # noqa: BLE001 - a handle whose cell is gone
                pass
        self._handles.clear()
        self.attached.clear()

    def new_step(self) -> None:
        self._fwd_count.clear()
        self._pgrad_count.clear()
        self._pgrad_seen.clear()
        self._active.clear()
        self._root_depth = 0
        self.rec.queued_hooks = None
        self.rec.drop_step_hooks()

    # ------------------------------------------------------------------ hooks
    def _pre_hook(self, prefix: str):
        rec = self

        def pre_hook(cell, args):  # noqa: ANN001
            try:
                if rec.rec.dumping:
                    n = rec._fwd_count.get(prefix, 0)
                    rec._fwd_count[prefix] = n + 1
                    rec._active.append(f"{prefix}.forward.{n}")
            except Exception as exc:  # noqa: BLE001
                rec.rec.error(f"{prefix} forward pre-hook", exc)
            return None
        return pre_hook

    def _fwd_hook(self, prefix: str):
        rec = self

        def fwd_hook(cell, args, kwargs, output):  # noqa: ANN001
            r = rec.rec
            try:
                if not r.dumping or not rec._active:
                    return None
                name = rec._active.pop()
                parent = rec._active[-1] if rec._active else None
                if r.wants(name) and (r.wants_io("forward", "input") or r.wants_io("forward", "output")):
                    entry: dict[str, Any] = {"input_args": [], "input_kwargs": {}, "output": []}
                    if r.wants_io("forward", "input"):
                        entry["input_args"] = r.values(f"{name}.input", Kind.FORWARD, args)
                        entry["input_kwargs"] = {k: r.value(f"{name}.input.{k}", Kind.FORWARD, v)
                                                 for k, v in (kwargs or {}).items()}
                    if r.wants_io("forward", "output"):
                        entry["output"] = r.values(f"{name}.output", Kind.FORWARD, output)
                    params = getattr(cell, "_params", {})
                    if params and not (r.lean_cells and not r.params_now()):
                        entry["parameters"] = {pn: rec._param_entry(f"{name}.parameters.{pn}", p)
                                               for pn, p in params.items() if p is not None}
                    r.put(name, entry, parent)
                # Whether its backward is wanted is asked when that is recorded (the filters
                # follow the order records are made in), so the hooks go on regardless.
                if "backward" in r._dirs:  # noqa: SLF001
                    r.hook_grads(name, parent, args, output)
            except Exception as exc:  # noqa: BLE001
                r.error(f"{prefix} forward hook", exc)
            return None
        return fwd_hook

    def _param_entry(self, name: str, param: Any) -> dict:
        cached = self.rec.param_cache.get(id(param)) if self.rec.task != "tensor" else None
        if cached is not None:  # read at step start; the forward uses the same values
            return self.rec.known(name, Kind.PARAM, cached)
        # A parameter no gradient trains is not kept equal by data parallelism: BatchNorm's
        # moving mean and variance are updated in each rank's forward from its own batch.
        # Recorded as what the forward produced, not as a replicated weight, or every
        # data-parallel CNN would be a replica split at step 0.
        kind = Kind.PARAM if getattr(param, "requires_grad", True) else Kind.FORWARD
        if self.rec.params_now():
            return self.rec.tensor_now(name, kind, param)
        return self.rec.tensor(name, kind, param)

    def _pgrad_hook(self, prefix: str, pname: str):
        rec = self

        def record(grad):  # noqa: ANN001
            r = rec.rec
            try:
                if not r.dumping or (r.lean_cells and not r.params_now()):
                    return
                seen = rec._pgrad_seen.setdefault(prefix, set())
                if pname in seen:  # a second gradient computation for this cell
                    rec._pgrad_count[prefix] = rec._pgrad_count.get(prefix, 0) + 1
                    seen.clear()
                seen.add(pname)
                name = f"{prefix}.parameters_grad.{rec._pgrad_count.get(prefix, 0)}"
                if r.wants(name) and r.wants_io("backward", "output"):
                    r.put(name, {pname: [r.tensor(f"{name}.{pname}", Kind.GRAD_LOCAL, grad)]})
            except Exception as exc:  # noqa: BLE001
                r.error(f"{prefix}.{pname} parameter grad hook", exc)
        return compile_guard.graph_safe_hook(record)
