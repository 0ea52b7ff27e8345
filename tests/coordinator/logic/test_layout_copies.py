"""Copies the layout keeps beyond the replicas: which parameter names read as
normalisation weights (whole on every tensor-parallel shard) or tied embeddings (on the
first and last pipeline stage), and a tied embedding split between the stages."""
from __future__ import annotations

import zlib

import numpy as np
import pytest

from rankscope.coordinator.logic.core import CoordinatorCore
from rankscope.wire.records import NO_CRC, Kind, StepBatch
from tests.logic_helpers import FakeClock, feed_step

from rankscope.coordinator.logic.detectors.layout_copies import is_embedding_param, is_norm_param


@pytest.mark.parametrize("name", [
    "norm.gamma", "layers.0.input_layernorm.weight", "model.layers.3.post_attention_layernorm.weight",
    "transformer.h.0.ln_1.weight", "transformer.ln_f.bias", "encoder.final_norm.beta", "blocks.2.attention_norm.weight",
    "bn.gamma", "ln.weight",
])
def test_norm_weights_are_recognised(name):
    assert is_norm_param(name)


@pytest.mark.parametrize("name", [
    "fc1.weight", "fc1.bias", "layers.0.attention.wq.weight", "embedding.weight", "lm_head.weight",
    "linear_in.weight", "normal_init_scale", "down_proj.weight",
])
def test_other_weights_are_not(name):
    assert not is_norm_param(name)


@pytest.mark.parametrize("name", ["word_embeddings", "embedding.word_embeddings.weight", "tok_embed.weight"])
def test_embedding_weights_are_recognised(name):
    assert is_embedding_param(name)


def _pipeline_batches(step: int, split_from: int | None, sent: set) -> list[StepBatch]:
    """Two stages x two replicas (rank r: stage r // 2, replica r % 2); both stages hold a
    copy of ``word_embeddings``; from ``split_from`` on, the last stage's copies take their
    own value (the same on both of its replicas)."""
    out = []
    for r in range(4):
        stage = r // 2
        names = ["Sentinel.param.dense.weight", "Sentinel.param.word_embeddings", "Sentinel.loss"]
        emb = f"e{step}:{stage}" if split_from is not None and step >= split_from else f"e{step}"
        crc = np.array([zlib.crc32(f"d{step}:{stage}".encode()), zlib.crc32(emb.encode()), NO_CRC], np.int64)
        norm = np.array([3.0 + stage + 0.01 * step, 2.0 + 0.001 * step + (0.5 if emb.endswith(":1") else 0.0),
                         1.0 / (1 + step)])
        stats = np.stack([norm * 0.1, -norm * 0.1, norm * 0.001, norm], axis=1)
        ids = np.arange(3, dtype=np.uint32)
        out.append(StepBatch(job="pp", rank=r, step=step, name_ids=ids,
                             kinds=np.array([Kind.PARAM, Kind.PARAM, Kind.LOSS], np.uint8), exec_index=ids.copy(),
                             stats=stats, nan_count=np.zeros(3, np.int64), inf_count=np.zeros(3, np.int64),
                             numel=np.array([64, 240, 1], np.int64), crc32=crc,
                             new_names=dict(enumerate(names)) if r not in sent else {}))
        sent.add(r)
    return out


def _pipeline_core() -> tuple[CoordinatorCore, FakeClock]:
    clock = FakeClock()
    core = CoordinatorCore({"on_divergence": "terminate"}, clock=clock)
    for r in range(4):
        stage, d = r // 2, r % 2
        core.on_register("pp", r, {"world_size": 4, "pid": 100 + r, "layout": True})
        core.on_layout("pp", r, {"mindspore_rank": r, "world": 4, "reducers": [f"dp_{stage}"],
                                 "groups": {f"dp_{stage}": [2 * stage, 2 * stage + 1], f"pp_{d}": [d, 2 + d]},
                                 "params": f"stage{stage}"})
    return core, clock


def test_a_tied_embedding_whose_stages_split_in_every_replica_is_job_wide_and_names_the_embedding_group():
    core, clock = _pipeline_core()
    sent: set = set()
    found = [v for step in range(4) for v in feed_step(core, clock, _pipeline_batches(step, 1, sent))]
    assert found, "expected a verdict"
    v = found[0]
    assert (v.detector, v.step, v.tensor, v.decided) == ("replica", 1, "Sentinel.param.word_embeddings", False)
    assert v.evidence["systematic"] is True and sorted(v.evidence["agreeing_sets"]) == [[0, 1], [2, 3]]
    assert "not summed across the embedding group (ranks 0, 2; ranks 1, 3)" in v.evidence["probable_cause"]


def test_a_tied_embedding_kept_in_step_raises_nothing_and_untied_tables_are_never_learned():
    core, clock = _pipeline_core()
    sent: set = set()
    assert [v for step in range(6) for v in feed_step(core, clock, _pipeline_batches(step, None, sent))] == []
    core, clock = _pipeline_core()
    sent = set()
    assert [v for step in range(6) for v in feed_step(core, clock, _pipeline_batches(step, 0, sent))] == []
