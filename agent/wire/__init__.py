"""What every rankscope process speaks: the probe, the node agent and the coordinator.

- :mod:`.records`: the columnar record model (one StepBatch per rank per step).
- :mod:`.protocol`: message types, msgpack encoding, the validating decoder.
- :mod:`.transport`: ZeroMQ sockets, CURVE, connection watching.
- :mod:`.layout`: rank-id conventions and every path layout that crosses a process.
- :mod:`.shards`, :mod:`.step_pack`: the shard map node agents route by, and its frames.

Files read outside the wire are in ``rankscope.files``; texts for people in ``rankscope.text``.

NumPy, msgpack and pyzmq only: no MindSpore, no Ray.
"""
