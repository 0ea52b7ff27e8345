"""The job's config: what launch hands every rank, and a rank's own config beside it."""
from __future__ import annotations

import json

import pytest

from rankscope.config.errors import ConfigError
from rankscope.config.job import CLUSTER_WIDE, LAUNCH_DEFAULTS, job_config, rank_config


def _write(path, doc):
    path.write_text(json.dumps(doc))
    return path


def test_job_config_is_the_whole_file_with_on_divergence_settled(tmp_path):
    cfg = _write(tmp_path / "c.json", {"level": "mix", "statistics": {"scope": []},
                                       "cluster": {"sentinels": False, "flight_recorder_steps": 3}})
    job = job_config(cfg, "export")
    assert job["level"] == "mix" and job["cluster"] == {"sentinels": False, "flight_recorder_steps": 3,
                                                        "on_divergence": "export"}
    assert job_config(None) == {**LAUNCH_DEFAULTS, "cluster": {"on_divergence": "pause"}}
    with pytest.raises(ConfigError, match="cluster.on_divergence"):
        job_config(_write(tmp_path / "bad.json", {"cluster": {"on_divergence": "stop"}}))


def test_a_debugger_with_no_arguments_takes_the_jobs_config_and_dump_path(tmp_path):
    job = _write(tmp_path / "job.json", job_config(None, "export"))
    env = {"RANKSCOPE_CONFIG": str(job), "RANKSCOPE_DUMP_PATH": str(tmp_path / "out" / "local_dump")}
    cfg, note = rank_config(env=env)
    assert (cfg.level, cfg.dump_path, cfg.cluster.on_divergence.value) == ("L0", env["RANKSCOPE_DUMP_PATH"], "export")
    assert note is None
    # msProbe's rule: arguments win over the file and launch's dump path
    cfg, _ = rank_config(level="L1", dump_path=str(tmp_path / "mine"), env=env)
    assert (cfg.level, cfg.dump_path) == ("L1", str(tmp_path / "mine"))
    # outside launch nothing changes: msProbe's defaults
    cfg, note = rank_config(env={})
    assert (cfg.level, cfg.dump_path, note) == ("L1", "./dump_path", None)


def test_a_ranks_own_config_keeps_its_capture_but_not_cluster_wide_settings(tmp_path):
    job = _write(tmp_path / "job.json", job_config(_write(tmp_path / "c.json", {
        "level": "L0", "cluster": {"on_divergence": "export", "on_terminate": "exit", "groups": "replicas"}})))
    own = _write(tmp_path / "own.json", {"level": "mix", "dump_path": str(tmp_path / "own_dump"),
                                         "cluster": {"on_divergence": "pause", "groups": "replicas",
                                                     "flight_recorder_steps": 2}})
    env = {"RANKSCOPE_CONFIG": str(job), "RANKSCOPE_DUMP_PATH": str(tmp_path / "launch_dump")}
    cfg, note = rank_config(own, env=env)
    assert cfg.level == "mix" and cfg.dump_path == str(tmp_path / "own_dump")  # its own file names one
    assert cfg.cluster.flight_recorder_steps == 2  # capture: the rank's own
    assert (cfg.cluster.on_divergence.value, cfg.cluster.on_terminate) == ("export", "exit")  # the job's
    assert cfg.cluster.to_dict()["on_divergence"] == "export"
    assert "on_divergence: 'pause' here, 'export' for the job" in note
    # on_terminate: not in the rank's file, so nothing it wrote is overridden; the job's holds
    assert "on_terminate" not in note and "groups" not in note and "The job's values are in force" in note
    # an msProbe config (no cluster section): the job's settings, and nothing to say
    cfg, note = rank_config(_write(tmp_path / "msprobe.json", {"task": "statistics", "level": "L0"}), env=env)
    assert note is None and (cfg.cluster.on_divergence.value, cfg.cluster.on_terminate) == ("export", "exit")
    # the job's own file given explicitly is not "another" config
    assert rank_config(job, env=env)[1] is None
    # an own config with no dump_path still dumps under launch's folder
    cfg, _ = rank_config(_write(tmp_path / "nodump.json", {"cluster": {"on_divergence": "export",
                                                                       "on_terminate": "exit",
                                                                       "groups": "replicas"}}), env=env)
    assert cfg.dump_path == str(tmp_path / "launch_dump")


def test_cluster_wide_settings_are_known_cluster_fields():
    from rankscope.config.cluster import KNOWN_FIELDS
    assert set(CLUSTER_WIDE) <= KNOWN_FIELDS
    assert not {"agent", "job", "dp_index", "sentinels", "flight_recorder_steps"} & set(CLUSTER_WIDE)
