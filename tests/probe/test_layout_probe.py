"""What a rank reads of the job's layout, and how its own collectives are recorded.

mindformers and MindSpore's semi/auto parallel cannot run here (CPU MindSpore refuses
semi/auto parallel; mindformers is not installed), so their objects are given in the
form their documented APIs have: a parallel-config object's attributes, and
``Cell.parameter_layout_dict`` rows ``[dev_matrix, tensor_map, slice_shape, field_size,
uniform_split, opt_shard_group]``. The collective hooks run on real MindSpore tensors."""
from __future__ import annotations

import numpy as np
import pytest

from rankscope.probe.comm import layout_probe
from rankscope.probe.comm.collectives import CollectiveHooks
from rankscope.probe.hooks.recorder import Recorder
from rankscope.probe.comm.layout_probe import LayoutProbe, find_parallel_config, param_layouts
from rankscope.probe.comm.sync_tracker import SyncTracker
from rankscope.wire.collective_names import parse_collective


@pytest.fixture(autouse=True)
def own_facts(monkeypatch):
    """What this process noted is process-wide: each test notes into its own."""
    monkeypatch.setattr(layout_probe, "_groups", {})
    monkeypatch.setattr(layout_probe, "_reducers", set())
    monkeypatch.setattr(layout_probe, "_collectives", set())


class TransformerOpParallelConfig:  # the name mindformers gives it; what it carries
    def __init__(self, data_parallel=2, model_parallel=4, pipeline_stage=1, optimizer_shard=True):
        self.data_parallel, self.model_parallel = data_parallel, model_parallel
        self.pipeline_stage, self.optimizer_shard = pipeline_stage, optimizer_shard


class Net:
    def __init__(self, layout):
        self.parameter_layout_dict = layout


def test_mindformers_degrees_are_read_off_its_config_object():
    objs = [object(), {"data_parallel": 9}, TransformerOpParallelConfig(2, 4, 2, True)]
    assert find_parallel_config(objs) == {"data_parallel": 2, "model_parallel": 4, "pipeline_stage": 2,
                                          "optimizer_shard": True}
    assert find_parallel_config([object()]) is None


def test_parameter_layouts_are_counted_by_their_distinct_forms():
    net = Net({"w1": [[2, 4], [0, -1], [8, 16], 0, True, ""],
               "w2": [[2, 4], [0, -1], [8, 8], 0, True, ""],
               "b": [[2, 4], [-1], [32], 0, True, "2-5"],
               "odd": [[2, 4], [[0, 1], -1], [8], 0, True, ""]})  # a nested map: not ours to read
    assert param_layouts([net]) == [[[2, 4], [0, -1], False, 2], [[2, 4], [-1], True, 1]]


def test_facts_of_a_process_without_communication_are_valid_and_say_little():
    facts = LayoutProbe().facts([], ["fc.weight:(4, 4)"])
    assert "world" not in facts and facts["context"]["parallel_mode"] == "stand_alone"
    assert len(facts["params"]) == 16


def test_groups_reducers_and_collectives_noted_become_facts():
    layout_probe.note_group("unit_tp_0", [1, 0])
    layout_probe.note_reducer("unit_dp_0")
    layout_probe.note_collective("AllReduce", "unit_tp_0")
    probe = LayoutProbe()
    facts = probe.facts()
    assert facts["groups"]["unit_tp_0"] == [0, 1] and "unit_dp_0" in facts["reducers"]
    assert ["AllReduce", "unit_tp_0"] in facts["collectives"]
    assert not probe.due()
    layout_probe.note_group("unit_tp_1", [2, 3])
    assert probe.due()


def test_a_collective_call_is_recorded_around_it_with_its_group():
    import mindspore as ms
    rec = Recorder()
    sync = SyncTracker()
    hooks = CollectiveHooks(rec, sync)
    hooks.enabled = True
    x = ms.Tensor(np.array([[1.0, float("nan")], [3.0, 4.0]], np.float32))

    def all_reduce(t):
        assert sync.latest.phase == "in"  # the rank is inside the collective while it runs
        return t * 2

    out = hooks.call(all_reduce, "AllReduce", "tp_0", (x,), (x,), {}, in_place=False)
    hooks.call(all_reduce, "AllReduce", "tp_0", (out,), (out,), {}, in_place=False)
    rec.take()
    batch = rec.builder.build("j", 0, 0)
    names = [batch.new_names[int(i)] for i in batch.name_ids]
    assert names == ["Sentinel.collective.tp_0.AllReduce.0.input.0", "Sentinel.collective.tp_0.AllReduce.0.output.0",
                     "Sentinel.collective.tp_0.AllReduce.1.input.0", "Sentinel.collective.tp_0.AllReduce.1.output.0"]
    assert batch.nan_count.tolist() == [1, 1, 1, 1]
    assert sync.latest.phase == "out" and sync.latest.what == "AllReduce"
    assert ["AllReduce", "tp_0"] in LayoutProbe().facts()["collectives"]
    assert all(parse_collective(n) is not None for n in names)


def test_an_in_place_collective_s_input_is_read_before_the_call_overwrites_it():
    import mindspore as ms
    rec = Recorder()
    hooks = CollectiveHooks(rec)
    hooks.enabled = True
    t = ms.Tensor(np.ones(3, np.float32))

    def all_reduce_in_place(tensor, group=None):
        tensor.assign_value(ms.Tensor(np.full(3, 4.0, np.float32)))

    hooks.call(all_reduce_in_place, "AllReduce", "dp", (t,), (t,), {}, in_place=True)
    rec.take()
    batch = rec.builder.build("j", 0, 0)
    assert batch.stats[:, 3].tolist() == pytest.approx([np.sqrt(3.0), np.sqrt(48.0)])
