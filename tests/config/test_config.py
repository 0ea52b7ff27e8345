"""config.json loading: msProbe fields, rankscope sections, strict errors, precedence."""
from __future__ import annotations

import json

import pytest

from rankscope.config.msprobe import (
    ClusterSettings,
    ConfigError,
    DebuggerConfig,
    config_from_dict,
    load_config,
    parse_cluster,
    ranks_not_in_job,
)


def write(tmp_path, obj) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(obj) if not isinstance(obj, str) else obj)
    return str(path)


# The config.json msProbe ships (msprobe/config.json): must load unchanged.
MSPROBE_DEFAULT = {
    "task": "statistics", "dump_path": "./dump_path", "rank": [], "step": [], "level": "L1",
    "extra_info": True, "async_dump": False,
    "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"},
    "tensor": {"scope": [], "list": [], "data_mode": ["all"]},
    "acc_check": {"white_list": [], "black_list": [], "error_data_path": "./"},
}


def test_defaults_follow_msprobe_without_a_file():
    cfg = load_config()
    assert (cfg.task, cfg.dump_path, cfg.level, cfg.summary_mode) == ("statistics", "./dump_path", "L1", "statistics")
    assert cfg.rank == [] and cfg.step == [] and cfg.data_mode == ["all"]
    assert cfg.rdr is None and cfg.cluster == ClusterSettings()


def test_msprobe_shipped_config_loads(tmp_path):
    cfg = load_config(write(tmp_path, MSPROBE_DEFAULT))
    assert cfg.task == "statistics" and cfg.level == "L1"


def test_full_config_with_task_section_chosen_by_task(tmp_path):
    raw = {
        "task": "tensor", "dump_path": "/tmp/d", "rank": [0, "2-3"], "step": ["4-6", 1, 5], "level": "L0",
        "statistics": {"summary_mode": "md5", "list": ["ignored"]},
        "tensor": {"scope": ["Cell.a", "Cell.b"], "list": ["relu"], "data_mode": ["forward", "input"]},
        "rdr": {"enable": True, "mode": 2, "path": "/var/rdr"},
        "cluster": {"agent": "ipc:///tmp/a.sock", "job": "j1", "groups": [[0, 1], [2, 3]],
                    "on_divergence": "export", "deadline_s": 5, "detectors": {"outlier": {"z": 6}},
                    "watchpoints": [{"condition": "TO"}], "dp_index": 2},
    }
    cfg = load_config(write(tmp_path, raw))
    assert cfg.task == "tensor" and cfg.level == "L0" and cfg.dump_path == "/tmp/d"
    assert cfg.rank == [0, 2, 3]
    assert cfg.step == [1, 4, 5, 6]  # sorted, de-duplicated, range expanded
    # Values come from the "tensor" section because task is tensor.
    assert cfg.scope == ["Cell.a", "Cell.b"] and cfg.list == ["relu"]
    assert cfg.data_mode == ["forward", "input"] and cfg.summary_mode == "statistics"
    assert cfg.rdr == {"enable": True, "mode": 2, "path": "/var/rdr"}
    c = cfg.cluster
    assert (c.agent, c.job, c.groups, c.on_divergence, c.deadline_s, c.dp_index) == \
        ("ipc:///tmp/a.sock", "j1", ((0, 1), (2, 3)), "export", 5.0, 2)
    assert isinstance(c.deadline_s, float)
    assert c.detectors.outlier.z == 6.0 and [w.condition.value for w in c.watchpoints] == ["TO"]
    assert cfg.step_selected(5) and not cfg.step_selected(3)
    assert cfg.rank_selected(2) and not cfg.rank_selected(1) and cfg.rank_selected(None)


def test_constructor_args_win_over_file(tmp_path):
    path = write(tmp_path, {"task": "statistics", "dump_path": "/a", "level": "L1", "step": [1],
                            "tensor": {"list": ["x"]}})
    cfg = load_config(path, task="tensor", dump_path="/b", level="mix", step=["2-3"])
    assert (cfg.task, cfg.dump_path, cfg.level, cfg.step) == ("tensor", "/b", "mix", [2, 3])
    assert cfg.list == ["x"]  # the overriding task selects its section


def test_to_dict_is_json_round_trippable(tmp_path):
    cfg = load_config(write(tmp_path, {"cluster": {"groups": "replicas"}, "rdr": {"enable": False}}))
    d = cfg.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["cluster"]["groups"] == "replicas" and d["rdr"] == {"enable": False}
    assert set(d) == set(DebuggerConfig.__dataclass_fields__)


