"""The coordinator's decisions in plain Python + NumPy (no Ray, no sockets).

:class:`~rankscope.coordinator.logic.core.CoordinatorCore` is the entry point; the Ray actor
(coordinator/actor.py) and its ZeroMQ front end feed it and carry out its actions.
Its rooms: ``align/`` (every rank's records of a step side by side), ``detectors/``,
``incidents/``, ``job/`` (what is learned of each job), ``shards/`` (K ingest shards judging
as one core), ``views/`` (coverage, status, curves, kept steps). Submodules are imported
where used, so importing this package costs nothing.
"""
