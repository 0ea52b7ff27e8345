"""STATUS rerun: what a rank says after re-running an anomalous step, checked as input."""
from __future__ import annotations

import pytest

from rankscope.wire import protocol, rerun_facts
from rankscope.wire.errors import ProtocolError

GOOD = {"rank": 2, "step": 5, "outcome": "transient", "trigger": "a loss that is not finite",
        "bitwise": False, "differs_at": "loss", "used_rerun": True}


@pytest.mark.parametrize("bad, field", [
    ({**GOOD, "outcome": "maybe"}, "outcome"),
    ({**GOOD, "rank": -1}, "rank"),
    ({**GOOD, "step": "5"}, "step"),
    ({**GOOD, "bitwise": 1}, "bitwise"),
    ({**GOOD, "trigger": "x" * 400}, "trigger"),
    ({**GOOD, "color": "red"}, "color"),
    ({k: v for k, v in GOOD.items() if k != "trigger"}, "trigger"),
    ("not a map", "detail"),
])
def test_a_bad_detail_is_refused_naming_its_field(bad, field):
    with pytest.raises(ProtocolError) as exc:
        rerun_facts.check_detail(bad)
    assert field in str(exc.value)


def test_the_decoder_checks_rerun_statuses():
    bad = protocol.Message(protocol.STATUS, "job", "src", 1,
                           {"what": "rerun", "detail": {**GOOD, "outcome": "sometimes"}})
    with pytest.raises(ProtocolError, match="outcome"):
        protocol.Decoder("job").decode_or_raise(protocol.encode(bad))
    good = protocol.Message(protocol.STATUS, "job", "src", 2, {"what": "rerun", "detail": GOOD})
    assert protocol.Decoder("job").decode_or_raise(protocol.encode(good)).body["detail"] == GOOD


def test_each_outcome_has_its_own_line():
    assert rerun_facts.classification(GOOD).startswith("transient on rank 2: rank 2 saw a loss that is not finite "
                                                       "at step 5")
    assert "the gradient reduction never took the corrupted one" in rerun_facts.classification(GOOD)
    same = {**GOOD, "outcome": "reproduced", "bitwise": True, "used_rerun": False}
    assert rerun_facts.classification(same).startswith("reproduces: ")
    assert "(bit for bit)" in rerun_facts.classification(same)
    assert "not bit for bit" in rerun_facts.classification({**same, "bitwise": False})
    no = {"rank": 0, "step": 1, "outcome": "not_possible", "trigger": "x", "why": "it ran a collective"}
    assert rerun_facts.classification(no) == "not re-run: rank 0 saw x at step 1, but it ran a collective"
