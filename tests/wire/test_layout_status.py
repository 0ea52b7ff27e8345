"""STATUS ``layout``: a rank's view of the job's parallel layout travels validated, and a
node agent says it again to a coordinator that lost it."""
from __future__ import annotations

import pytest

from rankscope.wire import protocol
from rankscope.wire.collective_names import collective_record, parse_collective
from rankscope.wire.layout_facts import MAX_GROUPS, check_facts
from rankscope.wire.protocol import Decoder, Message, ProtocolError
from tests.coordinator.logic.hybrid_sim import tp_facts


def frame(detail, what: str = "layout") -> bytes:
    return protocol.encode(Message(protocol.STATUS, "j", "rank:h:1", 1, {"what": what, "detail": detail}))


def test_a_rank_s_facts_decode_as_sent():
    detail = {"rank": 1, "facts": {**tp_facts(1), "context": {"parallel_mode": "stand_alone", "device_num": 4},
                                   "param_layouts": [[[2, 2], [0, -1], False, 3]],
                                   "parallel_config": {"data_parallel": 2, "model_parallel": 2}}}
    msg = Decoder("j").decode_or_raise(frame(detail))
    assert msg.body["detail"] == detail


@pytest.mark.parametrize("facts, field", [
    ({"groups": {"tp_0": [0, -1]}}, "groups.tp_0"),
    ({"groups": {f"g{i}": [i] for i in range(MAX_GROUPS + 1)}}, "groups"),
    ({"reducers": "dp_0"}, "reducers"),
    ({"context": {"parallel_mode": 3}}, "context.parallel_mode"),
    ({"context": {"pipline_stages": 2}}, "context.pipline_stages"),
    ({"param_layouts": [[[2, 2], [5], False, 1]]}, "param_layouts"),
    ({"parallel_config": {"data_parallel": "2"}}, "parallel_config.data_parallel"),
    ({"collectives": [["AllReduce"]]}, "collectives"),
    ({"shards": 2}, "shards"),
    ({"world": -1}, "world"),
])
def test_malformed_facts_are_refused_naming_the_field(facts, field):
    with pytest.raises(ProtocolError, match=field):
        check_facts(facts)
    d = Decoder("j")
    assert d.decode(frame({"rank": 0, "facts": facts})) is None and sum(d.rejected.values()) == 1


def test_a_layout_status_needs_its_rank_and_facts():
    for detail in ({"facts": {}}, {"rank": -1, "facts": {}}, {"rank": 0, "facts": {}, "x": 1}, {}):
        with pytest.raises(ProtocolError, match="status.layout"):
            Decoder("j").decode_or_raise(frame(detail))


def test_register_says_whether_layout_facts_will_follow():
    body = {"host": "h", "pid": 7, "claimed_rank": 0, "layout": True}
    assert Decoder("j").decode_or_raise(protocol.encode(Message(protocol.REGISTER, "j", "r", 1, body))).body == body
    with pytest.raises(ProtocolError, match="register.layout"):
        Decoder("j").decode_or_raise(protocol.encode(Message(protocol.REGISTER, "j", "r", 1, {**body, "layout": 1})))


def test_collective_record_names_read_back_from_either_side():
    name = collective_record("tp.0", "AllReduce", 2, "output", 0)
    assert name == "Sentinel.collective.tp_0.AllReduce.2.output.0"
    got = parse_collective(name)
    assert (got.call, got.io, got.op, got.group, got.replicated_output) == (
        "Sentinel.collective.tp_0.AllReduce.2", "output", "AllReduce", "tp_0", True)
    kernel = parse_collective("AllReduce.Default_net-TPNet_fc2-RowParallel_AllReduce-op3.0.0.input.0")
    assert (kernel.call, kernel.io, kernel.group) == ("AllReduce.Default_net-TPNet_fc2-RowParallel_AllReduce-op3.0.0",
                                                     "input", None)
    assert parse_collective("MatMul.Default_MatMul-op1.0.0.input.0") is None
    assert parse_collective("Sentinel.collective.tp_0.AllReduce.x") is None
    assert not parse_collective(collective_record("g", "ReduceScatter", 0, "output", 0)).replicated_output
