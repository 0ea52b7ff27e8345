"""What a rank's re-run of an anomalous step does to the coordinator: the verdict carries
its classification, a transient fault takes cluster.on_transient's policy, and each rank's
strikes are counted (bounded) in status and coverage."""
from __future__ import annotations

import pytest
from logic_helpers import FakeClock

from rankscope.coordinator.logic.core import CoordinatorCore
from rankscope.coordinator.logic.job.reruns import KEEP_PER_RANK, LISTED_STEPS, RerunBook, strikes_text
from rankscope.coordinator.logic.verdict import Verdict


def _core(**cluster) -> CoordinatorCore:
    core = CoordinatorCore({"on_divergence": "pause", **cluster}, clock=FakeClock())
    for r in range(4):
        core.on_register("j", r, {"world_size": 4, "pid": r})
    return core


def _rerun(rank: int, step: int, outcome: str, **more) -> dict:
    return {"rank": rank, "step": step, "outcome": outcome, "trigger": "a loss that is not finite", **more}


@pytest.mark.parametrize("on_transient, outcome, policy", [
    ("continue", "transient", "pause"),  # the job's on_divergence, as for any finding
    ("skip", "transient", "continue"),   # the step went on with the re-run's result
    ("pause", "transient", "pause"),
    ("skip", "reproduced", "pause"),     # a deterministic fault keeps on_divergence
])
def test_the_named_rank_s_re_run_sets_the_line_and_the_policy(on_transient, outcome, policy):
    core = _core(on_transient=on_transient)
    core.on_rerun("j", _rerun(2, 5, outcome, bitwise=outcome == "reproduced", used_rerun=on_transient == "skip"))
    inc = core.book.open_or_attach(Verdict("nan_origin", 2, 5, "Cell.fc1.output.0", 3, "forward", "j/0", job="j"))
    assert inc.policy.value == policy
    line = inc.verdict.evidence["rerun"]["line"]
    assert line.startswith("transient on rank 2" if outcome == "transient" else "reproduces: rank 2")


def test_a_re_run_of_another_rank_or_step_is_not_this_verdict_s():
    core = _core(on_transient="skip")
    core.on_rerun("j", _rerun(1, 5, "transient"))
    core.on_rerun("j", _rerun(2, 4, "transient"))
    inc = core.book.open_or_attach(Verdict("nan_origin", 2, 5, "t", 3, "forward", "j/0", job="j"))
    assert inc.verdict.evidence["rerun"].get("assumed") is True and inc.policy.value == "pause"


def test_a_re_run_said_after_the_incident_opened_joins_it(tmp_path):
    core = CoordinatorCore({"on_divergence": "continue"}, clock=FakeClock(), export_dir=tmp_path)
    core.on_register("j", 0, {"world_size": 1, "pid": 0})
    inc = core.book.open_or_attach(Verdict("outlier", 0, 9, "t", 0, "loss", "j/0", job="j"))
    core.on_rerun("j", _rerun(0, 9, "reproduced", bitwise=True))
    assert inc.verdict.evidence["rerun"]["outcome"] == "reproduced"
    assert (tmp_path / "incidents" / inc.incident_id / "state.json").read_text().count("reproduces: rank 0") == 1


def test_strikes_are_counted_per_rank_in_status_and_coverage_and_stay_bounded():
    core = _core()
    for step in range(1000):
        core.on_rerun("j", _rerun(3, step, "transient"))
    core.on_rerun("j", _rerun(0, 7, "reproduced"))
    core.on_rerun("j", _rerun(0, 8, "not_possible", why="it ran a collective"))
    strikes = core.status()["jobs"]["j"]["reruns"]
    assert strikes["3"]["transient"] == 1000 and strikes["3"]["transient_steps"] == list(range(980, 1000))
    assert strikes["0"] == {"reproduced": 1, "transient": 0, "not_possible": 1, "transient_steps": []}
    assert core.coverage_report("j")["reruns"] == strikes
    assert len(core.book.reruns._recent[("j", 3)]) == KEEP_PER_RANK  # noqa: SLF001
    assert len(strikes["3"]["transient_steps"]) == LISTED_STEPS
    text = strikes_text(strikes)
    assert text.startswith("re-runs of anomalous steps: rank 3: 1000 transient (steps 980, ")
    assert text.endswith("rank 0: 1 reproduced, 1 not re-run")
    assert strikes_text(RerunBook().strikes("j")) == ""


def test_a_rank_whose_steps_run_compiled_is_said_not_re_run():
    core = _core()
    core.on_watch("j", 2, {"mode": "GRAPH", "how": "the kernel dump", "reason": ""})
    core.on_watch("j", 1, {"mode": "PyNative", "how": "hooks", "reason": ""})
    inc = core.book.open_or_attach(Verdict("nan_origin", 2, 5, "t", 3, "forward", "j/0", job="j"))
    rerun = inc.verdict.evidence["rerun"]
    assert rerun["outcome"] == "not_possible" and inc.policy.value == "pause"
    assert rerun["line"].startswith("not re-run: rank 2's steps run compiled (GRAPH)")
    eager = _core()
    eager.on_watch("j", 1, {"mode": "PyNative", "how": "hooks", "reason": ""})
    # An eager rank that re-ran nothing saw nothing wrong before its update: the verdict
    # says so, and that it cannot tell transient from deterministic.
    inc = eager.book.open_or_attach(Verdict("outlier", 1, 5, "t", 3, "forward", "j/0", job="j"))
    said = inc.verdict.evidence["rerun"]
    assert said["outcome"] == "not_possible" and said["assumed"] is True and inc.policy.value == "pause"
    assert said["line"].startswith("not re-run: rank 1's own step did not look anomalous to it")
    assert "transient or deterministic" in said["line"]
    # The rank's own outcome, said after the incident opened, replaces the assumption.
    eager.on_rerun("j", _rerun(1, 5, "reproduced", bitwise=True))
    assert inc.verdict.evidence["rerun"]["outcome"] == "reproduced"


def test_the_incident_and_its_report_carry_the_rank_s_strikes(tmp_path):
    from rankscope.coordinator.report.render import _verdict_html
    core = _core(on_transient="skip")
    for step in (3, 5):
        core.on_rerun("j", _rerun(2, step, "transient"))
    inc = core.book.open_or_attach(Verdict("nan_origin", 2, 5, "t", 3, "forward", "j/0", job="j"))
    assert inc.verdict.evidence["rerun"]["strikes"]["transient_steps"] == [3, 5]
    html = _verdict_html({"first_diverging_rank": 2, "step": 5, "detector": "nan_origin",
                          "evidence": inc.verdict.evidence})
    assert 'id="rerun">Re-run: transient on rank 2' in html
    assert "Rank 2 had 2 transient anomaly(ies) in this run so far (steps 3, 5)" in html
