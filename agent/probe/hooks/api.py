"""L1: wrap MindSpore APIs so each call is recorded as ``{Prefix}.{api}.{n}.forward``.

Prefixes are msProbe's: Functional (mindspore.ops), Mint, MintFunctional, Tensor,
Primitive, Distributed (communication.comm_func), MintDistributed. The backward entry
``{Prefix}.{api}.{n}.backward`` holds the gradient of the output (``input``), taken
with a tensor hook registered on the output. Calls made from inside a wrapped API are
not recorded again (msProbe records the outermost API only). A function imported by
name before the wrap (``from mindspore.ops import relu``) is not seen: same as msProbe.
"""
from __future__ import annotations

import functools
import importlib
from typing import Any, Callable

from rankscope.probe.graph import compile_guard
from rankscope.probe.hooks.recorder import Recorder
from rankscope.wire.records import Kind

#: prefix -> (module path, API names). The common ops the issue asks for + collectives.
API_TABLE: dict[str, tuple[str, tuple[str, ...]]] = {
    "Functional": ("mindspore.ops", (
        "matmul", "add", "sub", "mul", "div", "relu", "gelu", "silu", "sigmoid", "tanh", "softmax",
        "log_softmax", "layer_norm", "dense", "bmm", "exp", "log", "sqrt", "square", "sum", "mean",
        "cross_entropy", "mse_loss", "dropout", "concat", "transpose", "reshape")),
    "Mint": ("mindspore.mint", ("matmul", "add", "sub", "mul", "div", "bmm", "exp", "sum", "mean",
                                "softmax", "cat", "sqrt")),
    "MintFunctional": ("mindspore.mint.nn.functional", (
        "relu", "gelu", "silu", "softmax", "layer_norm", "linear", "dropout", "cross_entropy")),
    "Distributed": ("mindspore.communication.comm_func", (
        "all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast", "all_to_all_single")),
    "MintDistributed": ("mindspore.mint.distributed", (
        "all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
        "broadcast")),
}
TENSOR_METHODS = ("__add__", "__radd__", "__sub__", "__mul__", "__rmul__", "__truediv__", "__matmul__",
                  "matmul", "add", "mul", "relu", "softmax", "sum", "mean")
#: Primitive classes (mindspore.ops.operations) whose __call__ is wrapped; nn.Dense,
#: nn.ReLU and DistributedGradReducer run through these.
PRIMITIVES = ("MatMul", "BatchMatMul", "BiasAdd", "ReLU", "Softmax", "LayerNorm", "Add", "Mul",
              "AllReduce", "AllGather", "ReduceScatter", "Broadcast")


