"""STATUS ``watch``: how a rank is watched travels validated, and reads the same on the
rank's log and in ``rankscope launch``."""
from __future__ import annotations

import pytest

from rankscope.coordinator.launch.progress import ProgressPrinter, watch_summary
from rankscope.coordinator.logic.core import CoordinatorCore
from rankscope.wire import protocol
from rankscope.wire.protocol import Decoder, Message, ProtocolError
from rankscope.wire.watch_line import watch_line

GOOD = {"rank": 2, "mode": "GRAPH", "how": "the kernel dump", "reason": ""}


def frame(detail) -> bytes:
    return protocol.encode(Message(protocol.STATUS, "j", "rank:h:1", 1, {"what": "watch", "detail": detail}))


def test_a_good_watch_status_decodes():
    msg = Decoder("j").decode_or_raise(frame(GOOD))
    assert msg.body["detail"] == GOOD


@pytest.mark.parametrize("detail, field", [
    ({**GOOD, "mode": 3}, "mode"),
    ({k: v for k, v in GOOD.items() if k != "how"}, "how"),
    ({**GOOD, "extra": 1}, "extra"),
    ({**GOOD, "reason": "x" * 1000}, "reason"),
    ({**GOOD, "rank": "2"}, "rank"),
])
def test_a_malformed_watch_status_is_refused_naming_the_field(detail, field):
    with pytest.raises(ProtocolError, match=field):
        Decoder("j").decode_or_raise(frame(detail))
    d = Decoder("j")
    assert d.decode(frame(detail)) is None and sum(d.rejected.values()) == 1


def test_the_line_reads_the_same_everywhere():
    assert watch_line(2, "GRAPH", "the kernel dump") == "rank 2: GRAPH mode, watched through the kernel dump"
    assert watch_line(1, "GRAPH", "not watched", "kernel dump unavailable") == \
        "rank 1: not watched: kernel dump unavailable"


def test_coordinator_keeps_it_per_rank_and_launch_prints_it_once():
    core = CoordinatorCore({}, clock=lambda: 0.0, wall_clock=lambda: 0.0)
    core.on_watch("j", 2, GOOD)
    core.on_watch("j", 0, {**GOOD, "rank": 0, "how": "not watched", "reason": "the optimizer runs inside jit"})
    ranks = core.status()["jobs"]["j"]["ranks"]
    assert ranks["2"]["watch"] == {"mode": "GRAPH", "how": "the kernel dump", "reason": ""}
    lines: list[str] = []
    pp = ProgressPrinter(lines.append)
    pp.update({"ranks": ranks})
    pp.update({"ranks": ranks})
    said = [ln for ln in lines if "watched" in ln]
    assert said == ["rank 0: not watched: the optimizer runs inside jit",
                    "rank 2: GRAPH mode, watched through the kernel dump"]
    assert watch_summary(pp.watch, ["0", "1", "2"]) == [
        *said, "rank 1: watch status unknown (the rank never reported one)"]


def test_pijit_steps_say_what_is_not_seen_inside_them():
    from rankscope.probe.watch import JIT, PIJIT_UNSEEN, WatchReporter
    r = WatchReporter()
    r.eager_steps, r.pijit_calls = 3, 3
    w = r.current()
    assert w.mode == JIT and "bytecode" in w.how and w.reason
    assert len(w.line(1)) <= 300
    r.jit_steps, r.kernel_problem = 3, PIJIT_UNSEEN  # the PIJit call is the training step
    w = r.current()
    assert "sentinels only" in w.how and w.reason == PIJIT_UNSEEN
    r.jit_steps = r.pijit_calls = 0
    assert r.current().how == "hooks"


def test_eager_steps_reduced_without_a_reducer_say_local_gradients_are_not_seen():
    from rankscope.probe.watch import GRADS_UNSEEN, PYNATIVE, WatchReporter
    r = WatchReporter()
    r.eager_steps = 1
    assert r.current().reason == ""
    r.grads_unseen = GRADS_UNSEEN
    w = r.current()
    assert (w.mode, w.how, w.reason) == (PYNATIVE, "hooks", GRADS_UNSEEN)
    assert w.line(2).endswith(f"watched through hooks ({GRADS_UNSEEN})")
