"""The rank's connection to its node agent (a probe sink).

- :mod:`.agent_client`: ``AgentClient``, what the probe holds; never blocks training.
- :mod:`.state`: what the training thread and the I/O thread share.
- :mod:`.io_thread`: the only code touching the socket.
- :mod:`.transfers`: bundle exports and dump collection, chunked.
- :mod:`.claim`: what a rank says about itself when it registers.
"""
