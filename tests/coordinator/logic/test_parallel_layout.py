"""The job's layout from its ranks' facts: who must hold the same weights, who compares.

Facts are given in the form a rank sends them (wire.layout_facts); the semi/auto-parallel
ones in the form MindSpore's ``parameter_layout_dict`` and mindformers' parallel config
take, which CPU MindSpore cannot produce (it refuses semi/auto parallel)."""
from __future__ import annotations

import pytest

from rankscope.config.cluster import parse_cluster
from rankscope.config.errors import ConfigError
from rankscope.config.layout import LayoutSpec
from rankscope.coordinator.logic.job.layout import LayoutBook, derive
from tests.coordinator.logic.hybrid_sim import tp_facts


def pp_facts(rank: int) -> dict:
    stage, d = rank // 2, rank % 2
    return {"mindspore_rank": rank, "world": 4, "groups": {f"dp_{stage}": [2 * stage, 2 * stage + 1],
                                                          f"pp_{d}": [d, 2 + d]},
            "reducers": [f"dp_{stage}"], "params": f"stage{stage}"}


def test_tensor_parallel_replicas_come_from_the_reducer_groups():
    lay = derive({r: tp_facts(r) for r in range(4)}, range(4))
    assert lay.replicas == {0: (0, 2), 1: (1, 3), 2: (0, 2), 3: (1, 3)} and lay.roles == lay.replicas
    assert not lay.whole
    assert lay.line == ("2 data-parallel replicas x 2 tensor-parallel shards; replicas {0,2} {1,3} "
                        "(from gradient reducer groups)")


def test_pipeline_stages_hold_different_parameters_and_say_so():
    lay = derive({r: pp_facts(r) for r in range(4)}, range(4))
    assert lay.replicas[0] == (0, 1) and lay.replicas[3] == (2, 3)
    assert lay.line.startswith("2 data-parallel replicas x 2 pipeline stages; replicas {0,1} {2,3}")


def test_plain_data_parallelism_is_one_set_of_every_rank():
    facts = {r: {"mindspore_rank": r, "world": 8, "world_group": "mccl_world_group",
                 "reducers": ["mccl_world_group"], "params": "a"} for r in range(8)}
    lay = derive(facts, range(8))
    assert lay.whole and lay.line == "8 data-parallel replicas (pure data parallel, from gradient reducer groups)"
    assert derive({}, range(4)).whole  # no rank said anything: as before layouts existed