@pytest.mark.parametrize("raw, field, value", [
    ({"taks": "statistics"}, "taks", "statistics"),
    ({"task": "overflow"}, "task", "overflow"),
    ({"level": "L3"}, "level", "L3"),
    ({"level": "l2"}, "level", "l2"),
    ({"level": "L2", "statistics": {"scope": ["Cell.a", "Cell.b"]}}, "statistics.scope", ["Cell.a", "Cell.b"]),
    ({"level": 0}, "level", 0),
    ({"dump_path": 5}, "dump_path", 5),
    ({"step": "1-3"}, "step", "1-3"),
    ({"step": ["6-4"]}, "step", "6-4"),
    ({"step": ["a-b"]}, "step", "a-b"),
    ({"step": ["1-2-3"]}, "step", "1-2-3"),
    ({"step": [1.5]}, "step", 1.5),
    ({"rank": [-1]}, "rank", -1),
    ({"rank": [True]}, "rank", True),
    ({"statistics": {"summary_mode": "sha"}}, "statistics.summary_mode", "sha"),
    ({"statistics": {"sumary_mode": "md5"}}, "statistics.sumary_mode", "md5"),
    ({"statistics": {"data_mode": ["all", "input"]}}, "statistics.data_mode", ["all", "input"]),
    ({"statistics": {"data_mode": ["inputs"]}}, "statistics.data_mode", "inputs"),
    ({"statistics": {"scope": ["only-one"]}}, "statistics.scope", ["only-one"]),
    ({"statistics": {"list": "relu"}}, "statistics.list", "relu"),
    ({"statistics": []}, "statistics", []),
    ({"rdr": {"enable": "yes"}}, "rdr.enable", "yes"),
    ({"rdr": {"mode": 3}}, "rdr.mode", 3),
    ({"rdr": {"path": "relative/dir"}}, "rdr.path", "relative/dir"),
    ({"rdr": {"paht": "/x"}}, "rdr.paht", "/x"),
    ({"cluster": {"agnet": "x"}}, "cluster.agnet", "x"),
    ({"cluster": {"agent": ""}}, "cluster.agent", ""),
    ({"cluster": {"sentinels": 1}}, "cluster.sentinels", 1),
    ({"cluster": {"groups": "tp"}}, "cluster.groups", "tp"),
    ({"cluster": {"groups": [[0, 1], [1, 2]]}}, "cluster.groups[1]", 1),
    ({"cluster": {"groups": [[0, "1"]]}}, "cluster.groups[0]", "1"),
    ({"cluster": {"on_divergence": "stop"}}, "cluster.on_divergence", "stop"),
    ({"cluster": {"on_terminate": "kill"}}, "cluster.on_terminate", "kill"),
    ({"cluster": {"deadline_s": 0}}, "cluster.deadline_s", 0),
    ({"cluster": {"deadline_s": True}}, "cluster.deadline_s", True),
    ({"cluster": {"flight_recorder_steps": 0}}, "cluster.flight_recorder_steps", 0),
    ({"cluster": {"dp_index": -2}}, "cluster.dp_index", -2),
    ({"cluster": {"detectors": []}}, "cluster.detectors", []),
    ({"cluster": {"watchpoints": {}}}, "cluster.watchpoints", {}),
    ({"cluster": {"watch": "light"}}, "cluster.watch", "light"),
    ({"cluster": {"budget": 0}}, "cluster.budget", 0),
    ({"cluster": {"budget": 5}}, "cluster.budget", 5),
    ({"cluster": "on"}, "cluster", "on"),
])
def test_bad_fields_name_field_and_value(tmp_path, raw, field, value):
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, raw))
    err = info.value
    assert err.field == field and err.value == value
    assert isinstance(err, ValueError)
    assert repr(field) in str(err) and repr(value) in str(err)


@pytest.mark.parametrize("kwargs, field", [
    ({"task": "overflow_check"}, "task"), ({"level": "L3"}, "level"),
    ({"step": ["x"]}, "step"), ({"dump_path": ""}, "dump_path"),
])
def test_bad_constructor_args_are_named(kwargs, field):
    with pytest.raises(ConfigError) as info:
        load_config(None, **kwargs)
    assert info.value.field == field


def test_unreadable_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "missing.json")
    assert info.value.field == "config_path" and "missing.json" in str(info.value)
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, '{"task": "statistics",}'))
    assert "line 1" in str(info.value)
    with pytest.raises(ConfigError, match="JSON object"):
        load_config(write(tmp_path, "[1, 2]"))


def test_step_range_bounds():
    assert config_from_dict({"step": ["0-2", "2"]}).step == [0, 1, 2]
    with pytest.raises(ConfigError, match="1000000"):
        config_from_dict({"step": ["1-1000001"]})


def test_parse_cluster_defaults_and_none():
    assert parse_cluster(None) == ClusterSettings() == parse_cluster({})
    assert parse_cluster({"on_terminate": "exit"}).on_terminate == "exit"


def test_level_l2_is_msprobes_kernel_level(tmp_path):
    """msProbe's static-graph kernel dump: accepted from the file and the constructor,
    with a task section's kernel list; one spelling."""
    from rankscope.config.schema import KERNEL_LEVEL
    assert KERNEL_LEVEL == "L2"
    cfg = load_config(write(tmp_path, {"task": "tensor", "level": "L2", "step": [2, 3],
                                       "tensor": {"list": ["MatMul"]}}))
    assert (cfg.task, cfg.level, cfg.step, cfg.list) == ("tensor", "L2", [2, 3], ["MatMul"])
    assert load_config(None, level="L2").level == "L2"
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, {"level": "L2", "statistics": {"scope": ["Cell.a", "Cell.b"]}}))
    assert "level L2 does not record" in str(err.value)
    with pytest.raises(ConfigError) as err:
        load_config(None, level="L4")
    assert "'L2'" in str(err.value)  # the error lists it among the levels


def test_a_rank_list_naming_ids_the_job_lacks_is_said_with_what_is_still_dumped():
    assert ranks_not_in_job([1, 7], 4) == ("config rank [1, 7]: [7] is not a rank of this 4-rank job (ids 0-3); "
                                           "only ranks [1] are dumped")
    assert ranks_not_in_job([7, 9], 4).endswith("[7, 9] are not a rank of this 4-rank job (ids 0-3); no rank is dumped")
    assert ranks_not_in_job([0, 3], 4) is None and ranks_not_in_job([], 4) is None
    assert ranks_not_in_job([7], None) is None  # world size unknown: nothing to compare with
