"""STEPS frames (a node agent's parts for one shard, packed): round trip, refusals, and
the shard front end's per-part de-duplication and acks over real sockets."""
from __future__ import annotations

import msgpack
import numpy as np
import pytest
import zmq

from rankscope.coordinator.server.frontend import Frontend, Handlers
from rankscope.coordinator.server.ingest_load import simulated_batch
from rankscope.wire import protocol
from rankscope.wire.columns import BLOB_ORDER, PART_FIELDS, STEP_COLS, STEP_COLUMNS
from rankscope.wire.protocol import Decoder, encode
from rankscope.wire.step_pack import pack_message, parts_from_message
from rankscope.wire.transport import connect_dealer
from tests.sim_agent import wait_for

COLS = STEP_COLUMNS


def _parts(n_ranks: int = 3, tensors: int = 5, step: int = 0) -> list:
    rng = np.random.default_rng(1)
    return [(f"rank:{r}", 100 + r, simulated_batch("j", r, step, tensors if r != 1 else 2, rng))
            for r in range(n_ranks)]


def test_a_pack_comes_back_part_by_part_with_every_column_and_header():
    parts = _parts()
    msg = Decoder(job="j").decode(encode(pack_message("j", "agent:h", 7, parts)))
    assert msg is not None and msg.type == protocol.STEPS and (msg.src, msg.seq) == ("agent:h", 7)
    back = parts_from_message(msg)
    assert [(s, q) for s, q, _ in back] == [(s, q) for s, q, _ in parts]
    for (_, _, want), (_, _, got) in zip(parts, back):
        assert (got.job, got.rank, got.step, got.token, got.new_names) == (want.job, want.rank, want.step,
                                                                            want.token, want.new_names)
        for c in COLS:
            np.testing.assert_array_equal(getattr(got, c), getattr(want, c))
        got.validate()
    # Each part says where its rows are in the frame's columns.
    assert [b.packed.start for _, _, b in back] == [0, 5, 7]
    assert all(b.packed.cols is back[0][2].packed.cols for _, _, b in back)


def _env(parts=None) -> dict:
    return msgpack.unpackb(encode(pack_message("j", "agent:h", 1, parts or _parts())), raw=False,
                           strict_map_key=False)


def _head(env_body: dict, field: str, values: list) -> None:
    """Replace one header field's column (its length as given: a short one makes the
    header's byte count wrong)."""
    k = env_body["k"]
    fields = np.frombuffer(env_body["head"], np.int64, k * len(PART_FIELDS)).reshape(len(PART_FIELDS), k).copy()
    wall = env_body["head"][8 * k * len(PART_FIELDS):]
    cols = [fields[i].tolist() for i in range(len(PART_FIELDS))]
    cols[PART_FIELDS.index(field)] = values
    env_body["head"] = b"".join(np.array(c, "<i8").tobytes() for c in cols) + wall


