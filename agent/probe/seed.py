"""seed_all: msProbe's randomness switch (seeds/001 "seed_all").

Fixes Python ``random``, ``PYTHONHASHSEED`` (for child processes: an interpreter's
own hash seed is fixed at start-up), NumPy, ``mindspore.set_seed`` and the dataset
pipeline's seed; with
``mode=True`` turns on deterministic kernels and deterministic HCCL reductions; with
``rm_dropout=True`` makes every dropout created afterwards an identity.

Dropout is disabled by patching the classes' ``__init__`` in place rather than by
swapping module attributes (msProbe's way): a script that did
``from mindspore.nn import Dropout`` before calling seed_all holds the class object
itself, and only an in-place patch reaches it. Functional dropouts can only be
replaced where they are looked up, so a name bound before seed_all keeps working.
"""
from __future__ import annotations

import functools
import inspect
import logging
import os
import random
from typing import Any, Callable

import numpy as np

MAX_SEED = 2**32 - 1  # msProbe's MAX_SEED_VALUE; also NumPy's legacy seed bound

# (module path, class name) of every dropout layer/primitive; (arg, neutral value).
_DROPOUT_CLASSES = (
    ("mindspore.nn", "Dropout"), ("mindspore.nn", "Dropout1d"), ("mindspore.nn", "Dropout2d"),
    ("mindspore.nn", "Dropout3d"), ("mindspore.nn", "DropoutExt"), ("mindspore.nn", "Dropout2dExt"),
    ("mindspore.mint.nn", "Dropout"), ("mindspore.mint.nn", "Dropout2d"),
    ("mindspore.ops", "Dropout"), ("mindspore.ops", "Dropout2D"), ("mindspore.ops", "Dropout3D"),
)
_NEUTRAL_ARGS = {"p": 0.0, "keep_prob": 1.0}
_DROPOUT_FUNCS = (
    ("mindspore.ops", "dropout"), ("mindspore.ops", "dropout1d"), ("mindspore.ops", "dropout2d"),
    ("mindspore.ops", "dropout3d"), ("mindspore.mint.nn.functional", "dropout"),
    ("mindspore.mint.nn.functional", "dropout2d"),
)
# Modules whose attributes may alias a dropout function (the same object re-exported).
_FUNC_HOMES = ("mindspore.ops", "mindspore.ops.function", "mindspore.ops.function.nn_func",
               "mindspore.mint.nn.functional", "mindspore.nn.functional", "mindspore.mint")

# Originals, so restore_dropout() can undo the patch (tests; a debugger that detaches).
_patched_inits: dict[type, Callable] = {}
_patched_funcs: list[tuple[Any, str, Callable]] = []


def seed_all(seed: int = 1234, mode: bool = False, rm_dropout: bool = False) -> None:
    """msProbe's ``seed_all(seed=1234, mode=False, rm_dropout=False)``."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"seed = {seed!r}: expected an integer in [0, {MAX_SEED}]")
    if not isinstance(mode, bool):
        raise ValueError(f"mode = {mode!r}: expected True or False")
    if not isinstance(rm_dropout, bool):
        raise ValueError(f"rm_dropout = {rm_dropout!r}: expected True or False")
    import mindspore as ms

    os.environ["PYTHONHASHSEED"] = str(seed)
    random.seed(seed)
    np.random.seed(seed)
    ms.set_seed(seed)
    # Beyond msProbe: the dataset pipeline (shuffle, random augmentations) has its own
    # seed; without it two seeded Model.train runs still see batches in another order.
    try:
        import mindspore.dataset as ds
        ds.config.set_seed(seed)
    except Exception:  # noqa: BLE001 - a build without the dataset module
        pass
    if mode:
        _enable_deterministic(ms)
    # mode=False leaves determinism alone (msProbe switches it OFF): MindSpore lets a
    # process configure it only once, so an OFF here would lock out a later enable.
    if rm_dropout:
        remove_dropout()


def _enable_deterministic(ms: Any) -> None:
    try:
        from mindspore.device_manager import DeviceManagerConf
        configured = DeviceManagerConf.get_instance().is_deterministic_configured()
    except (ImportError, AttributeError):  # MindSpore before set_deterministic existed
        configured = True  # -> the set_context route below
    if not configured:
        ms.set_deterministic(True)  # also sets HCCL_DETERMINISTIC=true (keeps "strict")
    elif ms.get_context("deterministic") != "ON":
        # Someone configured it OFF already and set_deterministic refuses a second call;
        # try msProbe's route, and say so if MindSpore ignores it too.
        try:
            ms.set_context(deterministic="ON")
        except Exception:  # noqa: BLE001
            pass
        if ms.get_context("deterministic") != "ON":
            logging.getLogger("rankscope").warning(
                "seed_all(mode=True): deterministic computing was already configured OFF in this "
                "process and MindSpore allows setting it once; kernels stay non-deterministic")
    # HCCL makes AllReduce/ReduceScatter/Reduce deterministic on Ascend; "strict" is stronger.
    if os.environ.get("HCCL_DETERMINISTIC") != "strict":
        os.environ["HCCL_DETERMINISTIC"] = "true"


def _neutral_init(orig: Callable) -> Callable:
    sig = inspect.signature(orig)
    # nn.Dropout takes keep_prob or p and p wins; setting only p avoids its
    # keep_prob deprecation warning. Primitives only have keep_prob.
    names = ["p"] if "p" in sig.parameters else [n for n in ("keep_prob",) if n in sig.parameters]

    @functools.wraps(orig)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        bound = sig.bind(self, *args, **kwargs)
        for name in names:
            bound.arguments[name] = _NEUTRAL_ARGS[name]
        orig(*bound.args, **bound.kwargs)

    __init__.__rankscope_neutral__ = True  # type: ignore[attr-defined]
    return __init__


def _identity_dropout(orig: Callable) -> Callable:
    @functools.wraps(orig)
    def dropout(input: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: A002 - MindSpore's name
        return input

    dropout.__rankscope_neutral__ = True  # type: ignore[attr-defined]
    return dropout


def remove_dropout() -> None:
    """Make dropout layers created from now on, and functional dropouts, identities."""
    import importlib

    for mod_name, cls_name in _DROPOUT_CLASSES:
        try:
            cls = getattr(importlib.import_module(mod_name), cls_name)
        except (ImportError, AttributeError):
            continue  # not in this MindSpore version
        init = cls.__dict__.get("__init__")
        if init is None or cls in _patched_inits or getattr(init, "__rankscope_neutral__", False):
            continue
        _patched_inits[cls] = init
        cls.__init__ = _neutral_init(init)

    originals = []
    for mod_name, fn_name in _DROPOUT_FUNCS:
        try:
            fn = getattr(importlib.import_module(mod_name), fn_name)
        except (ImportError, AttributeError):
            continue
        if not getattr(fn, "__rankscope_neutral__", False):
            originals.append(fn)
    for home in _FUNC_HOMES:
        try:
            mod = importlib.import_module(home)
        except ImportError:
            continue
        for attr, value in list(vars(mod).items()):
            if any(value is fn for fn in originals):
                _patched_funcs.append((mod, attr, value))
                setattr(mod, attr, _identity_dropout(value))


def restore_dropout() -> None:
    """Undo :func:`remove_dropout` (layers created meanwhile stay identities)."""
    for cls, init in _patched_inits.items():
        cls.__init__ = init
    _patched_inits.clear()
    for mod, attr, value in reversed(_patched_funcs):
        setattr(mod, attr, value)
    _patched_funcs.clear()
