"""The in-rank probe: what runs inside every training or inference process.

- :mod:`.debugger`: ``PrecisionDebugger``, msProbe's API; every step leaves through it.
- :mod:`.autoattach` (+ :mod:`.handover`): zero-code attach under ``rankscope launch``.
- :mod:`.hooks`: Cell and API hooks feeding the per-step record store.
- :mod:`.sentinels`: the always-on DP records (loss, local/reduced grads, params).
- :mod:`.stats`: tensor statistics; :mod:`.token_range`: inference token capture.
- :mod:`.gate`: pause / resume / step N / terminate at step boundaries.
- :mod:`.identity`: which rank this process is; :mod:`.seed`: ``seed_all``.
- :mod:`.callback`: the ``Model.train`` callback.

The probe never breaks training: every hook catches its own errors.
"""
