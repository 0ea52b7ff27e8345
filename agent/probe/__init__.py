"""The in-rank probe: what runs inside every training or inference process.

- :mod:`.debugger`: ``PrecisionDebugger``, msProbe's API; every step leaves through it.
- :mod:`.gate`: pause / resume / step N / terminate at step boundaries.
- :mod:`.identity`, :mod:`.rank_env`: which rank this process is; :mod:`.seed`: ``seed_all``.
- :mod:`.callback`: the ``Model.train`` callback; :mod:`.token_range`: inference token capture.
- ``hooks/``: Cell and API hooks feeding the per-step record store (eager code).
- ``tensors/``: statistics of MindSpore tensors, waiting for the device, values on request.
- ``graph/``: compiled code (GRAPH mode, ``@jit``) and MindSpore's kernel dump.
- ``vitals/``: the default watch's sentinels and vital signs, and the budget they keep.
- ``rerun/``: an anomalous step re-run in the rank, or replayed elsewhere.
- ``attach/``: zero-code attach under ``rankscope launch``, inference workers included.
- ``comm/``: the layout the rank's groups show, its collectives, where it stands in them.

The probe never breaks training: every hook catches its own errors.
"""
