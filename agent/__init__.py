"""rankscope's in-rank probe: ``from agent import PrecisionDebugger, seed_all, MsprobeStep``.

Exports resolve lazily (PEP 562) so ``import agent`` (and ``agent.protocol`` in the node
agent and coordinator) never imports MindSpore or the hooks.
"""
from __future__ import annotations

from typing import Any

__all__ = ["PrecisionDebugger", "seed_all", "MsprobeStep", "StepCallback"]

_EXPORTS = {
    "PrecisionDebugger": ("agent.debugger", "PrecisionDebugger"),
    "seed_all": ("agent.seed", "seed_all"),
    "MsprobeStep": ("agent.callback", "MsprobeStep"),
    "StepCallback": ("agent.callback", "MsprobeStep"),
}


def __getattr__(name: str) -> Any:
    target = _EXPORTS.get(name)
    if target is None:
        raise AttributeError(f"module 'agent' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(target[0]), target[1])
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
