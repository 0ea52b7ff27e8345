"""Probe records of real decode runs, judged by the real coordinator logic (no Ray, no sockets).

Each worker here is the example's worker code in-process: the tiny decoder, a real
``PrecisionDebugger`` with ``start(model, token_range=[1, 3], rank_id=worker)`` around a
greedy decode, and the StepBatch it emits captured by an extra sink. Three workers'
batches go to ``CoordinatorCore`` in "replicas" mode, which must name the faulty worker,
the token and the layer for each kind of fault the issue lists: a perturbed weight, a
different dtype, a different seed. Clean workers must give no verdict at all.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from repo_paths import REPO

ROOT = REPO
EXAMPLE = ROOT / "examples" / "dp_inference"
if str(EXAMPLE) not in sys.path:
    sys.path.insert(0, str(EXAMPLE))

ms = pytest.importorskip("mindspore")

import decoder  # noqa: E402
import faults  # noqa: E402
from token_index import token_of  # noqa: E402

TOKEN_RANGE, TOKENS, JOB = (1, 3), 5, "dp-verdict"


class Capture:
    """A Sink keeping what the probe emits."""

    def __init__(self) -> None:
        self.outputs = []

    def emit(self, out) -> None:
        self.outputs.append(out)

    def close(self) -> None:
        pass


@pytest.fixture(scope="module", autouse=True)
def _pynative_cpu(pynative_cpu):
    return pynative_cpu


@pytest.fixture(scope="module")
def no_agent():
    """No node agent from the outside environment; a fixed job id for the batches."""
    with pytest.MonkeyPatch.context() as mp:
        for var in ("RANKSCOPE_AGENT", "RANKSCOPE_CONFIG", "RANKSCOPE_ATTACH"):
            mp.delenv(var, raising=False)
        mp.setenv("RANKSCOPE_JOB", JOB)
        yield


def serve_one(worker: int, spec: str | None, dump: Path):
    """What worker.py --debugger does for one request; returns the step's StepBatch."""
    from rankscope import PrecisionDebugger
    fault = faults.parse_fault(spec)
    cfg = decoder.DecoderConfig()
    model = decoder.build_model(cfg, seed=faults.weight_seed(fault, worker),
                                dtype=faults.weight_dtype(fault, worker))
    debugger = PrecisionDebugger(config_path=str(EXAMPLE / "config.json"), dump_path=str(dump))
    capture = Capture()
    debugger.sinks.append(capture)
    try:
        debugger.start(model=model, token_range=list(TOKEN_RANGE), rank_id=worker)
        decoder.greedy_generate(model, decoder.make_prompts(vocab=cfg.vocab), TOKENS,
                                faults.iteration_hook(fault, worker, cfg.n_layers))
        debugger.stop()
        debugger.step()
    finally:
        debugger.close()
    assert len(capture.outputs) == 1
    batch = capture.outputs[0].batch
    assert batch.rank == worker and len(batch) > 0
    return batch


def judge(batches) -> list:
    from rankscope.coordinator.logic.core import CoordinatorCore
    core = CoordinatorCore({"groups": "replicas", "on_divergence": "continue"})
    for b in batches:
        core.on_register(b.job, b.rank, {"world_size": 1})
    for b in batches:
        core.on_step(b)
    return core.tick() + core.drain()


@pytest.fixture(scope="module")
def clean(tmp_path_factory, no_agent):
    tmp = tmp_path_factory.mktemp("clean")
    return [serve_one(w, None, tmp) for w in range(3)]


def test_clean_replicas_give_no_verdict(clean):
    assert judge(clean) == []


FAULTS = {  # spec -> (token, layer prefix) where worker 1 first departs
    "perturb_weight:1:1:2": (2, "Cell.layers.1.attn.qkv."),
    "dtype:1": (1, "Cell.tok_emb."),  # float16 weights: different from the first layer on
    "seed:1": (1, "Cell.tok_emb."),   # other weights: likewise
}


@pytest.fixture(scope="module", params=sorted(FAULTS))
def faulty(request, tmp_path_factory, clean):
    spec = request.param
    tmp = tmp_path_factory.mktemp("verdict")
    # Workers 0 and 2 are clean whatever the spec (the fault is on worker 1): reuse
    # their batches, so each fault costs one decode run.
    verdicts = judge([clean[0], serve_one(1, spec, tmp), clean[2]])
    assert verdicts, f"{spec}: no verdict"
    return spec, min(verdicts, key=lambda v: v.sort_key())


def test_the_faulty_worker_is_named_with_its_first_departing_layer(faulty):
    spec, first = faulty
    assert (first.detector, first.rank, first.ties, first.step) == ("replica", 1, [], 0)
    assert first.tensor.startswith(FAULTS[spec][1]), first.tensor


def test_the_named_tensor_is_at_the_departure_token(faulty):
    spec, first = faulty
    assert token_of(first.tensor, TOKEN_RANGE) == FAULTS[spec][0], first.tensor


def test_the_verdict_token_field_is_the_departure_token(faulty):
    # what incident.json's "token" shows the user
    spec, first = faulty
    assert first.token == FAULTS[spec][0], (first.token, first.tensor)
