"""L0: cell-level hooks with msProbe's names.

``Cell.{path}.{Class}.forward.{n}`` (inputs, outputs, the cell's own parameters),
``Cell.{path}.{Class}.backward.{n}`` (grads of outputs as ``input``, grads of inputs as
``output``) and ``Cell.{path}.{Class}.parameters_grad.{n}``; ``Cell.{i}.`` prefixes the
path when a list of models is given. The root cell itself is not dumped (msProbe's rule).

Why these hook types: MindSpore's own Cell forward/backward hooks and Parameter grad
hooks cost next to nothing here, whereas msProbe inserts an extra CellBackwardHook op
per call. The price is that a backward hook does not know which forward call it
belongs to; backward runs in reverse, so the last unmatched forward call of the cell is
taken (exact for the usual chains; a cell called from independent branches may swap
indices).
"""
from __future__ import annotations

from typing import Any

from agent.hooks.recorder import Recorder
from agent.records import Kind


class CellHooks:
    """Attaches L0 hooks to one or more models and removes them again."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self._handles: list[Any] = []
        self._fwd_count: dict[str, int] = {}
        self._pending_bwd: dict[str, list[int]] = {}
        self._pgrad_count: dict[str, int] = {}
        self._pgrad_seen: dict[str, set[str]] = {}
        self._active: list[str] = []  # forward names of cells currently running (construct)
        self._param_stats: dict[int, Any] = {}  # id(param) -> stats, params are fixed in a step
        self.attached: set[int] = set()

    # ------------------------------------------------------------------ attach
    def attach(self, models: Any) -> None:
        roots = list(models) if isinstance(models, (list, tuple)) else [models]
        multi = isinstance(models, (list, tuple))
        for index, root in enumerate(roots):
            if id(root) in self.attached:
                continue
            self.attached.add(id(root))
            for path, cell in root.cells_and_names():
                if not path:
                    continue  # the input layer itself is not dumped
                prefix = f"Cell.{index}.{path}" if multi else f"Cell.{path}"
                self._attach_cell(f"{prefix}.{type(cell).__name__}", cell)

    def _attach_cell(self, prefix: str, cell: Any) -> None:
        self._handles.append(cell.register_forward_pre_hook(self._pre_hook(prefix)))
        self._handles.append(cell.register_forward_hook(self._fwd_hook(prefix), with_kwargs=True))
        self._handles.append(cell.register_backward_hook(self._bwd_hook(prefix)))
        for pname, param in getattr(cell, "_params", {}).items():
            if param is not None and getattr(param, "requires_grad", False):
                self._handles.append(param.register_hook(self._pgrad_hook(prefix, pname)))

    def detach(self) -> None:
        for h in self._handles:
            try:
                h.remove()
            except Exception:  # noqa: BLE001 - a handle whose cell is gone
                pass
        self._handles.clear()
        self.attached.clear()

    def new_step(self) -> None:
        self._fwd_count.clear()
        self._pending_bwd.clear()
        self._pgrad_count.clear()
        self._pgrad_seen.clear()
        self._active.clear()
        self._param_stats.clear()

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
                rec._pending_bwd.setdefault(prefix, []).append(int(name.rsplit(".", 1)[1]))
                if not r.wants(name) or not r.wants_io("forward", "input") and not r.wants_io("forward", "output"):
                    return None
                entry: dict[str, Any] = {"input_args": [], "input_kwargs": {}, "output": []}
                if r.wants_io("forward", "input"):
                    entry["input_args"] = r.values(f"{name}.input", Kind.FORWARD, args)
                    entry["input_kwargs"] = {k: r.value(f"{name}.input.{k}", Kind.FORWARD, v)
                                             for k, v in (kwargs or {}).items()}
                if r.wants_io("forward", "output"):
                    entry["output"] = r.values(f"{name}.output", Kind.FORWARD, output)
                params = getattr(cell, "_params", {})
                if params:
                    entry["parameters"] = {pn: rec._param_entry(f"{name}.parameters.{pn}", p)
                                           for pn, p in params.items() if p is not None}
                r.put(name, entry, parent)
            except Exception as exc:  # noqa: BLE001
                r.error(f"{prefix} forward hook", exc)
            return None
        return fwd_hook

    def _param_entry(self, name: str, param: Any) -> dict:
        return self.rec.tensor(name, Kind.PARAM, param)

    def _bwd_hook(self, prefix: str):
        rec = self

        def bwd_hook(cell, grad_input, grad_output):  # noqa: ANN001
            r = rec.rec
            try:
                if not r.dumping:
                    return None
                pending = rec._pending_bwd.get(prefix)
                n = pending.pop() if pending else 0
                name = f"{prefix}.backward.{n}"
                if not r.wants(name) or "backward" not in r._dirs:  # noqa: SLF001
                    return None
                entry: dict[str, Any] = {"input": [], "output": []}
                # msProbe: backward "input" is the grad of the forward output.
                if r.wants_io("backward", "input"):
                    entry["input"] = r.values(f"{name}.input", Kind.BACKWARD, grad_output)
                if r.wants_io("backward", "output"):
                    entry["output"] = r.values(f"{name}.output", Kind.BACKWARD, grad_input)
                fwd_parent = r.construct.get(f"{prefix}.forward.{n}")
                r.put(name, entry, fwd_parent.replace(".forward.", ".backward.") if fwd_parent else None)
            except Exception as exc:  # noqa: BLE001
                r.error(f"{prefix} backward hook", exc)
            return None
        return bwd_hook

    def _pgrad_hook(self, prefix: str, pname: str):
        rec = self

        def pgrad_hook(grad):  # noqa: ANN001
            r = rec.rec
            try:
                if not r.dumping:
                    return None
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
            return None  # never replace the gradient
        return pgrad_hook
