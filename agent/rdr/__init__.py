"""Running Data Recorder: the crash/diagnostic bundles of seeds/000, rebuilt in Python.

MindSpore 2.10 no longer has its own RDR, so rankscope keeps the same configuration
surface (``"rdr"`` in config.json, ``MS_RDR_*`` env vars) and writes
``<path>/rank_<id>/rdr/`` itself. Submodules, one job each:

- :mod:`rankscope.config.rdr`: resolve ``enable/mode/path`` (config wins over env).
- :mod:`rankscope.rdr.flight_recorder`: the last K steps in memory (a probe Sink).
- :mod:`rankscope.rdr.bundle`: write one bundle directory (atomic files, sha256 manifest).
- :mod:`rankscope.rdr.crash_hooks`: process hooks that write a bundle on abnormal (or any) end.
- :mod:`rankscope.rdr.transfer`: send/receive bundle files as BUNDLE_CHUNK bodies.

Nothing is imported here so ``import rankscope.config.rdr`` stays cheap.
"""