def test_groups_nothing_explains_compare_nothing_and_say_what_to_set():
    facts = {r: {"mindspore_rank": r, "world": 4, "groups": {f"g{r // 2}": [r // 2 * 2, r // 2 * 2 + 1]}}
             for r in range(4)}
    lay = derive(facts, range(4))
    assert all(s == (r,) for r, s in lay.replicas.items())
    assert lay.line.startswith("not learned: ranks 0-3 made communication groups") and "cluster.layout" in lay.line
    assert lay.to_dict()["uncompared"] == [0, 1, 2, 3]


def test_a_group_named_for_data_parallelism_is_taken_for_the_replicas():
    facts = {r: {"mindspore_rank": r, "world": 4, "groups": {f"data_parallel_{r % 2}": [r % 2, 2 + r % 2],
                                                             f"model_{r // 2}": [r // 2 * 2, r // 2 * 2 + 1]}}
             for r in range(4)}
    assert derive(facts, range(4)).replicas == {0: (0, 2), 1: (1, 3), 2: (0, 2), 3: (1, 3)}


def test_a_renumbered_rank_s_groups_do_not_apply():
    facts = {r: tp_facts(r) for r in range(4)}
    facts[3] = {**facts[3], "mindspore_rank": 0}  # remapped by its node agent
    lay = derive(facts, range(4))
    assert lay.replicas[3] == (3,) and lay.replicas[1] == (1,)  # 1 no longer has a replica that agrees
    assert "renumbered" in lay.line


def test_ranks_that_disagree_about_each_other_are_not_compared():
    facts = {r: tp_facts(r) for r in range(4)}
    facts[2] = {**facts[2], "reducers": ["mccl_world_group"]}  # 2 says everyone, 0 says {0, 2}
    lay = derive(facts, range(4))
    assert lay.replicas[0] == (0, 2) and lay.replicas[2] == (0, 2)


# --- MindSpore semi/auto parallel: parameter_layout_dict rows in their documented form ---
# [dev_matrix, tensor_map, slice_shape, field_size, uniform_split, opt_shard_group]: a
# tensor-map value k splits by device axis len(dev_matrix) - 1 - k; the last axis varies fastest.
def _semi(rank: int, layouts: list, stages: int = 1, device_num: int = 8, optimizer: bool = False) -> dict:
    return {"mindspore_rank": rank, "world": device_num,
            "context": {"parallel_mode": "semi_auto_parallel", "device_num": device_num, "pipeline_stages": stages,
                        "parallel_optimizer": optimizer}, "param_layouts": layouts}


def test_semi_auto_layouts_give_the_ranks_holding_the_same_slice():
    # dev (2, 4): dp=2 x mp=4. A weight split on mp (map 0 -> the last axis), one replicated.
    layouts = [[[2, 4], [0, -1], False, 10], [[2, 4], [-1, -1], False, 3]]
    lay = derive({r: _semi(r, layouts) for r in range(8)}, range(8))
    assert lay.replicas[1] == (1, 5) and lay.replicas[4] == (0, 4)
    assert lay.line.startswith("2 data-parallel replicas x 4 tensor-parallel shards; replicas {0,4} {1,5}")


def test_semi_auto_pipeline_stages_are_contiguous_rank_blocks():
    layouts = [[[2, 2], [0, -1], False, 4]]
    lay = derive({r: _semi(r, layouts, stages=2) for r in range(8)}, range(8))
    assert lay.replicas[5] == (5, 7) and lay.replicas[0] == (0, 2)


def test_sharded_weights_are_never_compared_but_their_statistics_are():
    layouts = [[[2, 4], [0, -1], True, 10]]
    lay = derive({r: _semi(r, layouts, optimizer=True) for r in range(8)}, range(8))
    assert lay.replicas[1] == (1,) and lay.roles[1] == (1, 5)
    assert not lay.opt_state_replicated and "sharded over the data-parallel ranks" in lay.line


def test_mindformers_parallel_config_numbers_model_parallel_fastest():
    cfg = {"data_parallel": 2, "model_parallel": 2, "pipeline_stage": 2}
    lay = derive({r: {"mindspore_rank": r, "world": 8, "parallel_config": cfg} for r in range(8)}, range(8))
    assert lay.replicas[0] == (0, 2) and lay.replicas[5] == (5, 7)
    assert lay.line.startswith("2 data-parallel replicas x 2 tensor-parallel shards x 2 pipeline stages")


def test_cluster_layout_and_groups_override_what_ranks_say():
    facts = {r: tp_facts(r) for r in range(4)}
    lay = derive(facts, range(4), spec=LayoutSpec(4))
    assert lay.whole
    lay = derive(facts, range(4), groups=((0, 1), (2, 3)))
    assert lay.replicas[0] == (0, 1) and "(from cluster.groups)" in lay.line


def test_cluster_layout_is_checked_where_it_is_read():
    assert parse_cluster({"layout": {"data_parallel": 2, "tensor_parallel": 4}}).layout == LayoutSpec(2, 4, 1)
    with pytest.raises(ConfigError, match="cluster.layout.tensor_paralel"):
        parse_cluster({"layout": {"data_parallel": 2, "tensor_paralel": 4}})
    with pytest.raises(ConfigError, match="cluster.layout.data_parallel"):
        parse_cluster({"layout": {"tensor_parallel": 4}})
    with pytest.raises(ConfigError, match="cluster.layout.pipeline_stages"):
        parse_cluster({"layout": {"data_parallel": 2, "pipeline_stages": 0}})


def test_the_book_derives_again_only_when_a_rank_s_facts_change():
    book = LayoutBook()
    for r in range(4):
        book.learn("j", r, tp_facts(r))
    first = book.layout("j")
    assert book.layout("j").version == first.version
    assert not book.learn("j", 0, tp_facts(0))  # the same facts again change nothing
    assert book.learn("j", 0, {**tp_facts(0), "reducers": []})
    assert book.layout("j").version > first.version
    book.forget("j")
    assert book.layout("j").whole


def test_data_parallel_ranks_that_reduce_by_hand_are_still_one_replica_set():
    """No reducer, no context, no group of their own: what plain data parallelism with a
    world AllReduce per gradient says of itself."""
    facts = {r: {"mindspore_rank": r, "world": 4, "world_group": "mccl_world_group",
                 "collectives": [["AllReduce", "mccl_world_group"]]} for r in range(4)}
    assert derive(facts, range(4)).whole


def test_renumbered_dp_inference_workers_alone_in_their_worlds_are_one_replica_set():
    """Four serving workers each think they are rank 0 of a world of 1; the node agent
    numbers them 0-3. Nothing they made is a group: they stay comparable."""
    facts = {r: {"mindspore_rank": 0, "world": 1} for r in range(4)}
    lay = derive(facts, range(4), world=4)
    assert lay.whole and "renumbered" not in lay.line
