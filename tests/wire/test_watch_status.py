"""STATUS ``watch``: how a rank is watched travels validated, and reads the same on the
rank's log and in ``rankscope launch``."""
from __future__ import annotations

import pytest

from rankscope.coordinator.launch.progress import ProgressPrinter, watch_summary
from rankscope.coordinator.logic.core import CoordinatorCore
from rankscope.wire import protocol
from rankscope.wire.protocol import Decoder, Message, ProtocolError
from rankscope.text.watch_line import watch_line

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
        *said, "rank 1: watch status unknown (never reported one)"]


def test_end_of_run_lines_group_ranks_watched_alike():
    graph = {"mode": "GRAPH", "how": "the kernel dump", "reason": ""}
    lost = {"mode": "GRAPH", "how": "not watched", "reason": "kernel dump unavailable"}
    watch = {str(r): graph for r in range(1000)} | {"7": lost, "8": lost}
    lines = watch_summary(watch, [str(r) for r in range(1003)])
    assert lines == ["ranks 0-6, 9-999: GRAPH mode, watched through the kernel dump",
                     "ranks 7, 8: not watched: kernel dump unavailable",
                     "ranks 1000-1002: watch status unknown (never reported one)"]


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


class _Outbox:
    def __init__(self, full: bool = False) -> None:
        self.full, self.items = full, []

    def put_nowait(self, item) -> None:
        if self.full:
            raise RuntimeError("full")
        self.items.append(item)


class _Client:
    def __init__(self, full: bool = False) -> None:
        self.state = type("S", (), {"outbox": _Outbox(full)})()


@pytest.mark.parametrize("same_file, full, printed", [
    (True, False, False),   # launch prints it from the status, on this very file: once, not twice
    (False, False, True),   # a log file of its own (msrun): the rank says it there
    (True, True, True),     # the status could not be sent: the rank's own line stands
])
def test_a_rank_leaves_its_watch_line_to_launch_only_when_launch_prints_on_the_same_file(
        tmp_path, monkeypatch, same_file, full, printed):
    import sys

    from rankscope.probe.watch import WatchReporter
    from rankscope.text.watch_line import LAUNCH_OUTPUT_ENV, stream_id
    log, other = tmp_path / "log", tmp_path / "other"
    other.write_text("")
    with open(log, "w") as fh, open(other) as elsewhere:
        monkeypatch.setattr(sys, "stderr", fh)
        monkeypatch.setenv(LAUNCH_OUTPUT_ENV, stream_id(fh if same_file else elsewhere))
        client = _Client(full)
        rep = WatchReporter()
        rep.eager_steps = 1
        assert rep.say(0, client) is not None
    assert ("watched through hooks" in log.read_text()) == printed
    assert len(client.state.outbox.items) == (0 if full else 1)


def test_stream_id_is_empty_for_a_stream_without_a_descriptor():
    import io

    from rankscope.text.watch_line import stream_id
    assert stream_id(io.StringIO()) == "" and stream_id(-1) == ""


def test_eager_steps_reduced_without_a_reducer_say_local_gradients_are_not_seen():
    from rankscope.probe.watch import GRADS_UNSEEN, PYNATIVE, WatchReporter
    r = WatchReporter()
    r.eager_steps = 1
    assert r.current().reason == ""
    r.grads_unseen = GRADS_UNSEEN
    w = r.current()
    assert (w.mode, w.how, w.reason) == (PYNATIVE, "hooks", GRADS_UNSEEN)
    assert w.line(2).endswith(f"watched through hooks ({GRADS_UNSEEN})")


def test_a_rank_whose_whole_step_runs_compiled_says_it_cannot_be_re_run():
    from rankscope.probe.watch import GRAPH, JIT, WatchReporter
    r = WatchReporter()
    r.graph_steps = 2
    w = r.current()
    assert w.mode == GRAPH and w.line(3).endswith(
        "; no re-run on an anomaly: steps run compiled (GRAPH), with the backward and the optimizer in one graph: "
        "nothing can be re-run before the update")
    assert Decoder("j").decode_or_raise(frame(w.detail(3))).body["detail"]["rerun"] == w.rerun
    r.graph_steps, r.jit_steps = 0, 2  # the whole step inside @ms.jit
    assert r.current().mode == JIT and "compiled (PyNative+jit)" in r.current().rerun
    r.jit_steps, r.eager_steps, r.jit_compiles = 0, 2, 1  # eager steps with jit parts: a re-run can be tried
    assert r.current().rerun == "" and "re-run" not in r.current().line(3)
    core = CoordinatorCore({}, clock=lambda: 0.0, wall_clock=lambda: 0.0)
    core.on_watch("j", 1, {**GOOD, "rank": 1, "rerun": "no re-run on an anomaly: x"})
    watch = core.status()["jobs"]["j"]["ranks"]["1"]["watch"]
    assert watch_summary({"1": watch}, ["1"]) == ["rank 1: GRAPH mode, watched through the kernel dump; no re-run on an anomaly: x"]


