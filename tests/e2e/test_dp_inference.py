"""The DP inference example on plain MindSpore (no rankscope): replicas agree, faults part them.

These hold the example itself to account before rankscope is asked to find anything:
N clean workers must compute bit-identical things, and each injected fault must make
exactly one worker depart at the token and layer its spec names. The ground truth is
the example's own reference trace (forward hooks, CRC-32 per block output).
"""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from repo_paths import REPO

ROOT = REPO
EXAMPLE = ROOT / "examples" / "dp_inference"
if str(EXAMPLE) not in sys.path:
    sys.path.insert(0, str(EXAMPLE))

ms = pytest.importorskip("mindspore")

import decoder  # noqa: E402
import faults  # noqa: E402
from replica_trace import ReplicaTrace, first_divergence  # noqa: E402
from token_index import call_index, token_of  # noqa: E402

TOKENS = 5


@pytest.fixture(scope="module", autouse=True)
def _pynative_cpu(pynative_cpu):
    return pynative_cpu


def run_worker(worker: int, spec: str | None, tokens: int = TOKENS) -> tuple[np.ndarray, list[dict]]:
    """What worker.py does, in-process: build, maybe fault, generate, trace."""
    fault = faults.parse_fault(spec)
    cfg = decoder.DecoderConfig()
    model = decoder.build_model(cfg, seed=faults.weight_seed(fault, worker),
                                dtype=faults.weight_dtype(fault, worker))
    trace = ReplicaTrace(model)
    out = decoder.greedy_generate(model, decoder.make_prompts(vocab=cfg.vocab), tokens,
                                  faults.iteration_hook(fault, worker, cfg.n_layers))
    trace.remove()
    return out, trace.to_json()


# ------------------------------------------------------------------ fault specs
@pytest.mark.parametrize("spec, expected", [
    ("perturb_weight:2:1", faults.Fault(faults.FaultKind.PERTURB_WEIGHT, 2, 1, 0)),
    ("perturb_weight:0:0:3", faults.Fault(faults.FaultKind.PERTURB_WEIGHT, 0, 0, 3)),
    ("dtype:1", faults.Fault(faults.FaultKind.DTYPE, 1)),
    ("seed:4", faults.Fault(faults.FaultKind.SEED, 4)),
    ("", None),
    (None, None),
])
def test_parse_fault_accepts_documented_spellings(spec, expected):
    assert faults.parse_fault(spec) == expected


@pytest.mark.parametrize("spec, names", [
    ("bitflip:1", "'bitflip'"),
    ("perturb_weight:1", "perturb_weight:WORKER:LAYER"),
    ("perturb_weight:x:1", "WORKER must be an integer, got 'x'"),
    ("perturb_weight:1:1:-2", "TOKEN must be >= 0, got -2"),
    ("dtype:1:2", "dtype:WORKER"),
])
def test_parse_fault_rejects_bad_specs_naming_the_part(spec, names):
    with pytest.raises(ValueError) as err:
        faults.parse_fault(spec)
    assert names in str(err.value) and repr(spec) in str(err.value)


def test_perturb_layer_out_of_range_is_a_clear_error():
    with pytest.raises(ValueError, match="LAYER=5 but the model has 2 layers"):
        faults.iteration_hook(faults.parse_fault("perturb_weight:0:5"), 0, 2)


def test_generate_rejects_too_many_tokens():
    model = decoder.build_model(decoder.DecoderConfig(max_len=8))
    with pytest.raises(ValueError, match="max_new_tokens=6"):
        decoder.greedy_generate(model, decoder.make_prompts(), 6)


# ----------------------------------------------------------------- token index
@pytest.mark.parametrize("name, call, token", [
    ("Cell.layers.1.attn.qkv.Dense.forward.2.output.0", 2, 5),
    ("Cell.tok_emb.Embedding.forward.0.parameters.embedding_table", 0, 3),
    ("Cell.layers.0.Block.forward.1", 1, 4),
    ("Cell.head.Dense.backward.0.input.0", 0, 3),
])
def test_token_of_maps_recorded_call_to_decode_token(name, call, token):
    assert call_index(name) == call
    assert token_of(name, (3, 6)) == token


