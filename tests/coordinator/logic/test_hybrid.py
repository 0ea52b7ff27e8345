"""Hybrid parallel judging, logic only: a data x tensor parallel job's shards differ by
design, replicas must match, two replicas decide from evidence that needs no majority,
and a verdict that cannot name a rank never stops the job."""
from __future__ import annotations

import numpy as np

from rankscope.coordinator.logic.core import CoordinatorCore
from rankscope.coordinator.logic.incidents.incident import ActionKind
from tests.coordinator.logic.hybrid_sim import HybridTraining, tp_facts
from tests.logic_helpers import FakeClock, feed_step


def _core(settings: dict | None = None, facts: bool = True, ranks: int = 4,
          export_dir=None) -> tuple[CoordinatorCore, FakeClock]:
    clock = FakeClock()
    core = CoordinatorCore({"on_divergence": "terminate", **(settings or {})}, clock=clock, export_dir=export_dir)
    for r in range(ranks):
        core.on_register("hybrid", r, {"world_size": ranks, "pid": 100 + r, "layout": facts})
        if facts:
            core.on_layout("hybrid", r, tp_facts(r))
    return core, clock


def _run(core: CoordinatorCore, clock: FakeClock, sim: HybridTraining, steps: int, fault=None) -> list:
    found = []
    for step in range(steps):
        batches = sim.batches(step)
        if fault is not None:
            fault(step, batches)
        found += feed_step(core, clock, batches)
    return found


def test_the_layout_line_names_replicas_and_shards():
    core, _ = _core()
    assert core.layout("hybrid")["line"] == ("2 data-parallel replicas x 2 tensor-parallel shards; replicas {0,2} {1,3} "
                                             "(from gradient reducer groups)")


def test_a_clean_hybrid_job_raises_nothing_though_its_shards_differ():
    core, clock = _core()
    assert _run(core, clock, HybridTraining(seed=1), 40) == []


def test_without_its_layout_the_same_job_is_flagged_at_step_zero():
    """Ranks that say nothing of their layout (a probe from before layouts): every rank is
    taken for a replica, as plain data parallelism has it, and the shards differ."""
    core, clock = _core(facts=False)
    found = _run(core, clock, HybridTraining(seed=1), 3)
    assert found and found[0].detector == "replica" and found[0].step == 0


def test_local_gradients_x50_on_one_of_two_replicas_name_that_rank():
    sim = HybridTraining(seed=2)
    g = sim.col("Sentinel.grad_local.fc1")

    def scale(step, batches):
        if step == 5:
            batches[3].stats[g, :] *= 50

    core, clock = _core()
    found = _run(core, clock, sim, 8, scale)
    v = found[0]
    assert (v.detector, v.rank, v.step, v.decided) == ("outlier", 3, 5, True), found
    assert v.evidence["other_replica"] == 1 and "tensor-parallel peers" in v.evidence["rule"]


def test_a_nudged_weight_on_one_of_two_replicas_names_that_rank_by_its_own_update():
    sim = HybridTraining(seed=3)
    p = sim.col("Sentinel.param.fc0")

    def nudge(step, batches):
        if step >= 4:  # the nudge stays in the weights from then on
            batches[3].crc32[p] += 1

    core, clock = _core()
    found = _run(core, clock, sim, 8, nudge)
    v = found[0]
    assert (v.detector, v.rank, v.step, v.decided) == ("replica", 3, 4, True), found
    assert "outside the optimizer" in v.evidence["rule"]


def test_a_nudged_weight_is_named_when_the_coordinator_judges_many_steps_at_once():
    """A coordinator running behind finds several steps ready in one pass: each step is
    still compared with the one judged just before it."""
    sim = HybridTraining(seed=3)
    p = sim.col("Sentinel.param.fc0")
    core, clock = _core()
    for step in range(8):
        batches = sim.batches(step)
        if step >= 4:
            batches[3].crc32[p] += 1
        for b in batches:
            core.on_step(b)
    clock.advance(0.1)
    found = core.tick()
    v = found[0]
    assert (v.detector, v.rank, v.step, v.decided) == ("replica", 3, 4, True), found
    assert "outside the optimizer" in v.evidence["rule"]


