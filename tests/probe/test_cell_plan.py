"""The default watch keeps its per-Cell hooks only where they fit the budget, measured in
alternating blocks of steps so that a drift in step time is not read as their cost."""
from __future__ import annotations

from rankscope.probe.vitals.cell_plan import DROPPED, KEPT, MEASURING_OFF, MEASURING_ON, RESUME, SUSPEND, CellPlan


def run(plan: CellPlan, on_s, off_s, probe_s: float = 0.0005, steps: int | None = None) -> list[str | None]:
    """Feeds the plan step times; ``on_s``/``off_s`` are seconds or functions of the step."""
    actions = []
    hooks_on = True
    for i in range(steps or plan.steps_to_decide + 6):
        t = on_s if hooks_on else off_s
        action = plan.note_step(t(i) if callable(t) else t, probe_s)
        actions.append(action)
        if action == SUSPEND:
            hooks_on = False
        elif action == RESUME:
            hooks_on = True
    return actions


def test_hooks_that_cost_a_fifth_of_a_step_are_left_off():
    plan = CellPlan(0.05)
    actions = run(plan, on_s=0.120, off_s=0.100)
    assert plan.state == DROPPED and plan.share is not None and 0.15 < plan.share < 0.25
    assert actions.count(SUSPEND) == plan.pairs and actions.count(RESUME) == plan.pairs - 1
    assert all(a is None for a in actions[plan.steps_to_decide + 1:])  # settled: off from here on


def test_hooks_that_fit_the_budget_are_put_back_for_good():
    plan = CellPlan(0.05)
    actions = run(plan, on_s=0.5015, off_s=0.500)
    assert plan.state == KEPT
    last = max(i for i, a in enumerate(actions) if a is not None)
    assert actions[last] == RESUME and last <= plan.steps_to_decide + 1


def test_a_drift_in_step_time_is_not_read_as_the_hooks_cost():
    # The machine gets 40% slower step by step while the hooks cost 1%: one long phase on
    # followed by one long phase off would read the drift as the hooks' cost (or hide it).
    plan = CellPlan(0.05)
    run(plan, on_s=lambda i: 0.1 * (1 + 0.02 * i) * 1.01, off_s=lambda i: 0.1 * (1 + 0.02 * i))
    assert plan.state == KEPT and plan.share is not None and plan.share < 0.03
    plan = CellPlan(0.05)  # the other way round: getting faster while the hooks cost 20%
    run(plan, on_s=lambda i: 0.1 * (1 - 0.01 * i) * 1.2, off_s=lambda i: 0.1 * (1 - 0.01 * i))
    assert plan.state == DROPPED and 0.12 < plan.share < 0.28


def test_the_first_step_and_the_first_after_each_switch_are_not_measured():
    plan = CellPlan(0.05, block=3, pairs=2)
    assert plan.note_step(9.0, 0.0) is None  # a compiling first step, however slow
    assert plan.note_step(0.1, 0.0) is None
    assert plan.note_step(0.1, 0.0) == SUSPEND and plan.state == MEASURING_OFF
    assert plan.note_step(9.0, 0.0) is None  # the first step without hooks: left out
    assert plan.note_step(0.1, 0.0) is None
    assert plan.note_step(0.1, 0.0) == RESUME and plan.state == MEASURING_ON
    assert plan.note_step(9.0, 0.0) is None  # the first step with them back: left out
    plan.note_step(0.1, 0.0)
    assert plan.note_step(0.1, 0.0) == SUSPEND
    plan.note_step(9.0, 0.0)
    plan.note_step(0.1, 0.0)
    assert plan.note_step(0.1, 0.0) == RESUME and plan.state == KEPT  # equal: they cost nothing measurable


def test_a_plan_settled_without_measuring_stays_kept():
    plan = CellPlan(0.05)
    assert plan.keep() and plan.state == KEPT
    assert not plan.keep()  # already settled: nothing to put back
    assert plan.note_step(0.5, 0.0) is None and plan.state == KEPT
