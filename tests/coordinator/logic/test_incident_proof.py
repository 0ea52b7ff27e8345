"""What the coordinator keeps for an incident's proof: the named tensor on every rank
around the divergence, where a NaN spread, the per-rank curves with missing and
non-finite values told apart, the detectors' per-rank scores and the incident timeline."""
from __future__ import annotations

import json

import numpy as np
from logic_helpers import FakeClock, StepJudge, feed_step, run_synthetic, view_of

from rankscope.config.cluster import OnDivergence
from rankscope.coordinator.logic.core import CoordinatorCore
from rankscope.coordinator.logic.detectors.replica import ReplicaDetector
from rankscope.coordinator.logic.incidents.incident import Incident, IncidentEvent
from rankscope.coordinator.logic.incidents.incident_store import incident_document
from rankscope.coordinator.logic.views.recent import WINDOW_FIELDS, RecentSteps
from rankscope.coordinator.logic.synthetic import SyntheticTraining
from rankscope.coordinator.logic.verdict import Verdict


def _nan_on_rank2_from_step5(step, batches, sim):
    if step >= 5:
        batches[2].nan_count[sim.column("Sentinel.grad_local.layer1.")] = 3
    if step >= 6:  # after the reduction every rank holds it
        for b in batches:
            b.nan_count[sim.column("Sentinel.grad_reduced.layer1.")] = 7


def test_tensor_window_holds_every_rank_over_the_steps_around_the_verdict() -> None:
    core, sim, found = run_synthetic(10, _nan_on_rank2_from_step5)
    [v] = [v for v in found if v.detector == "nan_origin"]
    assert (v.rank, v.step) == (2, 5)
    w = core.series.recent.tensor_window(v.group, v.tensor, v.step, [v.rank])
    assert w["steps"] == [1, 2, 3, 4, 5, 6, 7, 8] and w["ranks"] == [2, 0, 1, 3]
    assert w["fields"] == list(WINDOW_FIELDS) and w["kind"] == "grad_local"
    nan = WINDOW_FIELDS.index("nan")
    assert [row[nan] for row in w["values"][0]] == [0, 0, 0, 0, 3, 3, 3, 3]
    assert all(row[nan] == 0 for row in w["values"][1])
    col = sim.column("Sentinel.grad_local.layer1.")
    assert w["values"][1][0][3] == sim.batches(1)[0].stats[col, 3] or isinstance(w["values"][1][0][3], float)
    assert len(w["median"]) == 8 and len(w["median"][0]) == 4
    json.dumps(w, allow_nan=False)  # strict JSON as written
    assert core.series.recent.tensor_window(v.group, "no.such.tensor", 5, [2]) is None


def test_nonfinite_chain_lists_the_origin_then_where_it_spread() -> None:
    core, sim, found = run_synthetic(8, _nan_on_rank2_from_step5)
    [v] = [v for v in found if v.detector == "nan_origin"]
    chain = core.series.recent.nonfinite_chain(v.group, v.step)
    first, *rest = chain["records"]
    assert (first["step"], first["tensor"], first["ranks"], first["before_reduction"]) == (5, v.tensor, [2], True)
    spread = [r for r in rest if r["tensor"].startswith("Sentinel.grad_reduced.layer1")]
    assert spread and spread[0]["step"] == 6 and spread[0]["ranks"] == [0, 1, 2, 3]
    assert spread[0]["nan"] == 28 and spread[0]["before_reduction"] is False
    steps = [(r["step"], r["exec_index"]) for r in chain["records"]]
    assert steps == sorted(steps)


