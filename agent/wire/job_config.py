"""How the job's config reaches every rank: the one spelling of each hop.

- ``rankscope launch`` writes the job's config (``rankscope.config.job.job_config``) to
  a file and points every rank's :data:`CONFIG_ENV` at it; local dumps go to
  :data:`DUMP_PATH_ENV` (under the export folder).
- The coordinator holds the job's config and greets every node agent that connects
  with it (a STATUS :data:`WHAT` whose detail is ``{"config": {...}}``).
- ``rankscope launch --agent`` asks this host's node agent for it with the same STATUS
  (no detail) and gets that answer back, so ranks on every node read the very file a
  single-node launch would have written.
"""
from __future__ import annotations

import time
from typing import Any

from rankscope.wire import protocol
from rankscope.wire.protocol import Message

#: The job config file every rank under launch reads (PrecisionDebugger() included).
CONFIG_ENV = "RANKSCOPE_CONFIG"
#: Where a rank under launch writes its local dump unless its code names a place.
DUMP_PATH_ENV = "RANKSCOPE_DUMP_PATH"
#: STATUS ``what`` of the coordinator's greeting, of launch's question and the agent's answer.
WHAT = "job_config"
#: The file launch writes the job's config to, in its runtime folder.
FILE_NAME = "job_config.json"


def body(config: dict | None) -> dict:
    """The STATUS body carrying ``config`` (None: a question, or "not known yet")."""
    return {"what": WHAT, "detail": {} if config is None else {"config": config}}


def detail_value(msg_body: Any, what: str, key: str) -> Any:
    """``detail[key]`` of a STATUS body about ``what``, or None (the shape of launch's
    questions to its node agent and their answers)."""
    if not isinstance(msg_body, dict) or msg_body.get("what") != what:
        return None
    detail = msg_body.get("detail")
    return detail.get(key) if isinstance(detail, dict) else None


def config_of(msg_body: Any) -> dict | None:
    """The config a STATUS body carries, or None."""
    config = detail_value(msg_body, WHAT, "config")
    return config if isinstance(config, dict) else None


def ask_agent(endpoint: str, job: str, timeout_s: float) -> dict | None:
    """The job's config as this host's node agent heard it from the coordinator; asked
    again every half second (the agent may not have heard yet) until ``timeout_s``."""
    import os

    import zmq

    from rankscope.wire.transport import connect_dealer
    ctx = zmq.Context.instance()
    sock = connect_dealer(ctx, endpoint, f"launch-{os.getpid()}".encode())
    decoder = protocol.Decoder(job=None)
    seq = protocol.SeqCounter()
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            frame = protocol.encode(Message(protocol.STATUS, job, f"launch:{os.getpid()}", seq(), body(None)))
            try:
                sock.send(frame, flags=zmq.NOBLOCK)
            except zmq.Again:  # not connected yet (the agent is starting): try again shortly
                time.sleep(0.1)
                continue
            wait_until = min(deadline, time.monotonic() + 0.5)
            while (left := wait_until - time.monotonic()) > 0:
                if not sock.poll(int(left * 1000) + 1):
                    break
                msg = decoder.decode(sock.recv())
                if msg is not None and msg.type == protocol.STATUS and msg.body.get("what") == WHAT:
                    config = config_of(msg.body)
                    if config is not None:
                        return config
                    break  # not known yet: ask again at the next half second
            time.sleep(max(0.0, wait_until - time.monotonic()))
    finally:
        sock.close(linger=0)
    return None
