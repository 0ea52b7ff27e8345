"""config.json: the one schema every rankscope process reads.

msProbe's fields for the in-rank probe (:mod:`.msprobe`), rankscope's ``cluster`` section
(:mod:`.cluster`, with :mod:`.detectors` and :mod:`.watchpoints`) that the probe, the node
agent, ``rankscope launch`` and the coordinator all act on, and RDR's ``rdr`` section
(:mod:`.rdr`). Every problem is a :class:`~.errors.ConfigError` naming the field.

Nothing is imported here, so reading one section costs only that module.
"""
