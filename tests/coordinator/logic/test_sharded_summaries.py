"""K ingest shards leave the verdict side what one core keeps from the records it judged:
the same coverage, the same report curves and the same proof around each verdict."""
from __future__ import annotations

import json

import numpy as np
import pytest
from logic_helpers import FakeClock
from test_sharded_verdicts import SETTINGS, _scenario

from rankscope.coordinator.logic.core import CoordinatorCore
from rankscope.coordinator.logic.views.coverage import ShardedCoverage, StepRanges, describe
from rankscope.coordinator.logic.shards.sharded import ShardedCore
from rankscope.coordinator.logic.shards.summaries import combine_rows, merge_counters, merge_proofs


def _run(core, sim, stream):
    for r in sim.rank_ids:
        core.on_register(sim.job, int(r), {"world_size": sim.ranks})
    found = []
    for batches in stream:
        for b in batches:
            core.on_step(b)
        core.clock.advance(1.0)
        found += core.tick()
    core.clock.advance(5.0)
    found += core.tick() + core.drain()
    return found


def _kept(core, found) -> str:
    """Everything users get from the records besides verdicts, as one comparable text."""
    plain = getattr(core, "core", core)
    proof = core.proof if hasattr(core, "proof") else plain.series.recent.proof
    return json.dumps({"coverage": plain.coverage_report(found[0].job if found else "j"),
                       "series": plain.series.to_dict(),
                       "proofs": [proof(v.to_dict()) for v in found]}, sort_keys=True, default=str)


@pytest.mark.parametrize("seed", range(12))
def test_k_shards_keep_what_one_core_keeps(seed) -> None:
    sim, stream = _scenario(seed)
    one = CoordinatorCore(SETTINGS, clock=FakeClock())
    want = _kept(one, _run(one, sim, stream))
    assert '"steps": [0, 11]' in want
    for k in (2, 3, 8):
        sc = ShardedCore(SETTINGS, FakeClock(), k)
        sc.clock = sc.core.clock
        assert _kept(sc, _run(sc, sim, stream)) == want, f"{k} shards"


@pytest.mark.parametrize("seed", range(6))
def test_k_shards_counters_merge_to_one_cores(seed) -> None:
    """What a sharded coordinator's status shows as its counters (the verdict side takes no
    records itself): records added over the shards, steps as any shard judged them."""
    sim, stream = _scenario(seed)
    one = CoordinatorCore(SETTINGS, clock=FakeClock())
    _run(one, sim, stream)
    want = dict(one.aligner.counters)
    assert want["records"] > 0 and want["steps_judged"] == 12
    for k in (2, 3):
        sc = ShardedCore(SETTINGS, FakeClock(), k)
        sc.clock = sc.core.clock
        _run(sc, sim, stream)
        got = merge_counters([dict(s.aligner.counters) for s in sc.shards])
        assert {c: got[c] for c in ("records", "steps_judged", "steps_by_deadline", "late_records",
                                    "unknown_name_records")} == \
            {c: want[c] for c in ("records", "steps_judged", "steps_by_deadline", "late_records",
                                  "unknown_name_records")}, f"{k} shards"


def test_a_step_one_shard_did_not_judge_is_not_seen() -> None:
    cov = ShardedCoverage(2)
    for step in range(10):
        cov.judged_by(0, "j", step, [0, 1])
        if step != 4:
            cov.judged_by(1, "j", step, [0, 1] if step != 7 else [0])
    cov.dropped("j", 1, 3)
    report = cov.report("j", {0: None, 1: None})
    assert report["not_seen"] == [{"rank": 0, "steps": [[4, 4]]}, {"rank": 1, "steps": [[4, 4], [7, 7]],
                                                                   "dropped_steps": 3}]
    assert describe(report) == ("watched steps 0-9 on 2/2 ranks; rank 0 step 4 not seen; "
                                "rank 1 steps 4, 7 not seen (3 step(s) dropped in the rank)")


def test_step_ranges_intersect() -> None:
    a, b = StepRanges(), StepRanges()
    for s in [*range(0, 5), *range(8, 12), 20]:
        a.add(s)
    for s in [*range(3, 9), *range(11, 21)]:
        b.add(s)
    assert a.intersection(b).ranges() == [(3, 4), (8, 8), (11, 11), (20, 20)]
    assert a.intersection(StepRanges()).ranges() == []


def test_rows_from_shards_that_order_ranks_differently_join_by_rank() -> None:
    nan = np.nan
    a = ([0, 1, 2], (5, (np.array([1.0, 2.0, 3.0]), np.ones(3, bool)), (np.full(3, nan), np.zeros(3, bool)),
                     np.array([0.1, nan, 0.3])))
    b = ([2, 0, 1], (5, (np.full(3, nan), np.zeros(3, bool)), (np.array([9.0, 7.0, 8.0]), np.ones(3, bool)),
                     np.array([0.0, 0.5, nan])))
    ranks, (step, (loss, _), (grad, _), dev) = combine_rows([a, b])
    assert ranks == [0, 1, 2] and step == 5
    assert loss.tolist() == [1.0, 2.0, 3.0] and grad.tolist() == [7.0, 8.0, 9.0]
    assert dev[0] == 0.5 and np.isnan(dev[1]) and dev[2] == 0.3


def test_proofs_join_the_owner_window_and_every_shard_chain_in_order() -> None:
    def row(step, ex):
        return {"step": step, "exec_index": ex, "tensor": f"t{step}.{ex}"}
    p0 = {"tensor_window": {"tensor": "a"}, "nonfinite_chain": {"from_step": 3, "records": [row(3, 5), row(4, 1)],
                                                                "more": 0}}
    p1 = {"tensor_window": {"tensor": "b"}, "nonfinite_chain": {"from_step": 3, "records": [row(3, 2), row(3, None)],
                                                                "more": 0}}
    out = merge_proofs([p0, p1], owner=1)
    assert out["tensor_window"] == {"tensor": "b"}
    assert [r["tensor"] for r in out["nonfinite_chain"]["records"]] == ["t3.2", "t3.5", "t3.None", "t4.1"]
    assert merge_proofs([{}, {}]) == {}


def test_a_restarted_shard_is_told_the_job_as_the_verdict_side_knows_it() -> None:
    from rankscope.coordinator.logic.shards.shard import ShardCore, resync_events
    core = CoordinatorCore({}, clock=FakeClock())
    for r in range(4):
        core.on_register("j", r, {"world_size": 4, "pid": 100 + r, "host": "h"})
    core.on_rank_lost("j", 1, 3, 9, "killed", signal=9)
    core.on_rank_finished("j", 2, 5)
    core.terminated_jobs.add("old")
    shard = ShardCore({}, FakeClock(), shard=1)
    for name, args, kw in resync_events(core):
        getattr(shard, name)(*args, **kw)
    def states(c):
        return {k: (r.state, r.info.get("pid"), r.last_step) for k, r in c.aligner.ranks.items()}
    assert states(shard) == states(core) and shard.terminated_jobs == {"old"}
