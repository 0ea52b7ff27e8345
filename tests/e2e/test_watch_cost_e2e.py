"""The default watch under a budget that cannot hold every weight's fingerprint each step:
a one-bit flip in one rank's weight is still named, within the K steps the run states.

A real 4-rank msrun job with a wide hidden layer (fc2 is 2048 x 2048: the weights and
Adam's buffers are some 50 MB, above what is always fingerprinted whole) and a budget of
0.05% of a step, which the vital signs alone exceed: the ranks spread the fingerprints
over as many steps as there are pieces. The flip happens on rank 1 as step 5 begins;
whichever step its fingerprint is due at, the verdict names rank 1 there.
"""
from __future__ import annotations

import json

import pytest
from test_e2e_launch import _explain, run_launch

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

FLIP_STEP = 5


def test_a_bit_flip_is_named_within_the_stated_k_when_fingerprints_rotate(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAIN_HIDDEN", "2048")
    proc, out, incidents = run_launch(tmp_path, f"bitflip:1:{FLIP_STEP}", steps=44,
                                      config={"task": "statistics", "level": "L0",
                                              "cluster": {"budget": 0.0005}})
    coverage = json.loads((out / "coverage.json").read_text())
    (job,) = coverage["jobs"].values()
    every = job["watch_cost"]["fingerprint_every_steps"]
    assert every > 1, json.dumps(job["watch_cost"], indent=1)  # the rotation is what is tested
    assert f"each weight fingerprinted every {every} steps" in proc.stdout, _explain(proc, out)
    assert incidents, "no incident written\n" + _explain(proc, out)
    inc = incidents[0]
    assert inc["first_diverging_rank"] == 1 and inc["detector"] in ("replica", "param_moved"), \
        json.dumps({k: v for k, v in inc.items() if k != "_dir"}, indent=1, default=str)[:3000]
    assert FLIP_STEP <= inc["step"] < FLIP_STEP + every, (inc["step"], every)
    assert "fc2.weight" in inc["tensor"]
