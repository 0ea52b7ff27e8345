"""K ingest shards + the verdict merge name the same first divergence as one core.

Random clean training streams (SyntheticTraining, random ranks, tensors and seed) get
random faults (NaN before and after the reduction, outliers, replica mismatches, ranks
missing a step, the same fault on two ranks at once); the verdicts, in order, must be
those of one CoordinatorCore for every shard count.
"""
from __future__ import annotations

import numpy as np
import pytest
from logic_helpers import FakeClock, with_moment

from rankscope.coordinator.logic.core import CoordinatorCore
from rankscope.coordinator.logic.shards.merge import VerdictMerge, merge_step
from rankscope.coordinator.logic.shards.shard import ShardCore, ShardFindings
from rankscope.coordinator.logic.shards.sharded import ShardedCore
from rankscope.coordinator.logic.synthetic import SyntheticTraining
from rankscope.coordinator.logic.verdict import Verdict
from rankscope.wire.records import Kind

SETTINGS = {"deadline_s": 1.5, "detectors": {"progress": {"lag_steps": 4}}}


def _scenario(seed: int):
    rng = np.random.default_rng(seed)
    ranks, tensors, steps = int(rng.integers(3, 13)), int(rng.integers(9, 41)), 12
    sim = SyntheticTraining(ranks=ranks, tensors=tensors, seed=seed, total_steps=200)
    stream = [sim.batches(s) for s in range(steps)]
    kinds = sim.kinds
    pre = np.flatnonzero(np.isin(kinds, [Kind.FORWARD, Kind.GRAD_LOCAL, Kind.LOSS]))
    repl = np.flatnonzero(np.isin(kinds, [Kind.PARAM, Kind.GRAD_REDUCED]))
    dropped: set[tuple[int, int]] = set()
    for _ in range(int(rng.integers(1, 4))):
        what = rng.choice(["nan", "nan_spread", "outlier", "replica", "missing"])
        step = int(rng.integers(1, steps))
        who = [int(rng.integers(ranks))]
        if rng.random() < 0.3:
            who.append(int(rng.integers(ranks)))  # the same fault on a second rank: a tie
        for r in who:
            b = stream[step][r]
            if what == "nan":
                b.nan_count[int(rng.choice(np.r_[pre, repl]))] = 3
            elif what == "nan_spread":
                # The origin's local record, and a replicated record on every rank
                # (it may execute earlier and sit in another shard).
                b.nan_count[int(rng.choice(pre))] = 1
                spread = int(rng.choice(repl))
                for other in stream[step]:
                    other.nan_count[spread] = 5
            elif what == "outlier":
                col = int(rng.choice(pre))
                b.stats[col] *= 1e4
            elif what == "replica":
                b.crc32[int(rng.choice(repl))] ^= 0x5A5A
            else:
                dropped.add((step, r))
    return sim, [[b for b in batches if (s, b.rank) not in dropped] for s, batches in enumerate(stream)]


def _run(core, sim, stream) -> list[tuple]:
    clock = core.clock
    for r in sim.rank_ids:
        core.on_register(sim.job, int(r), {"world_size": sim.ranks})
    found: list[Verdict] = []
    for batches in stream:
        for b in batches:
            core.on_step(b)
        clock.advance(1.0)
        found += core.tick()
    clock.advance(5.0)
    found += core.tick()
    found += core.drain()
    return [(v.detector, v.rank, v.step, v.tensor, tuple(v.ties)) for v in found]


def _plain(sim, stream):
    return _run(CoordinatorCore(SETTINGS, clock=FakeClock()), sim, stream)


def _sharded(sim, stream, k):
    clock = FakeClock()
    sc = ShardedCore(SETTINGS, clock, k)
    sc.clock = clock
    return _run(sc, sim, stream)


@pytest.mark.parametrize("seed", range(24))
def test_k_shards_give_the_verdicts_of_one_core(seed) -> None:
    sim, stream = _scenario(seed)
    want = _plain(sim, stream)
    assert want, "every scenario has at least one fault"
    for k in (1, 2, 4, 8):
        assert _sharded(sim, stream, k) == want, f"{k} shards"


