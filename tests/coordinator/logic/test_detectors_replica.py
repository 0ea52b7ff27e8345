"""Replica consistency: what DP keeps identical must match bit for bit; minority flagged."""
from __future__ import annotations

import numpy as np
from logic_helpers import FakeClock, StepJudge, feed_step, view_of, with_moment

from rankscope.config.cluster import parse_cluster
from rankscope.coordinator.logic.core import CoordinatorCore
from rankscope.coordinator.logic.detectors.replica import ReplicaDetector
from rankscope.coordinator.logic.synthetic import SyntheticTraining
from rankscope.wire.records import NO_CRC


def test_rank_whose_param_crc_differs_is_named() -> None:
    sim = SyntheticTraining(ranks=8, tensors=32, seed=1)
    batches = sim.batches(0)
    p = sim.column("Sentinel.param.layer4.")
    batches[6].crc32[p] ^= 0x10  # one flipped bit in rank 6's copy of the weights
    [v] = ReplicaDetector().judge(view_of(batches), {})
    assert (v.rank, v.step, v.ties, v.kind) == (6, 0, [], "param")
    assert v.tensor == sim.names[p]
    assert v.evidence["majority"] is True and v.evidence["agreeing_ranks"] == 7
    assert v.evidence["crc32"] != v.evidence["majority_crc32"]


def test_stats_alone_must_match_bit_for_bit_when_no_checksum() -> None:
    sim = SyntheticTraining(ranks=4, tensors=32, seed=2)
    batches = sim.batches(0)
    g = sim.column("Sentinel.grad_reduced.layer1.")
    for b in batches:
        b.crc32[:] = NO_CRC
    batches[1].stats[g, 3] = np.nextafter(batches[1].stats[g, 3], np.inf)  # one ulp
    [v] = ReplicaDetector().judge(view_of(batches), {})
    assert (v.rank, v.kind) == (1, "grad_reduced")


def test_a_checksum_one_replica_did_not_take_this_step_is_no_split_but_its_stats_still_count() -> None:
    # Replicas rotating their fingerprints at different rates (the default watch): at this
    # step ranks 0-2 fingerprint a reduced gradient and rank 3 records only its norm.
    sim = SyntheticTraining(ranks=4, tensors=32, seed=2)
    batches = sim.batches(0)
    g = sim.column("Sentinel.grad_reduced.layer1.")
    for b in batches:
        b.crc32[g] = 0x5EED
    batches[3].crc32[g] = NO_CRC
    assert ReplicaDetector().judge(view_of(batches), {}) == []
    batches[3].stats[g, 3] = np.nextafter(batches[3].stats[g, 3], np.inf)  # its norm differs by one ulp
    [v] = ReplicaDetector().judge(view_of(batches), {})
    assert (v.rank, v.tensor) == (3, sim.names[g])
    batches = SyntheticTraining(ranks=4, tensors=32, seed=2).batches(0)
    batches[2].crc32[g] ^= 0x4  # every replica fingerprinted it: the checksum counts
    [v] = ReplicaDetector().judge(view_of(batches), {})
    assert (v.rank, v.tensor) == (2, sim.names[g])


def test_two_deviating_ranks_are_ties_and_two_rank_split_names_both() -> None:
    sim = SyntheticTraining(ranks=8, tensors=32, seed=3)
    batches = sim.batches(0)
    p = sim.column("Sentinel.param.layer0.")
    batches[5].crc32[p] += 1
    batches[2].crc32[p] += 2
    [v] = ReplicaDetector().judge(view_of(batches), {})
    assert (v.rank, v.ties) == (2, [5])

    sim2 = SyntheticTraining(ranks=2, tensors=32, seed=3)
    pair = sim2.batches(0)
    pair[1].crc32[p] += 1
    [v2] = ReplicaDetector().judge(view_of(pair), {})
    assert v2.evidence["majority"] is False
    assert sorted([v2.rank, *v2.ties]) == [0, 1]


def test_earliest_differing_record_wins() -> None:
    sim = SyntheticTraining(ranks=4, tensors=32, seed=4)
    batches = sim.batches(0)
    batches[3].crc32[sim.column("Sentinel.grad_reduced.layer2.")] += 1  # later in the step
    batches[1].crc32[sim.column("Sentinel.param.layer5.")] += 1  # at step start
    [v] = ReplicaDetector().judge(view_of(batches), {})
    assert v.rank == 1


