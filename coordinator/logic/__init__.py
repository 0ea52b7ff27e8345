"""The coordinator's decisions in plain Python + NumPy (no Ray, no sockets).

:class:`~rankscope.coordinator.logic.core.CoordinatorCore` is the entry point; the Ray actor
(coordinator/actor.py) and its ZeroMQ front end feed it and carry out its actions.
Submodules are imported where used, so importing this package costs nothing.
"""