def test_recent_steps_are_bounded_in_steps_and_cells_and_reset_on_a_newrun_synthetic() -> None:
    sim = SyntheticTraining(ranks=4, tensors=16, seed=5)
    judge = StepJudge()
    views = [judge.view(sim.batches(s)) for s in range(12)]
    assert all(v.present.size == views[0].present.size > 0 for v in views)
    rec = RecentSteps(keep_steps=5)
    for v in views:
        rec.add(v)
    assert [v.step for v in rec.views(views[0].group)] == [7, 8, 9, 10, 11]
    small = RecentSteps(keep_steps=10, max_cells=3 * views[0].present.size)
    for v in views:
        small.add(v)
    assert [v.step for v in small.views(views[0].group)] == [9, 10, 11]
    rec.add(views[0])  # step 0 again: a new run under the same job id
    assert [v.step for v in rec.views(views[0].group)] == [0]


def test_series_tells_missing_from_nonfinite() -> None:
    def fault(step, batches, sim):
        if step == 3:
            batches[1].stats[sim.column("Sentinel.loss"), 2] = np.nan
            batches[1].nan_count[sim.column("Sentinel.loss")] = 1

    core, sim, _ = run_synthetic(5, fault)
    [series] = core.series.to_dict().values()
    assert series["loss"][3][1] == "nan" and isinstance(series["loss"][2][1], float)
    assert series["deviation"][3][1] == 1e9
    # a rank that sent nothing for a step: None, not a typical 0 nor NaN/Inf
    clock = FakeClock()
    core2 = CoordinatorCore({"deadline_s": 1.0}, clock=clock)
    sim2 = SyntheticTraining(ranks=3, tensors=16, seed=6)
    for r in range(3):
        core2.on_register(sim2.job, r, {"world_size": 3})
    batches = sim2.batches(0)
    feed_step(core2, clock, batches[:2], dt=5.0)
    [s2] = core2.series.to_dict().values()
    assert s2["loss"][0][2] is None and s2["grad_norm"][0][2] is None and s2["deviation"][0][2] is None


def test_replica_evidence_lists_every_ranks_checksum() -> None:
    sim = SyntheticTraining(ranks=4, tensors=16, seed=7)
    batches = sim.batches(0)
    p = sim.column("Sentinel.param.layer2.")
    batches[3].crc32[p] ^= 0x4
    [v] = ReplicaDetector().judge(view_of(batches), {})
    by_rank = v.evidence["crc32_by_rank"]
    assert list(by_rank)[0] == "3" and sorted(by_rank) == ["0", "1", "2", "3"]
    assert by_rank["3"] == v.evidence["crc32"] and by_rank["0"] == v.evidence["majority_crc32"]


def test_outlier_evidence_scores_every_rank_on_the_rules_scale() -> None:
    def fault(step, batches, sim):
        if step == 30:
            batches[1].stats[sim.column("Sentinel.grad_local.layer0."), 3] *= 60

    _, _, found = run_synthetic(31, fault, ranks=8)
    [v] = [v for v in found if v.detector == "outlier"]
    z = v.evidence["robust_z_by_rank"]
    assert v.rank == 1 and set(z) == set(v.evidence["group_values"]["by_rank"])
    assert z["1"] == v.evidence["robust_z"] and max(z, key=z.get) == "1"
    assert all(z[r] < v.evidence["thresholds"]["z"] for r in z if r != "1")


def test_incident_document_has_the_timeline_of_states() -> None:
    v = Verdict("nan_origin", 2, 4, "t", 1, "forward", "j/0", {}, [], "j")
    inc = Incident("i", "j", OnDivergence.TERMINATE, v, 1.7e9)
    for event, t in ((IncidentEvent.START, 0.0), (IncidentEvent.ALL_PAUSED, 0.5),
                     (IncidentEvent.BUNDLES_RECEIVED, 1.25), (IncidentEvent.WRITE_DONE, 1.3)):
        inc.apply(event, 1.7e9 + t)
    tl = incident_document(inc)["timeline"]
    assert [(e["event"], e["state"]) for e in tl] == [
        ("start", "pausing"), ("all_paused", "exporting"), ("bundles_received", "written"),
        ("write_done", "terminated")]
    assert tl[2]["at"] == "2023-11-14T22:13:21.250+00:00"
