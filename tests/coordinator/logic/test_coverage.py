"""Coverage: every (rank, step) is either judged or named as not seen, and the one-line
summary never hides a gap (pure logic, scripted clock)."""
from __future__ import annotations

import random

from logic_helpers import FakeClock, feed_step

from rankscope.coordinator.logic.core import CoordinatorCore
from rankscope.coordinator.logic.views.coverage import Coverage, StepRanges, describe
from rankscope.coordinator.logic.synthetic import SyntheticTraining
from rankscope.wire.sync import OUT, SyncPoint


def test_step_ranges_merge_in_any_order_and_name_the_gaps():
    steps = [s for s in range(40) if s not in (5, 6, 7, 20)]
    random.Random(3).shuffle(steps)
    r = StepRanges()
    for s in steps + steps[:5]:  # duplicates change nothing
        r.add(s)
    assert r.ranges() == [(0, 4), (8, 19), (21, 39)]
    assert len(r) == 36
    assert r.missing(0, 45) == [(5, 7), (20, 20), (40, 45)]
    assert r.missing(8, 19) == []
    assert StepRanges().missing(2, 3) == [(2, 3)]


def test_a_complete_run_is_said_complete():
    cov = Coverage()
    for step in range(16):
        cov.judged("j", step, range(4))
    rep = cov.report("j", {r: None for r in range(4)})
    assert rep["complete"] and rep["steps"] == [0, 15]
    assert describe(rep) == "watched steps 0-15 on 4/4 ranks"


def test_a_gap_a_silent_rank_and_drops_are_all_named():
    cov = Coverage()
    for step in range(16):
        cov.judged("j", step, [r for r in range(3) if not (r == 2 and 4 <= step <= 9)])
    cov.dropped("j", 2, 212)
    rep = cov.report("j", {r: None for r in range(4)})
    assert not rep["complete"]
    line = describe(rep)
    assert line.startswith("watched steps 0-15 on 3/4 ranks")
    assert "rank 2 steps 4-9 not seen (212 step(s) dropped in the rank)" in line
    assert "rank 3 not seen at all" in line


def test_a_lost_rank_is_only_expected_up_to_its_end():
    cov = Coverage()
    for step in range(10):
        cov.judged("j", step, [0, 1] if step > 5 else [0, 1, 2])
    assert cov.report("j", {0: None, 1: None, 2: 5})["complete"]
    # Still said: "steps 0-9 on 3/3 ranks" alone would read as rank 2 seen through 9.
    assert describe(cov.report("j", {0: None, 1: None, 2: 5})) == "watched steps 0-9 on 3/3 ranks; rank 2 lost after step 5"
    assert "rank 2 steps 6-7 not seen" in describe(cov.report("j", {0: None, 1: None, 2: 7}))
    gap = {"job": "j", "steps": [0, 3], "ranks": 2, "watched_ranks": 2, "complete": False,
           "not_seen": [{"rank": 1, "steps": [[0, 0]]}]}
    assert describe(gap) == "watched steps 0-3 on 2/2 ranks; rank 1 step 0 not seen"


def test_nothing_seen_is_not_called_watched():
    rep = Coverage().report("j", {0: None, 1: None})
    assert rep["steps"] is None and not rep["complete"]
    assert describe(rep).startswith("nothing watched")


def test_the_core_marks_what_it_judged_and_the_ranks_missing_by_the_deadline():
    clock = FakeClock()
    core = CoordinatorCore({"on_divergence": "continue", "deadline_s": 1.0,
                            "detectors": {"progress": {"enabled": False}}}, clock=clock)
    synth = SyntheticTraining(ranks=4, tensors=8, job="j", seed=1)
    for r in range(4):
        core.on_register("j", r, {"world_size": 4})
    for step in range(8):
        batches = [b for b in synth.batches(step) if not (b.rank == 1 and step in (3, 4))]
        feed_step(core, clock, batches, dt=1.5)  # past the deadline: judged without rank 1
    core.on_heartbeat("j", 1, 7, "running", dropped=2)
    core.drain()
    rep = core.coverage_report("j")
    assert rep["steps"] == [0, 7]
    assert rep["not_seen"] == [{"rank": 1, "steps": [[3, 4]], "dropped_steps": 2}]


def _killed_before_its_records_left(rank: int, steps: int, **death) -> dict:
    """A 4-rank job of ``steps`` steps whose ``rank`` sent nothing of its last one, then
    was lost as its node agent reports it (``death``): the coverage report."""
    clock = FakeClock()
    core = CoordinatorCore({"on_divergence": "continue"}, clock=clock)
    synth = SyntheticTraining(ranks=4, tensors=8, job="j", seed=rank)
    for r in range(4):
        core.on_register("j", r, {"world_size": 4})
    for step in range(steps):
        feed_step(core, clock, [b for b in synth.batches(step) if not (b.rank == rank and step == steps - 1)], dt=0.1)
    core.on_rank_lost("j", rank, steps - 2, None, "killed by SIGKILL", signal=9, **death)
    core.drain()
    return core.coverage_report("j")


def test_a_rank_killed_before_its_last_step_left_it_has_that_step_not_seen():
    # Rank 3 finished step 5 and began step 6, then was killed before its records of step
    # 5 left the process: the node agent's report says it began step 6.
    rep = _killed_before_its_records_left(3, 6, position=(6, -1))
    assert rep["not_seen"] == [{"rank": 3, "steps": [[5, 5]]}], rep
    assert "rank 3 step 5 not seen" in describe(rep)


def test_a_rank_killed_after_leaving_a_compiled_step_has_that_step_not_seen():
    # GRAPH mode: a compiled step is "begun" until the next one starts, so a rank killed
    # between steps 6 and 7 has begun step 6 only; it had left step 6's graph.
    left = SyncPoint("graph", 6, 0, OUT, 0.0)
    rep = _killed_before_its_records_left(1, 7, sync=left, position=(6, -1))
    assert rep["not_seen"] == [{"rank": 1, "steps": [[6, 6]]}], rep


def test_ranges_added_in_any_order_and_overlap_equal_a_plain_set():
    rng = random.Random(11)
    for _ in range(200):
        r, seen = StepRanges(), set()
        for _ in range(rng.randint(1, 12)):
            lo = rng.randint(0, 60)
            hi = lo + rng.randint(0, 8)
            r.add_range(lo, hi)
            seen.update(range(lo, hi + 1))
        want, run = [], None
        for s in sorted(seen):
            if run and s == run[1] + 1:
                run[1] = s
            else:
                run = [s, s]
                want.append(run)
        assert r.ranges() == [tuple(x) for x in want]


def test_runs_of_steps_keep_every_ranks_steps_even_when_the_ranks_change_often():
    """Judged steps are kept as runs with the same ranks, folded into per-rank ranges past
    MAX_RUNS: whatever the pattern, each rank's steps are exactly those it was judged in."""
    import rankscope.coordinator.logic.views.coverage as coverage

    rng = random.Random(5)
    cov, model = Coverage(), {}
    for step in range(3 * coverage.MAX_RUNS + 17):
        if rng.random() < 0.1:
            continue  # a step nobody saw
        ranks = [r for r in range(9) if rng.random() < 0.8] if rng.random() < 0.5 else list(range(9))
        cov.judged("j", step, ranks)
        for r in ranks:
            model.setdefault(r, set()).add(step)
    got = cov.per_rank("j")
    assert len(cov._jobs["j"].runs) <= coverage.MAX_RUNS and cov._jobs["j"].folded  # folding did happen
    assert {r: {s for lo, hi in rg.ranges() for s in range(lo, hi + 1)} for r, rg in got.items()} == model