def test_two_replicas_that_differ_with_no_evidence_name_nobody_and_the_job_runs_on():
    sim = HybridTraining(seed=4)
    g = sim.col("Sentinel.grad_reduced.fc2")

    def flip(step, batches):
        if step == 6:
            batches[1].crc32[g] ^= 1  # one reduced gradient's bits: which replica is right?

    core, clock = _core()
    found = _run(core, clock, sim, 8, flip)
    v = found[0]
    assert (v.detector, v.step, v.decided, v.candidates) == ("replica", 6, False, [1, 3])
    [doc] = core.documents()
    assert doc["first_diverging_rank"] is None and doc["undecided_between"] == [1, 3]
    actions = core.take_actions()
    assert ActionKind.EXPORT in {a.kind for a in actions}
    assert not {ActionKind.PAUSE, ActionKind.TERMINATE} & {a.kind for a in actions}


def test_a_named_rank_after_an_undecided_incident_gets_its_own_incident_and_action(tmp_path):
    sim = HybridTraining(seed=5)
    g, p = sim.col("Sentinel.grad_reduced.fc2"), sim.col("Sentinel.param.fc0")

    def faults(step, batches):
        if step == 3:
            batches[1].crc32[g] ^= 1
        if step >= 4:
            batches[2].crc32[p] += 1

    core, clock = _core(export_dir=tmp_path)
    _run(core, clock, sim, 5, faults)
    [first] = core.incidents()
    assert first["verdict"]["decided"] is False and first["policy"] == "continue"
    for r in range(4):  # the undecided incident's export completes; it ends, the job ran on
        core.on_bundle(first["incident_id"], r, str(tmp_path / f"b{r}"))
    clock.advance(0.1)
    core.tick()
    core.write_incident(first["incident_id"])
    clock.advance(0.1)
    core.tick()
    named = [i for i in core.incidents() if i["verdict"]["decided"]]
    assert [(i["verdict"]["rank"], i["verdict"]["step"], i["policy"]) for i in named] == [(2, 4, "terminate")]
    assert ActionKind.PAUSE in {a.kind for a in core.take_actions() if a.incident_id == named[0]["incident_id"]}


def test_the_first_non_finite_record_of_a_receiver_does_not_make_it_the_origin():
    sim = HybridTraining(seed=6)
    inp = sim.col("Sentinel.collective.tp_{d}.AllReduce.0.input")
    out = sim.col("Sentinel.collective.tp_{d}.AllReduce.0.output")
    loss = sim.col("Sentinel.loss")

    def nan(step, batches):
        if step == 2:
            batches[0].nan_count[out] = 4  # rank 0 received the NaN (its input was finite)...
            batches[1].nan_count[inp] = 1  # ...from rank 1, whose partial sum went NaN
            batches[1].nan_count[out] = 4
            batches[1].exec_index[inp] = 40  # recorded late in rank 1's order
            batches[1].exec_index[out] = 41
            batches[0].nan_count[loss] = 1

    core, clock = _core()
    v = _run(core, clock, sim, 4, nan)[0]
    assert (v.detector, v.rank, v.step) == ("nan_origin", 1, 2)
    assert v.evidence["received_through_a_collective"] == [0]


def test_a_tensor_parallel_allreduce_output_must_match_inside_its_group():
    sim = HybridTraining(seed=7)
    out = sim.col("Sentinel.collective.tp_{d}.AllReduce.0.output")

    def corrupt(step, batches):
        if step == 3:
            batches[2].crc32[out] += 1  # rank 2 got other bits than rank 3 from one AllReduce

    core, clock = _core()
    v = _run(core, clock, sim, 5, corrupt)[0]
    assert (v.detector, v.step, v.decided, v.candidates) == ("replica", 3, False, [2, 3])
    assert v.tensor == "Sentinel.collective.tp_1.AllReduce.0.output.0"


def test_a_step_waits_for_the_layout_of_every_rank_that_reported_it():
    clock = FakeClock()
    core = CoordinatorCore({"on_divergence": "terminate"}, clock=clock)
    for r in range(4):
        core.on_register("hybrid", r, {"world_size": 4, "pid": 100 + r, "layout": True})
    sim = HybridTraining(seed=8)
    assert feed_step(core, clock, sim.batches(0)) == []
    assert core.aligner.counters["steps_judged"] == 0  # every rank's step is in, not their layouts
    for r in range(4):
        core.on_layout("hybrid", r, tp_facts(r))
    clock.advance(0.1)
    assert core.tick() == [] and core.aligner.counters["steps_judged"] == 1