class ApiHooks:
    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.depth = 0
        self._count: dict[str, int] = {}
        self._patches: dict[tuple[int, str], tuple[Any, str, Any, bool]] = {}
        self.active = False
        #: id of a primitive a Cell holds -> its attribute name there: msProbe names a
        #: primitive call ``Primitive.<attribute>.<Class>`` (nn.Dense's ``bias_add``).
        self.prim_names: dict[int, str] = {}
        self._named: set[int] = set()

    def name_primitives(self, models: Any) -> None:
        for root in models if isinstance(models, (list, tuple)) else [models]:
            for _path, cell in root.cells_and_names():
                for attr, prim in (getattr(cell, "_primitives", None) or {}).items():
                    if prim is not None:
                        self.prim_names.setdefault(id(prim), attr)

    # ------------------------------------------------------------------ wrap
    def attach(self, model: Any = None) -> None:
        """Wrap the APIs (and, given the model, the primitives its Cells call) once; name
        the primitives of each model it is given."""
        if model is not None and id(model) not in self._named:
            self._named.add(id(model))
            self.name_primitives(model)
        primitives = model is not None
        self.active = True
        if self._patches:
            return
        for prefix, (module_path, names) in API_TABLE.items():
            try:
                module = importlib.import_module(module_path)
            except Exception:  # noqa: BLE001 - module absent in this MindSpore build
                continue
            for api in names:
                self.wrap(module, api, prefix)
        import mindspore as ms
        for api in TENSOR_METHODS:
            self.wrap(ms.Tensor, api, "Tensor")
        if primitives:
            from mindspore.ops import operations as P
            for cls_name in PRIMITIVES:
                cls = getattr(P, cls_name, None)
                if cls is not None:
                    self._wrap_primitive(cls)

    def wrap(self, owner: Any, api: str, prefix: str) -> bool:
        """Wrap ``owner.api`` (a module function or a class attribute); False if absent."""
        key = (id(owner), api)
        if key in self._patches:
            return True
        orig = getattr(owner, api, None)
        if orig is None or not callable(orig):
            return False
        own = api in getattr(owner, "__dict__", {})
        self._patches[key] = (owner, api, orig, own)
        wrapper = self._wrapper(orig, f"{prefix}.{api}")
        setattr(owner, api, wrapper)
        compile_guard.api_wrapped(owner, api, wrapper, orig)
        return True

    def _wrap_primitive(self, cls: type) -> None:
        key = (id(cls), "__call__")
        if key in self._patches:
            return
        orig = cls.__call__
        self._patches[key] = (cls, "__call__", orig, "__call__" in cls.__dict__)
        base = self._wrapper(orig, f"Primitive.{cls.__name__.lower()}.{cls.__name__}")
        cls.__call__ = base
        compile_guard.api_wrapped(cls, "__call__", base, orig)

    def restore(self, owner: Any, api: str) -> bool:
        entry = self._patches.pop((id(owner), api), None)
        if entry is None:
            return False
        owner, api, orig, own = entry
        compile_guard.api_restored(owner, api)
        if own or not isinstance(owner, type):
            setattr(owner, api, orig)
        else:
            try:
                delattr(owner, api)  # inherited before: expose the base class's again
            except AttributeError:
                setattr(owner, api, orig)
        return True

    def detach(self) -> None:
        self.active = False
        for owner, api, _orig, _own in list(self._patches.values()):
            self.restore(owner, api)

    def new_step(self) -> None:
        self._count.clear()

    # ------------------------------------------------------------------ record
    def _wrapper(self, orig: Callable, api_name: str) -> Callable:
        hooks = self

        @functools.wraps(orig)
        def wrapper(*args, **kwargs):  # noqa: ANN002
            if not hooks.active or hooks.depth or not hooks.rec.dumping:
                return orig(*args, **kwargs)
            hooks.depth += 1
            try:
                out = orig(*args, **kwargs)
            finally:
                hooks.depth -= 1
            hooks._record(api_name, args, kwargs, out)
            return out

        wrapper._rankscope_orig = orig  # type: ignore[attr-defined]
        return wrapper

    def _record(self, api_name: str, args: tuple, kwargs: dict, out: Any) -> None:
        r = self.rec
        hooks = self
        try:
            if api_name.startswith("Primitive.") and args:
                attr = self.prim_names.get(id(args[0]))
                if attr is not None:
                    api_name = f"Primitive.{attr}.{api_name.rsplit('.', 1)[-1]}"
                args = args[1:]  # drop the primitive instance (self)
            n = self._count.get(api_name, 0)
            self._count[api_name] = n + 1
            name = f"{api_name}.{n}.forward"
            hooks.depth += 1  # stats never call MindSpore, but be safe against re-entry
            try:
                if r.wants(name) and (r.wants_io("forward", "input") or r.wants_io("forward", "output")):
                    r.put(name, {"input_args": r.values(f"{name}.input", Kind.FORWARD, args)
                                 if r.wants_io("forward", "input") else [],
                                 "input_kwargs": {k: r.value(f"{name}.input.{k}", Kind.FORWARD, v)
                                                  for k, v in kwargs.items()} if r.wants_io("forward", "input") else {},
                                 "output": r.values(f"{name}.output", Kind.FORWARD, out)
                                 if r.wants_io("forward", "output") else []})
            finally:
                hooks.depth -= 1
            if "backward" in r._dirs:  # noqa: SLF001 - the backward entry asks wants() when it is made
                r.hook_grads(name, None, args, out)
        except Exception as exc:  # noqa: BLE001
            r.error(f"{api_name} API hook", exc)