def test_a_nan_before_reduction_outranks_an_earlier_replicated_one_in_another_shard() -> None:
    sim = SyntheticTraining(ranks=4, tensors=13, seed=1)
    batches = sim.batches(0)
    local = sim.column("Sentinel.grad_local")
    param = sim.column("Sentinel.param")  # executes first, but is a replicated kind
    batches[2].nan_count[local] = 1
    for b in batches:
        b.nan_count[param] = 1
    one = CoordinatorCore({}, clock=FakeClock())
    clock = FakeClock()
    sc = ShardedCore({}, clock, 2)
    assert sc.map.of_kind[Kind.GRAD_LOCAL] != sc.map.of_kind[Kind.PARAM]
    for core in (one, sc):
        for r in range(4):
            core.on_register(sim.job, r, {"world_size": 4})
        for b in batches:
            core.on_step(b)
    [v1] = [v for v in one.drain() if v.detector == "nan_origin"]
    [v2] = [v for v in sc.drain() if v.detector == "nan_origin"]
    assert (v1.rank, v1.tensor) == (v2.rank, v2.tensor) == (2, sim.names[local])


def test_a_step_is_held_until_every_shard_judged_it() -> None:
    m = VerdictMerge(2)
    v = Verdict("outlier", 3, 7, "t", 5, "loss", "j/0")
    m.add(ShardFindings(0, steps=[(7, v)], judged={"j/0": 7}))
    assert m.release() == []
    assert m.judged_through("j/0") == -1
    m.add(ShardFindings(1, judged={"j/0": 6}))
    assert m.release() == []
    m.add(ShardFindings(1, judged={"j/0": 7}))
    assert m.release() == [v] and m.pending() == 0
    with pytest.raises(ValueError, match="shard: 2"):
        m.add(ShardFindings(2))


def test_ties_across_shards_are_merged_and_copies_dropped() -> None:
    a = Verdict("outlier", 5, 1, "x", 9, "loss", "j/0", ties=[7])
    b = Verdict("outlier", 2, 1, "y", 9, "forward", "j/0")
    later = Verdict("outlier", 0, 1, "z", 10, "forward", "j/0")
    [v] = merge_step([a, b, later])
    assert (v.rank, v.tensor, v.ties) == (2, "y", [5, 7])
    miss = Verdict("progress", 1, 1, None, None, None, "j/0", ties=[4])
    assert merge_step([miss, miss]) == [miss]
    m = VerdictMerge(2)
    lost = Verdict("progress", 3, 4, None, None, None, "j/0", urgent=True)
    m.add(ShardFindings(0, other=[lost]))
    m.add(ShardFindings(1, other=[lost]))
    assert m.release() == [lost]


def test_a_lagging_rank_is_a_finding_and_memory_stays_bounded() -> None:
    """One rank never reports again; no deadline in sight: each shard holds at most
    max_pending_steps steps, and the rank is named as by one core."""
    settings = {"deadline_s": 1e9, "max_pending_steps": 8, "detectors": {"progress": {"lag_steps": None}}}
    sim = SyntheticTraining(ranks=4, tensors=16, seed=3)
    stream = [[b for b in sim.batches(s) if not (s >= 2 and b.rank == 1)] for s in range(60)]
    clock = FakeClock()
    sc = ShardedCore(settings, clock, 4)
    one = CoordinatorCore(settings, clock=FakeClock())
    got = {}
    for name, core in (("one", one), ("sharded", sc)):
        for r in range(4):
            core.on_register(sim.job, r, {"world_size": 4})
        found = []
        for batches in stream:
            for b in batches:
                core.on_step(b)
            found += core.tick()
            for s in getattr(core, "shards", []):
                assert s.aligner.pending_steps() <= 9
        got[name] = [(v.detector, v.rank, v.step) for v in found]
    assert got["one"] == got["sharded"] and got["one"][0] == ("progress", 1, 2)


def test_a_shard_is_not_ticked_like_a_core() -> None:
    with pytest.raises(TypeError, match="judge"):
        ShardCore({}).tick()


@pytest.mark.parametrize("lasts, other", [(True, False), (False, False), (True, True)])
def test_a_last_bit_optimizer_state_split_held_a_step_merges_as_one_core_judges_it(lasts, other) -> None:
    """The replica check holds such a split a step and names it for the step it began at
    (or not at all once it healed): the merge files it under that step, as one core does,
    apart from another shard's replica finding of the step it was named at."""
    sim = SyntheticTraining(ranks=4, tensors=21, seed=5)
    m = with_moment(sim)
    stream = [sim.batches(s) for s in range(8)]
    for s in ([3, 4, 5, 6, 7] if lasts else [3]):
        stream[s][2].crc32[m] ^= 0x1
    if other:  # a weight of rank 1 split at step 4, judged in another shard
        stream[4][1].crc32[sim.column("Sentinel.param.layer0.")] ^= 0x5A5A
    want = _plain(sim, stream)
    assert [w[:3] for w in want][:2] == ([("replica", 2, 3)] if lasts else []) + ([("replica", 1, 4)] if other else [])
    for k in (2, 4):
        assert _sharded(sim, stream, k) == want, f"{k} shards"