def test_a_layout_that_never_comes_holds_a_step_no_longer_than_the_deadline():
    clock = FakeClock()
    core = CoordinatorCore({"deadline_s": 5}, clock=clock)
    for r in range(4):
        core.on_register("hybrid", r, {"world_size": 4, "pid": 100 + r, "layout": True})
    sim = HybridTraining(seed=9)
    feed_step(core, clock, sim.batches(0))
    clock.advance(5.1)
    core.tick()
    assert core.aligner.counters["steps_judged"] == 1
    feed_step(core, clock, sim.batches(1))  # waited for once: the next step is not held again
    assert core.aligner.counters["steps_judged"] == 2


def test_cluster_layout_overrides_what_ranks_say():
    core, clock = _core({"layout": {"data_parallel": 4}}, ranks=4)
    assert core.layout("hybrid")["whole"] is True
    found = _run(core, clock, HybridTraining(seed=1), 2)
    assert found and found[0].detector == "replica"  # told every rank is a replica: the shards differ


def test_outlier_statistics_compare_ranks_of_one_role_only():
    """Shard 1's gradients are x6 shard 0's by design: never an outlier."""
    sim = HybridTraining(seed=10, tp=2, dp=4)
    sim.shard_level[1] *= 6
    clock = FakeClock()
    core = CoordinatorCore({}, clock=clock)
    for r in range(8):
        core.on_register("hybrid", r, {"world_size": 8, "pid": r, "layout": True})
        core.on_layout("hybrid", r, tp_facts(r, tp=2, dp=4))
    assert _run(core, clock, sim, 30) == []
    assert np.array_equal(core.aligner.sets_of(core.aligner.groups[("hybrid", 0)]).role_of,
                          [0, 1, 0, 1, 0, 1, 0, 1])


def test_a_replica_whose_whole_batch_is_harder_is_no_finding():
    """Both shards of replica 1 see x50 gradients: its batch, not a rank (a victim's peers
    agree with it)."""
    sim = HybridTraining(seed=11)
    g = sim.col("Sentinel.grad_local.fc1")

    def harder(step, batches):
        if step == 6:
            for r in (2, 3):
                batches[r].stats[g, :] *= 50

    core, clock = _core()
    assert _run(core, clock, sim, 10, harder) == []


def test_gradients_at_round_off_level_are_no_finding_between_two_replicas():
    """A gradient that is ~0 everywhere (a degenerate layer) jumps by orders of magnitude
    from step to step and rank to rank: noise, whatever its ratios."""
    sim = HybridTraining(seed=12)
    g = sim.col("Sentinel.grad_local.fc2")
    rng = np.random.default_rng(3)

    def noise(step, batches):
        for b in batches:
            b.stats[g, :] = 1e-7 * np.exp(3.0 * rng.standard_normal())

    core, clock = _core()
    assert _run(core, clock, sim, 40, noise) == []


def test_a_split_left_by_a_rank_already_named_is_not_a_new_finding():
    """Rank 3's weights drift (named by its replica check); when its one replica then
    disagrees with it again, that is the same finding, not an undecided new one."""
    sim = HybridTraining(seed=13)
    start, end = sim.col("Sentinel.param.fc1"), sim.col("Sentinel.param_end.fc1")

    def drift(step, batches):
        if step >= 4:  # changed before step 4, and trained on from there
            batches[3].crc32[start] += 1
            batches[3].crc32[end] += 1

    core, clock = _core()
    found = _run(core, clock, sim, 9, drift)
    assert [(v.detector, v.rank, v.step, v.decided) for v in found] == [("replica", 3, 4, True),
                                                                        ("param_moved", 3, 4, True)]


def test_plain_data_parallel_of_two_ranks_decides_from_history_too():
    """Two data-parallel ranks, no tensor parallelism: the rank whose local gradients rose
    against its own history while its replica's did not."""
    from rankscope.coordinator.logic.synthetic import SyntheticTraining
    sim = SyntheticTraining(ranks=2, tensors=16, seed=14)
    g = sim.column("Sentinel.grad_local.layer1.")
    clock = FakeClock()
    core = CoordinatorCore({}, clock=clock)
    found = []
    for step in range(30):
        batches = sim.batches(step)
        if step == 8:  # before 20 steps of history: the history test of many ranks is not armed
            batches[1].stats[g, :] *= 50
        found += feed_step(core, clock, batches)
    assert [(v.detector, v.rank, v.step) for v in found] == [("outlier", 1, 8)]
    assert "own history" in found[0].evidence["rule"]


