"""MindInsight watchpoint conditions, each hit by a real injected fault of its kind on one rank."""
from __future__ import annotations

import pytest
from logic_helpers import FakeClock, feed_step

from rankscope.config.cluster import parse_cluster
from rankscope.config.errors import ConfigError
from rankscope.coordinator.logic.core import CoordinatorCore
from rankscope.coordinator.logic.synthetic import SyntheticTraining

ACT, PARAM, GRAD = "Cell.layer1.", "Sentinel.param.layer2.", "Sentinel.grad_local.layer3."


def _set(b, col, **stats):
    for key, idx in (("max", 0), ("min", 1), ("mean", 2), ("norm", 3)):
        if key in stats:
            b.stats[col, idx] = stats[key]


# condition rule, tensor prefix, fault injected on rank 2 (batch, column, previous batch of rank 2)
CASES = {
    "TO": ({"condition": "TO"}, ACT, lambda b, c, prev: b.nan_count.__setitem__(c, 7)),
    "TZ": ({"condition": "TZ", "zero_pct_ge": 100, "names": ["Cell.*"]}, ACT,
           lambda b, c, prev: _set(b, c, max=0.0, min=0.0, mean=0.0, norm=0.0)),
    "TR": ({"condition": "TR", "range_gt": 1000}, ACT, lambda b, c, prev: _set(b, c, max=600.0, min=-600.0)),
    "AR": ({"condition": "AR", "range_lt": 1e-6}, ACT, lambda b, c, prev: _set(b, c, max=0.5, min=0.5, mean=0.5)),
    "TL": ({"condition": "TL", "max_gt": 1e4}, ACT, lambda b, c, prev: _set(b, c, max=2e4)),
    "TS": ({"condition": "TS", "min_lt": -1e4}, ACT, lambda b, c, prev: _set(b, c, min=-2e4)),
    "WCL": ({"condition": "WCL", "change_ratio_gt": 0.5}, PARAM,
            lambda b, c, prev: _set(b, c, norm=3 * b.stats[c, 3])),
    "WCS": ({"condition": "WCS", "change_ratio_lt": 1e-12}, PARAM,
            lambda b, c, prev: _set(b, c, norm=prev.stats[c, 3])),
    "WI": ({"condition": "WI", "zero_pct_ge": 100}, PARAM,
           lambda b, c, prev: _set(b, c, max=0.0, min=0.0, mean=0.0, norm=0.0)),
    "WNC": ({"condition": "WNC"}, PARAM, lambda b, c, prev: (b.crc32.__setitem__(c, prev.crc32[c]),
                                                            b.stats.__setitem__(c, prev.stats[c]))),
    "WO": ({"condition": "WO"}, PARAM, lambda b, c, prev: b.inf_count.__setitem__(c, 1)),
    "WL": ({"condition": "WL", "mean_gt": 10}, PARAM, lambda b, c, prev: _set(b, c, mean=20.0)),
    "WS": ({"condition": "WS", "rms_lt": 1e-9}, PARAM, lambda b, c, prev: _set(b, c, norm=1e-9)),
    "GE": ({"condition": "GE"}, GRAD, lambda b, c, prev: b.nan_count.__setitem__(c, 3)),
    "GL": ({"condition": "GL", "rms_gt": 100}, GRAD, lambda b, c, prev: _set(b, c, norm=1e9)),
    "GV": ({"condition": "GV", "max_lt": 1e-10}, GRAD, lambda b, c, prev: _set(b, c, max=0.0, min=0.0, norm=0.0)),
}


@pytest.mark.parametrize("cond", sorted(CASES))
def test_each_condition_names_the_rank_step_and_tensor(cond: str) -> None:
    rule, prefix, inject = CASES[cond]
    fault_step = 0 if cond == "WI" else 4  # WI checks a weight's initial value only
    sim = SyntheticTraining(ranks=4, tensors=32, seed=11)
    col = sim.column(prefix)
    clock = FakeClock()
    core = CoordinatorCore({"watchpoints": [rule]}, clock=clock)
    found, prev = [], None
    for step in range(8):
        batches = sim.batches(step)
        if step == fault_step:
            inject(batches[2], col, prev)
        prev = batches[2]
        found += feed_step(core, clock, batches)
    hits = [v for v in found if v.detector == "watchpoint"]
    assert [(v.rank, v.step, v.tensor) for v in hits] == [(2, fault_step, sim.names[col])]
    ev = hits[0].evidence
    assert ev["condition"] == cond and ev["rule"]["condition"] == cond
    if ev["threshold"] is not None:
        assert ev["actual"] is not None


def test_rules_are_ordered_by_execution_and_ties_named() -> None:
    sim = SyntheticTraining(ranks=4, tensors=32, seed=12)
    clock = FakeClock()
    core = CoordinatorCore({"watchpoints": [{"condition": "GE"}, {"condition": "TO", "kinds": ["forward"]}]},
                           clock=clock)
    batches = sim.batches(0)
    batches[3].nan_count[sim.column(GRAD)] = 1
    batches[1].nan_count[sim.column(ACT)] = 1  # forward runs before backward: first
    batches[0].nan_count[sim.column(ACT)] = 1
    hits = [v for v in feed_step(core, clock, batches) if v.detector == "watchpoint"]
    assert [(v.rank, v.ties, v.tensor) for v in hits] == [(0, [1], sim.names[sim.column(ACT)])]
    assert hits[0].evidence["rules_hit"] == ["wp0-GE", "wp1-TO"]


def test_watchpoints_can_be_set_at_run_time() -> None:
    sim = SyntheticTraining(ranks=4, tensors=32, seed=13)
    clock = FakeClock()
    core = CoordinatorCore({}, clock=clock)
    col = sim.column(ACT)
    batches = sim.batches(0)
    _set(batches[1], col, max=5e4)
    assert [v for v in feed_step(core, clock, batches) if v.detector == "watchpoint"] == []
    core.set_watchpoints([{"condition": "TL", "max_gt": 1e4, "id": "big-act"}])
    batches = sim.batches(1)
    _set(batches[1], col, max=5e4)
    [v] = [v for v in feed_step(core, clock, batches) if v.detector == "watchpoint"]
    assert (v.rank, v.step, v.evidence["rule"]["id"]) == (1, 1, "big-act")
    with pytest.raises(ConfigError, match=r"watchpoints\[0\]\.max_gt"):
        core.set_watchpoints([{"condition": "TL", "max_gt": "big"}])


@pytest.mark.parametrize("rules, field", [
    ([{"condition": "XX"}], "cluster.watchpoints[0].condition"),
    ([{"condition": "OO"}], "cluster.watchpoints[0].condition"),
    ([{"condition": "TL"}], "cluster.watchpoints[0]"),
    ([{"condition": "TL", "max_lt": 1}], "cluster.watchpoints[0].max_lt"),
    ([{"condition": "TR", "in_range_pct_gt": 50}], "cluster.watchpoints[0].in_range_pct_gt"),
    ([{"condition": "GL", "abs_mean_gt": 1}], "cluster.watchpoints[0].abs_mean_gt"),
    ([{"condition": "TO", "kinds": ["weights"]}], "cluster.watchpoints[0].kinds"),
    ([{"condition": "TZ", "zero_pct_ge": 150}], "cluster.watchpoints[0].zero_pct_ge"),
    ({"condition": "TO"}, "cluster.watchpoints"),
])
def test_bad_rules_are_refused_naming_the_field(rules, field) -> None:
    with pytest.raises(ConfigError) as err:
        parse_cluster({"watchpoints": rules})
    assert err.value.field == field
    assert field in str(err.value)
