"""The default watch keeps its per-Cell hooks only where they fit the budget, measured."""
from __future__ import annotations

from rankscope.probe.cell_plan import DROPPED, KEPT, MEASURING_OFF, PHASE_STEPS, RESUME, SUSPEND, CellPlan


def run(plan: CellPlan, on_s: float, off_s: float, probe_s: float = 0.0005) -> list[str | None]:
    actions = []
    hooks_on = True
    for _ in range(2 * PHASE_STEPS + 4):
        action = plan.note_step(on_s if hooks_on else off_s, probe_s)
        actions.append(action)
        if action == SUSPEND:
            hooks_on = False
        elif action == RESUME:
            hooks_on = True
    return actions


def test_hooks_that_cost_a_fifth_of_a_step_are_left_off():
    plan = CellPlan(0.05)
    actions = run(plan, on_s=0.120, off_s=0.100)
    assert actions.count(SUSPEND) == 1 and RESUME not in actions
    assert plan.state == DROPPED and plan.share is not None and 0.15 < plan.share < 0.25


def test_hooks_that_fit_the_budget_are_put_back():
    plan = CellPlan(0.05)
    actions = run(plan, on_s=0.5015, off_s=0.500)
    assert actions.index(SUSPEND) < actions.index(RESUME)
    assert plan.state == KEPT


def test_the_first_step_of_each_phase_is_not_measured():
    plan = CellPlan(0.05)
    assert plan.note_step(9.0, 0.0) is None  # a compiling first step, however slow
    for _ in range(PHASE_STEPS - 1):
        assert plan.note_step(0.1, 0.0) is None
    assert plan.note_step(0.1, 0.0) == SUSPEND and plan.state == MEASURING_OFF
    assert plan.note_step(9.0, 0.0) is None  # the first step without hooks: left out too
    for _ in range(PHASE_STEPS):
        plan.note_step(0.1, 0.0)
    assert plan.state == KEPT  # equal medians: the hooks cost nothing measurable
