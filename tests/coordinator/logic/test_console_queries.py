"""What the live console reads from the core, on a synthetic job: the grid's newest steps,
the tensors of a kept step with the rank furthest off, every verdict with the incident
that holds it, and a watchpoint's plain word on what the default watch cannot show it."""
from __future__ import annotations

import json

from logic_helpers import feed_step, run_synthetic

from rankscope.config.watchpoints import blind_in, blind_watchpoints, parse_watchpoints
from rankscope.coordinator.logic.views.recent import NONFINITE_DEVIATION
from rankscope.coordinator.server.service_console import verdict_rows


def _nan_on_rank2_at_step7(step, batches, sim):
    if step == 7:
        batches[2].nan_count[sim.column("Sentinel.grad_local.layer1.")] = 3


def test_grid_tail_is_the_newest_steps_with_nonfinite_and_missing_told_apart():
    core, sim, _ = run_synthetic(12, _nan_on_rank2_at_step7)
    [(group, g)] = core.series.tail(5).items()
    assert g["ranks"] == [0, 1, 2, 3] and g["steps"] == [7, 8, 9, 10, 11]
    assert g["deviation"][0][2] == NONFINITE_DEVIATION
    assert all(d is not None and d < NONFINITE_DEVIATION for d in g["deviation"][0][:2] + g["deviation"][1])
    assert core.series.tail(0)[group]["steps"] == []
    json.dumps(core.series.tail(64), allow_nan=False)


def test_grid_tail_since_a_step_sends_only_the_later_steps_and_a_missing_rank_as_none():
    core, sim, _ = run_synthetic(12, _nan_on_rank2_at_step7)
    [(group, whole)] = core.series.tail(64).items()
    newer = core.series.tail(64, {group: 9})[group]
    assert newer["steps"] == [10, 11] and newer["deviation"] == whole["deviation"][-2:]
    assert core.series.tail(64, {group: 11})[group]["steps"] == []
    assert core.series.tail(64, {"another group": 11})[group]["steps"] == whole["steps"]  # not held: all
    # A row from before a rank joined is shorter than the ranks now: the rank's cell is None.
    ranks, row = core.series.last(group)
    core.series.append(group, ranks + [4], (12, *row[1:3], row[3]))
    assert core.series.tail(64, {group: 11})[group]["deviation"] == [whole["deviation"][-1] + [None]]


def test_tensors_of_a_kept_step_name_the_rank_furthest_off():
    core, sim, found = run_synthetic(14, _nan_on_rank2_at_step7)
    group = found[0].group
    t = core.series.recent.tensors(group, 7)
    assert t["step"] == 7 and 7 in t["steps"] and len(t["tensors"]) == 16
    bad = next(x for x in t["tensors"] if x["name"].startswith("Sentinel.grad_local.layer1."))
    assert (bad["deviation"], bad["rank"]) == (NONFINITE_DEVIATION, 2)
    assert all(x["deviation"] is None or x["deviation"] < NONFINITE_DEVIATION for x in t["tensors"] if x is not bad)
    # A step no longer kept: the newest one instead, and the steps that are kept.
    newest = core.series.recent.tensors(group, 0)
    assert newest["step"] == 13 and 0 not in newest["steps"]
    assert core.series.recent.tensors("no/such-group") is None
    json.dumps(t, allow_nan=False)


def test_every_verdict_is_listed_with_the_incident_that_holds_it():
    core, sim, found = run_synthetic(10, _nan_on_rank2_at_step7)
    core.set_watchpoints([{"condition": "TL", "max_gt": -1e30}])
    for step in range(10, 12):
        found += feed_step(core, core.clock, sim.batches(step))
    docs = core.documents()
    rows = verdict_rows(list(core.verdicts), docs)
    assert [(r["detector"], r["rank"], r["step"]) for r in rows][:1] == [("nan_origin", 2, 7)]
    assert rows[0]["incident_id"] == docs[0]["incident_id"]
    hits = [r for r in rows if r["detector"] == "watchpoint"]
    assert hits and hits[0]["step"] == 10 and hits[0]["rule"]["condition"] == "TL"
    # Filed under the open incident (its related verdicts) or one of its own: never lost.
    assert all(r["incident_id"] for r in rows), rows
    json.dumps(rows, allow_nan=False)


def test_a_rule_says_what_the_default_watch_cannot_show_it():
    tl, gl, wcl, to, ar = parse_watchpoints([
        {"condition": "TL", "max_gt": 1.0}, {"condition": "GL", "rms_gt": 1.0},
        {"condition": "WCL", "change_ratio_gt": 0.1}, {"condition": "TO"},
        {"condition": "AR", "range_gt": 5.0}])
    assert "no max of weights" in blind_in(tl, "default") and "--watch full" in blind_in(tl, "default")
    assert "no change_ratio" in blind_in(wcl, "default") and blind_in(tl, "full") is None
    # Gradient norms, non-finite counts and Cell outputs are in the default watch.
    assert blind_in(gl, "default") is None and blind_in(to, "default") is None and blind_in(ar, "default") is None
    # Said at launch for the config's rules, unless the job runs the full watch.
    rules = [{"condition": "TL", "max_gt": 1.0}, {"condition": "GL", "rms_gt": 1.0}]
    assert [b.split(":")[0] for b in blind_watchpoints({"watchpoints": rules})] == ["wp0-TL"]
    assert blind_watchpoints({"watchpoints": rules, "watch": "full"}) == []


def test_a_watchpoint_rechecked_over_the_kept_steps_finds_a_past_hit_and_moves_nothing():
    """A rule made after the fact answers for the kept past: the NaN of step 7 is a hit at
    step 7 on rank 2; nothing is raised and the running watchpoints stay as they were."""
    from rankscope.coordinator.logic.views.recheck import recheck
    core, sim, found = run_synthetic(12, _nan_on_rank2_at_step7)
    before = (len(core.verdicts), len(core.documents()))
    [rule] = parse_watchpoints([{"condition": "TO", "names": ["Sentinel.grad_local.*"]}])
    got = recheck(core.series.recent.all_views(), (rule,))
    assert [(h["step"], h["rank"]) for h in got["hits"]] == [(7, 2)]
    assert got["hits"][0]["tensor"].startswith("Sentinel.grad_local.layer1.") and got["hits"][0]["condition"] == "TO"
    assert got["steps"][1] == 11 and got["steps"][0] <= 7 and got["checked"] >= 5
    assert (len(core.verdicts), len(core.documents())) == before
    assert recheck(core.series.recent.all_views(), ()) ["hits"] == []
    assert recheck({}, (rule,)) == {"hits": [], "more": 0, "steps": None, "checked": 0}
    json.dumps(got, allow_nan=False)