COST = {"tier": "default", "budget": 0.05, "every": 8, "share": 0.041, "host_bytes": 0, "read_bytes": 268435456,
        "cells": "off", "cells_share": 0.21}


def test_the_watch_cost_travels_validated_and_reads_as_one_phrase():
    msg = Decoder("j").decode_or_raise(frame({**GOOD, "cost": COST}))
    assert msg.body["detail"]["cost"] == COST
    with pytest.raises(ProtocolError, match="cost.every"):
        Decoder("j").decode_or_raise(frame({**GOOD, "cost": {**COST, "every": "8"}}))
    with pytest.raises(ProtocolError, match="cost.tier"):
        Decoder("j").decode_or_raise(frame({**GOOD, "cost": {"every": 8}}))
    line = watch_line(2, "PyNative", "hooks", cost=COST)
    assert line.startswith("rank 2: PyNative mode, watched through hooks; default watch within 5% of a step, "
                           "each weight fingerprinted every 8 steps (a silent weight change is named up to 7 step(s) late)")
    assert "per-Cell hooks off (they cost 21% of a step)" in line and "measured 4.1% of a step" in line
    assert "K" not in watch_line(2, "PyNative", "hooks", cost={**COST, "every": None}).split("within 5%")[1][:3]
    assert "every weight fingerprinted every step" in watch_line(2, "PyNative", "hooks", cost={**COST, "every": 1})
    kept = watch_line(2, "PyNative", "hooks", cost={**COST, "cells": "on", "cells_share": 0.012})
    assert "per-Cell hooks on (they cost 1.2% of a step)" in kept and "re-run" not in kept
    over = watch_line(2, "PyNative", "hooks", cost={**COST, "share": 0.062, "every": 64})
    assert "default watch, budget 5% of a step" in over and "within" not in over  # no claim the figure belies
    assert "measured 6.2% of a step (over the budget: what runs every step" in over
    assert watch_line(2, "PyNative", "hooks", cost={"tier": "full"}).endswith(
        "full watch: every parameter, optimizer state and gradient in full every step")


def test_launch_says_a_ranks_watch_again_when_its_plan_changes_and_coverage_keeps_the_bound():
    from rankscope.coordinator.logic.views.coverage import describe
    core = CoordinatorCore({}, clock=lambda: 0.0, wall_clock=lambda: 0.0)
    lines: list[str] = []
    pp = ProgressPrinter(lines.append)
    first = {**GOOD, "mode": "PyNative", "how": "hooks", "cost": {"tier": "default", "budget": 0.05, "every": None}}
    for r in (0, 1):
        core.on_watch("j", r, {**first, "rank": r})
    pp.update({"ranks": core.status()["jobs"]["j"]["ranks"]})
    pp.update({"ranks": core.status()["jobs"]["j"]["ranks"]})
    assert len([ln for ln in lines if "watched" in ln]) == 1  # ranks 0, 1 alike: one line, once
    core.on_watch("j", 1, {**first, "rank": 1, "cost": COST})  # rank 1 measured its steps: K = 8
    pp.update({"ranks": core.status()["jobs"]["j"]["ranks"]})
    said = [ln for ln in lines if "watched" in ln]
    assert len(said) == 2 and said[1].startswith("rank 1:") and "every 8 steps" in said[1]
    report = core.coverage_report("j")
    assert report["watch_cost"]["fingerprint_every_steps"] == 8
    assert report["watch_cost"]["ranks"]["1"]["share"] == 0.041
    report.update(steps=[0, 3], watched_ranks=2, ranks=2, not_seen=[])
    assert "weights fingerprinted every 8 steps" in describe(report)
    assert "named up to 7 step(s) late" in describe(report)


def test_ranks_that_planned_alike_share_a_line_with_the_most_any_of_them_measured():
    pynative = {"mode": "PyNative", "how": "hooks", "reason": ""}
    watch = {str(r): {**pynative, "cost": {**COST, "share": 0.01 * (r + 1), "host_bytes": 0}} for r in range(4)}
    watch["3"] = {**pynative, "cost": {**COST, "every": 16}}
    lines = watch_summary(watch)
    assert len(lines) == 2 and lines[0].startswith("ranks 0-2: ") and "measured up to 3.0% of a step" in lines[0]
    assert lines[1].startswith("rank 3: ") and "every 16 steps" in lines[1] and "measured 4.1%" in lines[1]
