"""The node agent: one daemon per host between its rank processes and the coordinator.

One job per module:

- :mod:`rankscope.node.registry`: which process is which rank; deterministic remap of clashing
  claims; the rank map (pure logic, no I/O but the atomic ``rank_map.json`` write).
- :mod:`rankscope.node.liveness`: is a rank's process still there (pid + start time via
  /proc, heartbeat age) and its exit status when the kernel still shows it.
- :mod:`rankscope.node.spool`: the bounded on-disk log of frames the coordinator has not
  confirmed yet; replayed in order.
- :mod:`rankscope.node.uplink`: the DEALER to the coordinator: connection state from socket
  monitor events, resend-after-reconnect, spool when cut off.
- :mod:`rankscope.node.bundles`: per-rank flight recorders and bundles written on a dead
  rank's behalf.
- :mod:`rankscope.node.name_ledger`: every rank's name table, re-sent to a coordinator that lost it.
- :mod:`rankscope.node.relay`: which ranks a control command reaches; what late joiners hear.
- :mod:`rankscope.node.core`: the decisions (``NodeCore``): no sockets, injected clock.
- :mod:`rankscope.node.daemon`: the loop that owns the sockets (``NodeAgent``).
- :mod:`rankscope.node.settings`: ``AgentSettings``.

Nothing is imported here: ``rankscope agent`` loads only what it runs. Its CLI is :mod:`rankscope.cli.agent`.
"""
