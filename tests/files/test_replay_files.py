"""The replay record a rank keeps of an anomalous step: written within its size bound,
read back as written, and every damaged part named."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from rankscope.files import replay_files


def _save(tmp_path, big: bool = False):
    inputs = {"arg0": np.arange(12, dtype=np.float32).reshape(3, 4)}
    params = {"fc.weight": np.ones((4, 2), np.float32)}
    if big:
        params["huge"] = np.zeros((replay_files.MAX_BYTES // 4 + 1,), np.float32)
    where = replay_files.replay_dir(tmp_path, 2, 5)
    return replay_files.save(where, {"rank": 2, "step": 5, "params": list(params)}, inputs, params)


def test_a_record_reads_back_as_written(tmp_path):
    where = _save(tmp_path)
    assert where == tmp_path / "replay" / "rank2" / "step5"
    meta, inputs, params = replay_files.load(where)
    assert meta["rank"] == 2 and meta["bytes"] == 48 + 32
    assert np.array_equal(inputs["arg0"], np.arange(12, dtype=np.float32).reshape(3, 4))
    assert params["fc.weight"].shape == (4, 2)


def test_a_step_over_the_bound_keeps_no_arrays_and_says_why(tmp_path):
    where = _save(tmp_path, big=True)
    assert not (where / "params.npz").exists() and not (where / "inputs.npz").exists()
    with pytest.raises(ValueError, match="kept no arrays of this step: inputs and parameters take 256 MB, over"):
        replay_files.load(where)


def test_damaged_records_name_the_file(tmp_path):
    with pytest.raises(ValueError, match="meta.json: cannot be read"):
        replay_files.load(tmp_path / "nowhere")
    where = _save(tmp_path)
    (where / "params.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="params.npz: cannot be read"):
        replay_files.load(where)
    (where / "meta.json").write_text(json.dumps({"format": 99}))
    with pytest.raises(ValueError, match="not a rankscope replay record"):
        replay_files.load(where)
    (where / "meta.json").write_text("{")
    with pytest.raises(ValueError, match="meta.json: not valid JSON"):
        replay_files.load(where)


def test_the_newest_record_is_found_and_a_bundle_copy_is_found_by_step(tmp_path):
    for step in (3, 12, 7):
        replay_files.save(replay_files.replay_dir(tmp_path / "dump", 2, step), {"rank": 2, "step": step},
                          {"arg0": np.zeros(3, np.float32)}, {"w": np.ones(2, np.float32)})
    (replay_files.replay_dir(tmp_path / "dump", 2, 40)).mkdir()  # begun, never written: not a record
    assert replay_files.newest(tmp_path / "dump", 2).name == "step12"
    assert replay_files.newest(tmp_path / "dump", 5) is None
    bundle = tmp_path / "incident" / "rank_2" / "rdr"
    shutil.copytree(replay_files.newest(tmp_path / "dump", 2), replay_files.bundle_copy(bundle, 12))
    assert replay_files.find_in_bundle(tmp_path / "incident" / "rank_2", 12) == bundle / "replay" / "step12"
    assert replay_files.find_in_bundle(tmp_path / "incident" / "rank_2", 3) is None
    meta, inputs, params = replay_files.load(replay_files.find_in_bundle(tmp_path / "incident" / "rank_2", 12))
    assert meta["step"] == 12 and params["w"].tolist() == [1.0, 1.0]