def test_clean_replicas_and_legitimately_different_local_values_raise_nothing() -> None:
    sim = SyntheticTraining(ranks=8, tensors=32, seed=5)
    # local loss/grads/activations differ per rank in every synthetic step
    assert ReplicaDetector().judge(view_of(sim.batches(0)), {}) == []


def test_replicas_mode_compares_every_kind() -> None:
    sim = SyntheticTraining(ranks=4, tensors=32, seed=6, loss_noise=0, grad_noise=0, act_noise=0)
    sim.rank_offset[:] = 0  # identical input on every replica: identical activations
    batches = sim.batches(0)
    act = sim.column("Cell.layer2.")
    batches[2].stats[act, 2] *= 1.0001
    assert ReplicaDetector().judge(view_of(batches), {}) == []  # "dp": activations may differ
    [v] = ReplicaDetector().judge(view_of(batches, parse_cluster({"groups": "replicas"})), {})
    assert (v.rank, v.kind, v.tensor) == (2, "forward", sim.names[act])


def test_per_dp_group_replicas_hold_different_params_without_alarm() -> None:
    """Hybrid parallel: ranks 0-3 and 4-7 hold different shards; each group is its own replica set."""
    clock = FakeClock()
    core = CoordinatorCore({"groups": [[0, 1, 2, 3], [4, 5, 6, 7]]}, clock=clock)
    sim = SyntheticTraining(ranks=8, tensors=32, seed=7)
    p = sim.column("Sentinel.param.layer1.")
    found = []
    for step in range(30):
        batches = sim.batches(step)
        for b in batches[4:]:
            b.crc32[p] += 7  # the second group's shard differs from the first's
        if step == 20:
            batches[6].crc32[p] += 1
        found += feed_step(core, clock, batches)
    assert [(v.detector, v.rank, v.step, v.group) for v in found] == [("replica", 6, 20, f"{sim.job}/0")]
    assert found[0].evidence["replica_set"] == [4, 5, 6, 7]


def test_kinds_compared_are_configurable() -> None:
    sim = SyntheticTraining(ranks=4, tensors=32, seed=8)
    clock = FakeClock()
    core = CoordinatorCore({"detectors": {"replica": {"kinds": ["param"]}}}, clock=clock)
    batches = sim.batches(0)
    batches[2].crc32[sim.column("Sentinel.grad_reduced.layer0.")] += 1  # not compared any more
    assert feed_step(core, clock, batches) == []
    batches = sim.batches(1)
    batches[2].crc32[sim.column("Sentinel.param.layer0.")] += 1
    assert [(v.detector, v.rank) for v in feed_step(core, clock, batches)] == [("replica", 2)]


def test_inference_replicas_name_the_token() -> None:
    """DP inference workers given the same prompts: the verdict says which decode call parted."""
    sim = SyntheticTraining(ranks=3, tensors=32, seed=9, loss_noise=0, grad_noise=0, act_noise=0)
    sim.rank_offset[:] = 0
    batches = sim.batches(0)
    for b in batches:
        b.token = 4
    batches[1].stats[sim.column("Cell.layer0."), 3] += 1e-3
    [v] = ReplicaDetector().judge(view_of(batches, parse_cluster({"groups": "replicas"})), {})
    # "Cell.layer0.Dense.forward.0...": call 0 of the step, whose first recorded token is 4
    assert (v.rank, v.token, v.kind) == (1, 4, "forward")
    assert v.to_dict()["token"] == 4


def test_record_token_is_the_first_token_plus_the_call_index() -> None:
    from rankscope.coordinator.logic.detectors.common import record_token

    assert record_token(1, "Cell.layers.1.attn.qkv.Dense.forward.1.output.0") == 2
    assert record_token(1, "Cell.tok_emb.Embedding.forward.0.input.0") == 1
    assert record_token(3, "Cell.fc.Dense.backward.2.input.0") == 5
    assert record_token(-1, "Cell.fc.Dense.forward.2.output.0") is None  # not inference capture
    assert record_token(2, "Sentinel.loss") == 2


