"""The shard map: every record goes to exactly one shard, by kind; names follow them."""
from __future__ import annotations

import numpy as np
import pytest

from rankscope.coordinator.logic.synthetic import SyntheticTraining
from rankscope.wire.records import Kind
from rankscope.wire.shards import MAX_SHARDS, ShardMap


@pytest.mark.parametrize("k", range(1, MAX_SHARDS + 1))
def test_split_keeps_every_record_once(k) -> None:
    sim = SyntheticTraining(ranks=2, tensors=40, seed=k)
    b = sim.batches(0)[1]
    parts = ShardMap(k).split(b)
    assert len(parts) == k
    ids = np.concatenate([p.name_ids for p in parts])
    assert sorted(ids.tolist()) == sorted(b.name_ids.tolist())
    for i, p in enumerate(parts):
        assert (ShardMap(k).of_kind[p.kinds] == i).all()
        assert set(p.new_names) == set(p.name_ids.tolist())  # a shard learns only its names
        assert p.rank == b.rank and p.step == b.step
        order = np.argsort(p.exec_index)
        assert (order == np.arange(len(p))).all()  # execution order kept
    again = ShardMap(k).split(sim.batches(1)[1])  # names are sent once: later parts carry none
    assert all(not p.new_names for p in again)


def test_four_shards_get_even_columns_of_a_data_parallel_model() -> None:
    sim = SyntheticTraining(ranks=1, tensors=128, seed=0)
    sizes = [len(p) for p in ShardMap(4).split(sim.batches(0)[0])]
    assert max(sizes) - min(sizes) <= 3, sizes
    assert ShardMap(4).kinds_of(0) == [Kind.FORWARD, Kind.BACKWARD]


@pytest.mark.parametrize("bad", [0, 9, "2", 2.0, True, None])
def test_a_bad_count_is_named(bad) -> None:
    with pytest.raises(ValueError, match="shards"):
        ShardMap(bad)
    with pytest.raises(ValueError, match="shard map"):
        ShardMap.from_wire({"count": bad})


def test_wire_round_trip() -> None:
    assert ShardMap.from_wire(ShardMap(3).to_wire()).count == 3
    with pytest.raises(ValueError, match="shard map"):
        ShardMap.from_wire([3])
