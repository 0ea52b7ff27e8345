"""The node agent: one daemon per host between its rank processes and the coordinator.

One job per module:

- :mod:`agent.node.registry`: which process is which rank; deterministic remap of clashing
  claims; the rank map (pure logic, no I/O but the atomic ``rank_map.json`` write).
- :mod:`agent.node.liveness`: is a rank's process still there (pid + start time via
  /proc, heartbeat age) and its exit status when the kernel still shows it.
- :mod:`agent.node.spool`: the bounded on-disk log of frames the coordinator has not
  confirmed yet; replayed in order.
- :mod:`agent.node.uplink`: the DEALER to the coordinator: connection state from socket
  monitor events, resend-after-reconnect, spool when cut off.
- :mod:`agent.node.bundles`: per-rank flight recorders and bundles written on a dead
  rank's behalf.
- :mod:`agent.node.names`: every rank's name table, re-sent to a coordinator that lost it.
- :mod:`agent.node.relay`: which ranks a control command reaches; what late joiners hear.
- :mod:`agent.node.daemon`: the loop that wires them together (``NodeAgent``).

Nothing is imported here: ``rankscope agent`` loads only what it runs.
"""
