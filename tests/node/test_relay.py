"""What a rank that registers after a pause hears: the pause with the job's cut step."""
from __future__ import annotations

from rankscope.node.relay import ControlRelay
from rankscope.wire.protocol import CONTROL, STATUS, Message, encode


def _control(command: str, **args) -> tuple[Message, bytes]:
    msg = Message(CONTROL, "job", "coordinator", 1, {"command": command, "args": args})
    return msg, encode(msg)


def test_a_late_rank_holds_at_the_latest_cut_and_resume_forgets_it() -> None:
    relay = ControlRelay()
    pause, pause_frame = _control("pause", at=7)
    relay.remember(pause, pause_frame)
    assert relay.for_newcomer("job") == pause_frame
    step, step_frame = _control("step", n=2, at=9)
    relay.remember(step, step_frame)
    assert relay.for_newcomer("job") == step_frame  # the cut moved: newcomers hold before 9
    plain, plain_frame = _control("step", n=1)
    relay.remember(plain, plain_frame)
    assert relay.for_newcomer("job") == step_frame
    relay.remember(*_control("resume"))
    assert relay.for_newcomer("job") is None


def test_launch_on_this_node_is_told_whether_the_job_was_terminated() -> None:
    from rankscope.wire import job_config, job_state
    relay = ControlRelay()
    ask = Message(STATUS, "job", "launch-watch:1", 1, job_state.body(None))
    assert job_state.terminated_of(relay.answer(ask, None)) is False
    relay.remember(*_control("pause"))
    relay.remember(*_control("resume"))
    assert job_state.terminated_of(relay.answer(ask, None)) is False  # a pause is no terminate
    relay.remember(*_control("terminate"))
    assert job_state.terminated_of(relay.answer(ask, None)) is True
    other = Message(STATUS, "other", "launch-watch:1", 1, job_state.body(None))
    assert job_state.terminated_of(relay.answer(other, None)) is False
    # The job-config question is still answered with the config.
    cfg = Message(STATUS, "job", "launch:1", 1, job_config.body(None))
    assert job_config.config_of(relay.answer(cfg, {"level": "L0"})) == {"level": "L0"}