def test_token_of_without_a_call_index_or_past_the_range():
    assert token_of("Sentinel.loss", (1, 3)) is None
    with pytest.raises(ValueError, match="past token_range"):
        token_of("Cell.head.Dense.forward.3", (1, 3))


# --------------------------------------------------------- replicas, in-process
def test_clean_replicas_are_bit_identical_and_the_trace_has_every_call():
    out0, tr0 = run_worker(0, None)
    out1, tr1 = run_worker(1, None)
    np.testing.assert_array_equal(out0, out1)
    assert first_divergence(tr0, tr1) is None
    # one row per block and the head, per forward call (prefill + TOKENS-1 decodes)
    n_layers = decoder.DecoderConfig().n_layers
    assert len(tr0) == TOKENS * (n_layers + 1)
    assert sorted({r["call"] for r in tr0}) == list(range(TOKENS))


def test_a_fault_on_another_worker_changes_nothing_here():
    clean, tr_clean = run_worker(0, None)
    same, tr_same = run_worker(0, "perturb_weight:1:0:0")
    np.testing.assert_array_equal(clean, same)
    assert first_divergence(tr_clean, tr_same) is None


@pytest.mark.parametrize("spec, where", [
    ("perturb_weight:1:1:2", (2, "layers.1")),  # mid-decode, second block
    ("perturb_weight:1:0:0", (0, "layers.0")),  # at prefill, first block
    ("dtype:1", (0, "layers.0")),
    ("seed:1", (0, "layers.0")),
])
def test_each_fault_departs_at_its_token_and_layer(spec, where):
    _, ref = run_worker(0, spec)
    _, faulty = run_worker(1, spec)
    assert first_divergence(ref, faulty) == where


def test_first_divergence_refuses_misaligned_traces():
    a = [{"call": 0, "cell": "layers.0", "crc32": 1}]
    b = [{"call": 0, "cell": "layers.1", "crc32": 1}]
    with pytest.raises(ValueError, match="not aligned"):
        first_divergence(a, b)


# ------------------------------------------------------ real worker processes
def test_serve_runs_independent_workers_and_one_faulty_one_departs(tmp_path):
    """Three real worker processes, all claiming rank 0, one with a perturbed weight."""
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE / "serve.py"), "--workers", "3", "--tokens", "4",
         "--trace", "--out", str(tmp_path)],
        env={**_clean_env(), "INFER_FAULT": "perturb_weight:2:1:3"},
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    results = [json.loads((tmp_path / f"worker{i}.json").read_text()) for i in range(3)]
    assert len({r["pid"] for r in results}) == 3
    assert [r["fault"] for r in results] == [None, None, "perturb_weight:2:1:3"]
    traces = [json.loads((tmp_path / f"trace{i}.json").read_text()) for i in range(3)]
    assert first_divergence(traces[0], traces[1]) is None
    assert first_divergence(traces[0], traces[2]) == (3, "layers.1")


def test_worker_reports_a_bad_fault_spec_and_exits_2():
    proc = subprocess.run([sys.executable, str(EXAMPLE / "worker.py"), "--worker-id", "0"],
                          env={**_clean_env(), "INFER_FAULT": "perturb_weight:zero:1"},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "WORKER must be an integer, got 'zero'" in proc.stderr


def test_serve_gives_every_worker_the_rank0_claim():
    import serve
    env = serve.worker_env({"PATH": "/bin", "RANK_ID": "5"})
    assert env["RANK_ID"] == "0" and env["RANK_SIZE"] == "1" and env["PATH"] == "/bin"
    ok, line = serve.summarize([{"worker": 0, "tokens": [[1]]}, {"worker": 1, "tokens": [[2]]}])
    assert not ok and "[1]" in line


def _clean_env() -> dict[str, str]:
    """The test's environment without any rankscope attach variables from outside."""
    import os
    return {k: v for k, v in os.environ.items() if not k.startswith("RANKSCOPE_")}
