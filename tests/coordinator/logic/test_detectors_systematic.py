"""Replica splits that follow the layout are a bug every rank runs: no rank is named."""
from __future__ import annotations

import numpy as np
from logic_helpers import FakeClock, feed_step, view_of

from rankscope.coordinator.logic.core import CoordinatorCore
from rankscope.coordinator.logic.detectors import systematic
from rankscope.coordinator.logic.detectors.replica import ReplicaDetector
from rankscope.coordinator.logic.synthetic import SyntheticTraining
from rankscope.coordinator.logic.verdict import JOB_WIDE


def test_a_reduced_gradient_that_differs_on_every_replica_is_job_wide_and_names_the_reduction() -> None:
    sim = SyntheticTraining(ranks=4, tensors=32, seed=11)
    batches = sim.batches(3)
    g = sim.column("Sentinel.grad_reduced.layer2.")
    for i, b in enumerate(batches):
        b.crc32[g] += i  # each rank kept its own gradient: the reduction never ran
    [v] = ReplicaDetector().judge(view_of(batches), {})
    assert v.decided is False and v.tensor == sim.names[g]
    assert v.evidence["systematic"] is True
    assert v.evidence["agreeing_sets"] == [[0], [1], [2], [3]]
    assert "not one machine" in v.evidence[JOB_WIDE]
    assert "reduction is missing" in v.evidence["probable_cause"]
    assert "across the replicas ranks 0-3" in v.evidence["probable_cause"]


def test_one_or_two_faulty_ranks_are_not_called_systematic() -> None:
    sim = SyntheticTraining(ranks=4, tensors=32, seed=12)
    p = sim.column("Sentinel.param.layer5.")
    one = sim.batches(2)
    one[1].crc32[p] += 1
    [v] = ReplicaDetector().judge(view_of(one), {})
    assert v.decided and v.rank == 1 and "systematic" not in v.evidence
    two = SyntheticTraining(ranks=4, tensors=32, seed=12).batches(2)
    two[2].crc32[p] += 1
    two[3].crc32[p] += 2  # ranks 0 and 1 still agree: two faults, no pattern
    [v2] = ReplicaDetector().judge(view_of(two), {})
    assert v2.decided is False and "systematic" not in v2.evidence and JOB_WIDE not in v2.evidence


def test_two_replicas_that_disagree_stay_undecided_not_systematic() -> None:
    pair = SyntheticTraining(ranks=2, tensors=32, seed=13).batches(0)
    p = SyntheticTraining(ranks=2, tensors=32, seed=13).column("Sentinel.param.layer0.")
    pair[1].crc32[p] += 1
    [v] = ReplicaDetector().judge(view_of(pair), {})
    assert v.decided is False and "systematic" not in v.evidence


def _hybrid(split_sets: list[list[int]]) -> list:
    """Replica sets {0,2} and {1,3}; at step 4 each set in ``split_sets`` splits on one weight."""
    clock = FakeClock()
    core = CoordinatorCore({"groups": [[0, 2], [1, 3]]}, clock=clock)
    sim = SyntheticTraining(ranks=4, tensors=32, seed=14)
    p = sim.column("Sentinel.param.layer3.")
    found = []
    for step in range(8):
        batches = sim.batches(step)
        for b in batches[1::2]:
            b.crc32[p] += 7  # ranks 1 and 3 hold the other shard
        if step >= 4:
            for rows in split_sets:
                batches[rows[1]].crc32[p] += 1
        found += feed_step(core, clock, batches)
    return found


def test_every_replica_set_splitting_on_one_tensor_at_one_step_is_job_wide() -> None:
    found = _hybrid([[0, 2], [1, 3]])
    assert found, "expected a verdict"
    v = found[0]
    assert (v.detector, v.step, v.decided) == ("replica", 4, False)
    assert v.evidence["rule"] == systematic.RULE_EVERY_SET
    assert sorted(v.evidence["agreeing_sets"]) == [[0], [1], [2], [3]]
    assert "(ranks 0, 2; ranks 1, 3)" in v.evidence["probable_cause"]
    assert "not reduced" in v.evidence["probable_cause"] and "started from different" not in v.evidence["probable_cause"]


def test_one_replica_set_of_two_splitting_is_an_undecided_pair_as_before() -> None:
    found = _hybrid([[1, 3]])
    v = found[0]
    assert (v.step, v.decided, sorted(v.candidates)) == (4, False, [1, 3])
    assert "systematic" not in v.evidence


def test_classes_group_equal_signatures_in_order() -> None:
    assert systematic.classes(np.array([5, 7, 5, 9], np.uint64)) == [[0, 2], [1], [3]]
    assert systematic.all_distinct([[0], [1], [2]]) and not systematic.all_distinct([[0], [1]])
