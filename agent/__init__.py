"""rankscope: ``from rankscope import PrecisionDebugger, seed_all, MsprobeStep``.

This folder (``agent/`` in the source tree) is the ``rankscope`` package: everything that
runs on a training node. Its rooms:

- ``probe/``: inside each rank process (hooks, sentinels, the step gate, zero-code attach).
- ``client/``: the rank's connection to its node agent.
- ``dump/``: msProbe's on-disk dump format.
- ``rdr/``: crash bundles (the Running Data Recorder).
- ``node/``: the node agent daemon, one per host.
- ``wire/``: what every process speaks (records, protocol, sockets, path layout).
- ``files/``: files one process writes and another reads (kernel dump, replay files).
- ``text/``: how facts read to a person (rank lists, watch lines).
- ``config/``: config.json, one schema for every process.
- ``cli/``: the ``rankscope`` command.

The coordinator (``coordinator/`` in the source tree) installs as ``rankscope.coordinator``.
Exports resolve lazily (PEP 562), so importing ``rankscope.wire`` in the node agent or the
coordinator never imports MindSpore.
"""
from __future__ import annotations

from typing import Any

__all__ = ["PrecisionDebugger", "seed_all", "MsprobeStep", "StepCallback", "__version__"]

_EXPORTS = {
    "PrecisionDebugger": ("rankscope.probe.debugger", "PrecisionDebugger"),
    "seed_all": ("rankscope.probe.seed", "seed_all"),
    "MsprobeStep": ("rankscope.probe.callback", "MsprobeStep"),
    "StepCallback": ("rankscope.probe.callback", "MsprobeStep"),
}


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version
        try:
            value: Any = version("rankscope")
        except PackageNotFoundError:  # running from a source tree that was never installed
            value = "0+unknown"
    else:
        target = _EXPORTS.get(name)
        if target is None:
            raise AttributeError(f"module 'rankscope' has no attribute {name!r}")
        import importlib
        value = getattr(importlib.import_module(target[0]), target[1])
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