def test_plain_data_parallel_of_two_ranks_stays_quiet_when_clean():
    from rankscope.coordinator.logic.synthetic import SyntheticTraining
    sim = SyntheticTraining(ranks=2, tensors=32, seed=15)
    clock = FakeClock()
    core = CoordinatorCore({}, clock=clock)
    assert [v for step in range(600) for v in feed_step(core, clock, sim.batches(step))] == []


def _norm_split(sim: HybridTraining, shards: tuple[int, ...], from_step: int = 1):
    """From ``from_step`` on, the norm weight of each shard in ``shards`` learns from that
    shard's half only: every replica's copy of the shard takes the same value."""
    g = sim.col("Sentinel.param.norm.gamma")

    def split(step, batches):
        if step >= from_step:
            for b in batches:
                if b.rank % sim.tp in shards:
                    b.crc32[g] += 1 + b.rank % sim.tp
                    b.stats[g, 3] += 0.01 * (1 + b.rank % sim.tp)
    return split


def test_a_norm_weight_split_between_every_tensor_parallel_pair_is_job_wide_and_names_the_missing_sum():
    sim = HybridTraining(seed=3, norm=True)
    core, clock = _core({"on_divergence": "terminate"})
    found = _run(core, clock, sim, 4, _norm_split(sim, (1,)))
    assert found, "expected a verdict"
    v = found[0]
    assert (v.detector, v.step, v.tensor, v.decided) == ("replica", 1, "Sentinel.param.norm.gamma", False)
    ev = v.evidence
    assert ev["systematic"] is True
    assert sorted(ev["agreeing_sets"]) == [[0, 2], [1, 3]]  # the replicas of a shard agree
    assert "not summed across the tensor-parallel group (ranks 0, 1; ranks 2, 3)" in ev["probable_cause"]
    kinds = {a.kind for a in core.take_actions()}  # no rank to blame: export and warn, never stop
    assert ActionKind.EXPORT in kinds and not {ActionKind.PAUSE, ActionKind.TERMINATE} & kinds


def test_a_clean_hybrid_job_with_a_replicated_norm_raises_nothing():
    core, clock = _core()
    assert _run(core, clock, HybridTraining(seed=4, norm=True), 30) == []


def test_a_norm_that_starts_apart_on_the_shards_is_taken_for_sharded_and_never_flagged():
    """A norm loaded per shard: its shards differ from the first step compared, so the
    group never held it as one value and nothing is learned."""
    sim = HybridTraining(seed=5, norm=True)
    core, clock = _core()
    assert _run(core, clock, sim, 6, _norm_split(sim, (1,), from_step=0)) == []


def test_one_rank_s_norm_split_from_its_peer_is_not_called_systematic():
    sim = HybridTraining(seed=6, norm=True)
    g = sim.col("Sentinel.param.norm.gamma")

    def one(step, batches):
        if step >= 2:
            batches[3].crc32[g] += 1
    core, clock = _core()
    found = _run(core, clock, sim, 4, one)
    assert found and found[0].tensor == "Sentinel.param.norm.gamma"
    assert "systematic" not in found[0].evidence


def test_a_job_wide_norm_split_names_no_rank_anywhere_in_its_incident(tmp_path):
    sim = HybridTraining(seed=7, norm=True)
    core, clock = _core(export_dir=tmp_path)
    [v, *_] = _run(core, clock, sim, 3, _norm_split(sim, (1,)))
    ev = v.evidence
    assert ev["deviating_ranks"] == [] and "replica_set" not in ev
    assert ev["copy_groups"] == [[0, 1], [2, 3]] and sorted(ev["crc32_by_rank"]) == ["0", "1", "2", "3"]
    assert v.summary() == ("replica: job-wide split at step 1 tensor Sentinel.param.norm.gamma: every rank runs it, "
                           "no rank named")
    [doc] = core.documents()
    assert doc["incident_id"].endswith("-replica-jobwide-s1")
    assert doc["undecided_between"] == [] and doc["first_diverging_rank"] is None
