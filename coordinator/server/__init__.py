"""The running coordinator: the logic core behind a ZeroMQ front end, in a Ray actor.

- :mod:`.service`: ``CoordinatorService``, plain Python around the core.
- :mod:`.frontend`: the ROUTER socket's loop thread.
- :mod:`.actions`: carrying out incident actions (control, bundles, report).
- :mod:`.dump_collect`: ``rankscope collect``'s receiving side.
- :mod:`.metrics`: Ray metrics.
- :mod:`.actor`: the thin Ray actor; :mod:`.client`: ``Coordinator``, the one handle every
  command uses (Ray stays behind it).
"""
