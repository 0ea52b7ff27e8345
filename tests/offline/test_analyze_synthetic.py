"""``rankscope analyze`` on msProbe-layout trees written by the synthetic job: every fault
named at its rank, step and first tensor; a clean tree clean; a damaged tree analysed as far
as it goes, with what was missing said."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from rankscope.coordinator.offline.dump_rows import read_rank_step
from rankscope.coordinator.offline.replicas import ReplicaLearner
from rankscope.coordinator.offline.run import Analyzer
from rankscope.coordinator.offline.synthetic_tree import write_tree
from rankscope.coordinator.offline.tree import find_dumps
from rankscope.wire.records import Kind


def analyze(root, out, cluster=None):
    return Analyzer(find_dumps([root]), out, cluster, jobs=1, say=lambda m: None).run()


@pytest.mark.parametrize("fault, detector, rank, step, tensor", [
    ("nan:5:3", "nan_origin", 5, 3, "Functional.linear.0.forward.input.0"),
    ("scale:2:4", "outlier", 2, 4, "Module.layers.3.Linear.parameters_grad.0.weight"),
    ("drift:6:3", "replica", 6, 3, "Functional.linear.0.forward.input.1"),
])
def test_each_fault_is_named_at_its_rank_step_and_first_tensor(tmp_path, fault, detector, rank, step, tensor):
    kind, r, s = fault.split(":")
    root = write_tree(tmp_path / "dump", ranks=8, steps=6, layers=4, fault=(kind, int(r), int(s)))
    got = analyze(root, tmp_path / "out")
    assert got.incidents, "no incident"
    inc = got.incidents[0]
    assert (inc["detector"], inc["first_diverging_rank"], inc["step"], inc["tensor"]) == \
        (detector, rank, step, tensor), inc
    incident_dir = tmp_path / "out" / "incidents"
    (folder,) = list(incident_dir.iterdir())
    assert (folder / "incident.json").is_file() and (folder / "report.html").stat().st_size > 1000
    doc = json.loads((folder / "incident.json").read_text())
    assert doc["bundles"][str(rank)].endswith(f"step{step}/rank{rank}")


def test_a_clean_tree_gives_no_incident(tmp_path):
    got = analyze(write_tree(tmp_path / "dump", ranks=8, steps=6, layers=4), tmp_path / "out")
    assert got.incidents == [] and got.steps_read == list(range(6)) and not got.not_read
    # Per layer: linear's weight, all_reduce's output, and add_'s weight, reduced gradient and result.
    assert got.replicated == 5 * 4


def test_a_damaged_tree_is_analysed_as_far_as_it_goes_and_says_what_was_missing(tmp_path):
    root = write_tree(tmp_path / "dump", ranks=6, steps=6, layers=3, fault=("nan", 4, 4))
    (root / "step2" / "rank1" / "dump.json").write_text('{"task": "statistics", "data": {"Functional.lin')
    shutil.rmtree(root / "step3" / "rank3")
    proc = subprocess.run([sys.executable, "-m", "rankscope", "analyze", str(root), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 86, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "DIVERGENCE: nan_origin names rank 4 at step 4" in proc.stdout
    last = proc.stdout.strip().splitlines()[-1]
    assert "NOT READ:" in last and "rank 1: step 2 (" in last and "truncated or damaged" in last
    assert "rank 3: step 3 (no dump for this step)" in last
    summary = json.loads((tmp_path / "out" / "analysis.json").read_text())
    assert {(m["rank"], m["step"]) for m in summary["not_read"]} >= {(1, 2), (3, 3)}


def test_clean_but_incomplete_exits_87_and_a_bad_path_exits_2(tmp_path):
    root = write_tree(tmp_path / "dump", ranks=4, steps=4, layers=2)
    (root / "step2" / "rank3" / "dump.json").write_text("")
    proc = subprocess.run([sys.executable, "-m", "rankscope", "analyze", str(root), "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 87 and "no divergence found in 4 rank(s) (ranks 0-3), steps 0-3; NOT READ: rank 3" \
        in proc.stdout, proc.stdout + proc.stderr
    proc = subprocess.run([sys.executable, "-m", "rankscope", "analyze", str(tmp_path / "nope")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "nope: no such file or directory" in proc.stderr


def test_a_column_alike_by_chance_on_most_ranks_is_not_taken_for_a_weight(tmp_path):
    root = write_tree(tmp_path / "dump", ranks=4, steps=2, layers=1)
    rows = {}
    for r in range(4):
        rows[r] = []
    learner = ReplicaLearner(None)
    for step in range(2):
        got = {r: read_rank_step(root / f"step{step}" / f"rank{r}") for r in range(4)}
        mask = got[0].names.index("Functional.relu.0.forward.input.0")
        for r in (1, 2):  # three of four ranks happen to hold the same mask
            got[r].stats[mask] = got[0].stats[mask]
        learner.observe(got)
    learned = learner.replicated()
    assert "Functional.linear.0.forward.input.1" in learned
    assert "Functional.relu.0.forward.input.0" not in learned


def test_replica_sets_from_the_command_line_are_learned_apart(tmp_path):
    root = write_tree(tmp_path / "dump", ranks=6, steps=5, layers=2, fault=("drift", 2, 3))
    # Two tensor-parallel shards: ranks {0,2,4} hold one half of each weight, {1,3,5} the other.
    for step in range(5):
        for r in (1, 3, 5):
            p = root / f"step{step}" / f"rank{r}" / "dump.json"
            doc = json.loads(p.read_text())
            for entry in doc["data"].values():
                for leaf in entry.get("input_args", []):
                    if leaf["shape"] == [64, 64]:
                        leaf["Max"] = leaf["Max"] * 1.5
            p.write_text(json.dumps(doc))
    got = analyze(root, tmp_path / "a", {"groups": [[0, 2, 4], [1, 3, 5]]})
    assert got.replicated > 0
    assert [(i["detector"], i["first_diverging_rank"], i["step"]) for i in got.incidents] == [("replica", 2, 3)]
    # Without the sets the shards look like activations: only the columns left unsharded are learned.
    assert analyze(root, tmp_path / "b").replicated < got.replicated


def test_a_wide_tree_is_read_by_worker_processes_to_the_same_verdict(tmp_path):
    root = write_tree(tmp_path / "dump", ranks=20, steps=4, layers=2, fault=("scale", 13, 3))
    alone = Analyzer(find_dumps([root]), tmp_path / "a", None, jobs=1, say=lambda m: None).run()
    pooled = Analyzer(find_dumps([root]), tmp_path / "b", None, jobs=2, say=lambda m: None).run()
    pick = [(i["detector"], i["first_diverging_rank"], i["step"], i["tensor"]) for i in alone.incidents]
    assert pick and pick[0][1:3] == (13, 3)
    assert [(i["detector"], i["first_diverging_rank"], i["step"], i["tensor"]) for i in pooled.incidents] == pick


def test_a_random_mask_alike_on_every_rank_is_not_learned_as_a_weight(tmp_path):
    root = write_tree(tmp_path / "dump", ranks=4, steps=2, layers=1)
    learner = ReplicaLearner(None)
    for step in range(2):
        got = {r: read_rank_step(root / f"step{step}" / f"rank{r}") for r in range(4)}
        for r in range(4):  # a dropout mask drawn alike by ranks seeded alike
            rs = got[r]
            rs.names.append("Primitive.dropout.Dropout.0.forward.output.1")
            rs.kinds = np.append(rs.kinds, np.uint8(Kind.FORWARD))
            rs.stats = np.vstack([rs.stats, [[2.0, 0.0, 1.0 + step, 9.0]]])
            rs.numel, rs.crc = np.append(rs.numel, 64), np.append(rs.crc, -1)
        learner.observe(got)
    learned = learner.replicated()
    assert "Functional.linear.0.forward.input.1" in learned
    assert "Primitive.dropout.Dropout.0.forward.output.1" not in learned


def test_groups_naming_ranks_the_tree_lacks_are_refused(tmp_path):
    root = write_tree(tmp_path / "dump", ranks=4, steps=2, layers=1)
    proc = subprocess.run([sys.executable, "-m", "rankscope", "analyze", str(root), "--out", str(tmp_path / "o"),
                           "--groups", "[[0, 2], [1, 3], [5, 6]]"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "ranks 5, 6 have no dump in the tree (it holds ranks 0-3)" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "rankscope", "analyze", str(root), "--out", str(tmp_path / "o"),
                           "--groups", "[[0, 2], [1]]"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "rank 3 is in no replica set of --groups" in proc.stdout, proc.stdout