def test_weights_that_differ_at_the_first_step_watched_say_how_ranks_start_alike() -> None:
    sim = SyntheticTraining(ranks=4, tensors=32, seed=6)
    p = sim.column("Sentinel.param.layer3.")
    det, state, judge = ReplicaDetector(), {}, StepJudge()
    first = sim.batches(0)
    for i, b in enumerate(first):
        b.crc32[p] += i  # every rank initialised differently
    [v] = det.judge(judge.view(first), state)
    assert v.evidence["majority"] is False and "set_seed" in v.evidence["hint"]
    # A later split is training's doing, not the start's: no such hint.
    later = sim.batches(1)
    later[2].crc32[p] += 1
    [v1] = det.judge(judge.view(later), state)
    assert (v1.rank, v1.step) == (2, 1) and "hint" not in v1.evidence
    # Nor for a reduced gradient at the first step: weights were not what differed.
    g = sim.column("Sentinel.grad_reduced.layer1.")
    fresh = SyntheticTraining(ranks=4, tensors=32, seed=6).batches(0)
    fresh[1].crc32[g] += 1
    [vg] = ReplicaDetector().judge(view_of(fresh), {})
    assert vg.kind == "grad_reduced" and "hint" not in vg.evidence


def _with_moment(seed: int) -> tuple[SyntheticTraining, int]:
    """A job whose second weight's column is an Adam moment instead (optimizer state)."""
    sim = SyntheticTraining(ranks=4, tensors=32, seed=seed)
    return sim, with_moment(sim)


def _judge_steps(sim: SyntheticTraining, steps: int, fault) -> tuple[list, dict]:
    judge, det, state, found = StepJudge(), ReplicaDetector(), {}, []
    for step in range(steps):
        batches = sim.batches(step)
        fault(step, batches)
        found += det.judge(judge.view(batches), state)
    return found, state


def test_a_last_bit_split_of_optimizer_state_gone_at_the_next_step_is_no_finding() -> None:
    """Only the checksum differs (every statistic equal), and the next step agrees again:
    what a rounding difference of one element looks like, which fed nothing different on."""
    sim, m = _with_moment(21)

    def flip(step, batches):
        if step == 3:
            batches[2].crc32[m] ^= 0x1

    found, state = _judge_steps(sim, 6, flip)
    assert found == []
    assert state["healed"] == 1 and state["healed_last"] == [{"step": 3, "rank": 2, "tensor": sim.names[m]}]


def test_a_last_bit_split_of_optimizer_state_that_lasts_is_named_at_the_step_it_began() -> None:
    sim, m = _with_moment(22)

    def flip(step, batches):
        if step >= 3:  # corrupted state carries on
            batches[2].crc32[m] ^= 0x1

    found, state = _judge_steps(sim, 6, flip)
    v = found[0]
    assert (v.detector, v.rank, v.step, v.tensor) == ("replica", 2, 3, sim.names[m]), found
    assert v.evidence["stats_agree"] is True and "still split at step 4" in v.evidence["held_one_step"]
    assert "healed" not in state


def test_optimizer_state_whose_statistics_differ_is_named_at_once() -> None:
    sim, m = _with_moment(23)

    def drift(step, batches):
        if step == 3:
            batches[1].crc32[m] ^= 0x1
            batches[1].stats[m, 3] = np.nextafter(batches[1].stats[m, 3], np.inf)

    found, _ = _judge_steps(sim, 4, drift)
    [v] = found
    assert (v.rank, v.step, v.evidence["stats_agree"]) == (1, 3, False)
    assert "held_one_step" not in v.evidence


def test_a_held_split_is_named_when_the_next_step_is_not_seen() -> None:
    """The step after never reaches the judge (a gap): nothing shows the split healed."""
    sim, m = _with_moment(24)
    judge, det, state, found = StepJudge(), ReplicaDetector(), {}, []
    for step in (0, 1, 2):
        batches = sim.batches(step)
        if step == 2:
            batches[3].crc32[m] ^= 0x1
        found += det.judge(judge.view(batches), state)
    assert found == []
    sim.batches(3)  # made, never judged
    [v] = det.judge(judge.view(sim.batches(4)), state)
    assert (v.rank, v.step) == (3, 2) and "not seen at step 3" in v.evidence["held_one_step"]


def test_the_status_counts_the_splits_that_healed() -> None:
    sim, m = _with_moment(25)
    clock = FakeClock()
    core = CoordinatorCore({}, clock=clock)
    found = []
    for step in range(8):
        batches = sim.batches(step)
        if step in (2, 5):
            batches[step % 4].crc32[m] ^= 0x1
        found += feed_step(core, clock, batches)
    assert found == []
    healed = core.status()["jobs"][sim.job]["replica_splits_healed"]
    assert healed["count"] == 2 and [(x["step"], x["rank"]) for x in healed["last"]] == [(2, 2), (5, 1)]
    assert core.coverage_report(sim.job)["replica_splits_healed"] == healed
