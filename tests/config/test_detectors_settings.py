"""parse_cluster: the cluster section, with errors that name the field and value."""
from __future__ import annotations

import pytest

from rankscope.config.cluster import OnDivergence, parse_cluster
from rankscope.config.errors import ConfigError


def test_defaults_and_a_full_section() -> None:
    d = parse_cluster({})
    assert (d.groups, d.on_divergence, d.deadline_s, d.detectors.outlier.ratio) == ("dp", OnDivergence.PAUSE, 30.0, 4.0)
    s = parse_cluster({
        "agent": "ipc:///tmp/a", "job": "j1", "sentinels": True, "on_terminate": "exit", "dp_index": 2,
        "groups": [[0, 1], [2, 3]], "on_divergence": "terminate", "deadline_s": 5, "flight_recorder_steps": 4,
        "detectors": {"outlier": {"z": 6, "ratio": 3.0, "min_history": 5}, "replica": False,
                      "progress": {"lag_steps": None}, "repeat_after_steps": 10},
        "watchpoints": [{"condition": "TO"}], "export_timeout_s": 9.5,
    })
    assert s.groups == ((0, 1), (2, 3)) and s.job == "j1"
    assert s.on_divergence is OnDivergence.TERMINATE and s.deadline_s == 5.0
    assert (s.detectors.outlier.z, s.detectors.outlier.ratio, s.detectors.outlier.min_history) == (6.0, 3.0, 5)
    assert s.detectors.replica.enabled is False and s.detectors.progress.lag_steps is None
    assert s.detectors.repeat_after_steps == 10 and s.export_timeout_s == 9.5
    assert s.watchpoints[0].condition.value == "TO"


@pytest.mark.parametrize("section, field", [
    ({"colour": 1}, "cluster.colour"),
    ({"groups": "tp"}, "cluster.groups"),
    ({"groups": [[0, 1], [1, 2]]}, "cluster.groups[1]"),
    ({"groups": [[0, -1]]}, "cluster.groups[0]"),
    ({"groups": []}, "cluster.groups"),
    ({"on_divergence": "stop"}, "cluster.on_divergence"),
    ({"deadline_s": 0}, "cluster.deadline_s"),
    ({"deadline_s": "30"}, "cluster.deadline_s"),
    ({"max_pending_steps": 1.5}, "cluster.max_pending_steps"),
    ({"detectors": []}, "cluster.detectors"),
    ({"detectors": {"magic": {}}}, "cluster.detectors.magic"),
    ({"detectors": {"outlier": {"zz": 1}}}, "cluster.detectors.outlier.zz"),
    ({"detectors": {"outlier": {"ratio": 1.0}}}, "cluster.detectors.outlier.ratio"),
    ({"detectors": {"outlier": {"history_alpha": 1.5}}}, "cluster.detectors.outlier.history_alpha"),
    ({"detectors": {"outlier": {"enabled": "yes"}}}, "cluster.detectors.outlier.enabled"),
    ({"detectors": {"progress": {"lag_steps": 0}}}, "cluster.detectors.progress.lag_steps"),
    ({"detectors": {"nan_origin": 3}}, "cluster.detectors.nan_origin"),
    ({"job": 5}, "cluster.job"),
])
def test_bad_fields_are_named(section, field) -> None:
    with pytest.raises(ConfigError) as err:
        parse_cluster(section)
    assert err.value.field == field
    assert repr(field) in str(err.value)
    assert isinstance(err.value, ValueError)


def test_replica_kinds_are_validated() -> None:
    assert parse_cluster({"detectors": {"replica": {"kinds": ["PARAM"]}}}).detectors.replica.kinds == ("param",)
    with pytest.raises(ConfigError) as err:
        parse_cluster({"detectors": {"replica": {"kinds": ["params"]}}})
    assert err.value.field == "cluster.detectors.replica.kinds" and err.value.value == "params"


def test_long_names_are_accepted_as_aliases() -> None:
    s = parse_cluster({"detectors": {"peer_outlier": {"threshold": 12.0}, "replica_consistency": False},
                        "watchpoints": [{"condition": "gradient_explosion"}, {"condition": "Weight_Not_Changed"},
                                        {"condition": "tl", "max_gt": 1}]})
    assert s.detectors.outlier.z == 12.0 and s.detectors.replica.enabled is False
    assert [w.condition.value for w in s.watchpoints] == ["GE", "WNC", "TL"]
    with pytest.raises(ConfigError) as err:
        parse_cluster({"watchpoints": [{"condition": "operator_overflow"}]})
    assert "Ascend-only" in str(err.value)
