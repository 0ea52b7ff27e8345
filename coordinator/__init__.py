"""The coordinator, installed as ``rankscope.coordinator``: it aligns every rank's steps,
names the first rank that diverges and drives the cluster through the incident.

- ``logic/``: the decisions, plain Python + NumPy (no Ray, no sockets, injected clock).
- ``server/``: the running coordinator: ZeroMQ front end, incident actions, the Ray actor,
  and the :class:`~.server.client.Coordinator` client every command uses.
- ``launch/``: ``rankscope launch``: one watched job on this machine.
- ``report/``: ``report.html``.
- ``cli/``: the coordinator-side verbs of the ``rankscope`` command.
"""