def _col(env_body: dict, name: str, value: int) -> None:
    """Set every row of one column in the packed columns to ``value``."""
    at = 0
    for c in BLOB_ORDER:
        dt, _ = STEP_COLS[c]
        width = np.dtype(dt).itemsize * (4 if c == "stats" else 1) * env_body["n"]
        if c == name:
            raw = bytearray(env_body["cols"])
            raw[at:at + width] = np.full(width // np.dtype(dt).itemsize, value, dt).tobytes()
            env_body["cols"] = bytes(raw)
        at += width


@pytest.mark.parametrize("mutate, reason", [
    (lambda b: _head(b, "rows", [5, 2, 4]), "bad_shape"),  # parts hold more rows than the columns
    (lambda b: _head(b, "rows", [5, 1, 1]), "bad_shape"),  # ... or fewer
    (lambda b: _head(b, "seq", [1, 2]), "bad_shape"),  # a header field short (src and names have 3)
    (lambda b: _head(b, "seq", [1, -1, 2]), "bad_field"),  # a negative seq
    (lambda b: _head(b, "rows", [6, -1, 2]), "bad_field"),  # a negative row count
    (lambda b: b.__setitem__("cols", b["cols"][:-1]), "bad_shape"),  # a byte short
    (lambda b: b.__setitem__("cols", b["cols"] + b"\0" * 73), "bad_shape"),  # a row too many
    (lambda b: b.__setitem__("n", b["n"] + 1), "bad_shape"),  # a row count the bytes do not hold
    (lambda b: b.__setitem__("k", -1), "bad_field"),
    (lambda b: b.__setitem__("n", True), "bad_field"),  # a bool for a count
    (lambda b: b.__setitem__("cols", list(b["cols"])), "bad_field"),  # columns not in bytes
    (lambda b: _col(b, "kinds", 250), "bad_field"),  # a kind nobody knows
    (lambda b: b["src"].__setitem__(0, 3), "bad_field"),  # a src that is not a string
    (lambda b: b["src"].pop(), "bad_field"),  # one src short
    (lambda b: b.pop("names"), "missing_field"),
    (lambda b: b["names"].__setitem__(1, {"a": "b"}), "bad_field"),  # names keyed by a string
    (lambda b: b["names"].__setitem__(1, []), "bad_field"),  # a table that is not a map
    (lambda b: b["names"].__setitem__(1, {True: "b"}), "bad_field"),  # a bool id
    (lambda b: b["names"].__setitem__(1, {0: "a", -2: "b"}), "bad_field"),  # a negative id
    (lambda b: b["names"].__setitem__(1, {0: "a", 1: b"b"}), "bad_field"),  # a name in bytes
    (lambda b: b.__setitem__("extra", 1), "bad_field"),  # a field nobody knows
    (lambda b: b.pop("head"), "missing_field"),
    (lambda b: b.__setitem__("cols", {c: 0 for c in STEP_COLS}), "bad_field"),  # the per-column form of STEP
])
def test_a_pack_that_is_not_quite_right_is_refused_with_its_reason(mutate, reason):
    env = _env()
    mutate(env["b"])
    dec = Decoder()
    assert dec.decode(msgpack.packb(env)) is None
    assert dict(dec.rejected) == {reason: 1}


def test_an_empty_pack_is_valid_and_has_no_parts():
    msg = Decoder().decode(encode(pack_message("j", "agent:h", 1, [])))
    assert msg is not None and parts_from_message(msg) == []


class _Keep(Handlers):
    def __init__(self) -> None:
        self.batches: list = []

    def on_steps(self, batches):
        self.batches += batches


def test_a_shard_takes_each_part_once_and_acknowledges_each_ranks_seq():
    """A replayed pack (the agent's spool after a reconnect) whose parts were partly taken
    already: only the new parts count, and the ack names every rank's newest seq."""
    fe = Frontend(_Keep(), "tcp://127.0.0.1:0", job="j", tick_s=0.02, ack_s=0.05, clock_probes=False)
    endpoint = fe.start()
    ctx = zmq.Context()
    sock = connect_dealer(ctx, endpoint, b"agent:h")
    try:
        parts = _parts(3)
        sock.send(encode(pack_message("j", "agent:h", 1, parts[:2])))
        sock.send(encode(pack_message("j", "agent:h", 2, parts)))  # ranks 0 and 1 again, rank 2 new
        wait_for(lambda: len(fe.handlers.batches) >= 3, timeout=10.0)
        dec = Decoder()

        def acked() -> dict | None:
            if sock.poll(100):
                m = dec.decode(sock.recv())
                if m is not None and m.body.get("what") == "ack":
                    return m.body["detail"]["high"]
            return None

        high = wait_for(lambda: (h := acked()) and len(h) == 3 and h, timeout=10.0)
        assert [b.rank for b in fe.handlers.batches] == [0, 1, 2]
        assert fe.replay.duplicates == 2
        assert high == {"j|rank:0": 100, "j|rank:1": 101, "j|rank:2": 102}
    finally:
        sock.close(0)
        ctx.term()
        fe.stop()
