"""incident.json and state.json on disk: contents, strict JSON, damaged files."""
from __future__ import annotations

import json
import logging

import numpy as np

from rankscope.config.cluster import OnDivergence
from rankscope.coordinator.logic.incidents.incident import Incident, IncidentEvent
from rankscope.coordinator.logic.incidents.incident_store import IncidentStore, write_incident
from rankscope.coordinator.logic.verdict import Verdict


def _incident() -> Incident:
    ev = {"rule": "x", "value": float("nan"), "big": np.float64(np.inf), "n": np.int64(3), "by_rank": {1: 2.0}}
    v = Verdict("outlier", 3, 17, "Sentinel.loss", 40, "loss", "j/0", ev, [5], "j", None)
    return Incident("20260101T000000Z-outlier-r3-s17", "j", OnDivergence.PAUSE, v, 1.7e9)


def test_incident_json_has_the_contract_fields_in_strict_json(tmp_path) -> None:
    inc = _incident()
    inc.apply(IncidentEvent.START, 1.7e9)
    path = write_incident(tmp_path, inc, ranks={3: {"state": "paused", "step": 17}, 5: {"state": "lost", "step": 9}},
                          bundles={3: "/e/rank_3"}, rank_map=[{"assigned_rank": 3, "pid": 1}])
    assert path == tmp_path / "incidents" / inc.incident_id / "incident.json"
    text = path.read_text()
    doc = json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))  # no NaN/Infinity
    for key in ("incident_id", "detector", "first_diverging_rank", "step", "tensor", "detected_at",
                "evidence", "ranks", "bundles"):
        assert key in doc
    assert (doc["first_diverging_rank"], doc["ties"], doc["step"], doc["detector"]) == (3, [5], 17, "outlier")
    assert doc["detected_at"].startswith("2023-11-14T22:13:20")
    assert doc["evidence"]["value"] == "nan" and doc["evidence"]["big"] == "inf" and doc["evidence"]["n"] == 3
    assert doc["ranks"] == {"3": {"state": "paused", "step": 17}, "5": {"state": "lost", "step": 9}}
    assert doc["bundles"] == {"3": "/e/rank_3"} and doc["missing_bundles"] == [5]
    assert doc["rank_map"] == {"format": "rankscope-rank-map/1", "entries": [{"assigned_rank": 3, "pid": 1}]}
    assert doc["state"] == "pausing"
    assert not list(path.parent.glob(".*.tmp"))  # written via a temp file + rename


def test_state_round_trips_and_a_damaged_file_is_skipped(tmp_path, caplog) -> None:
    store = IncidentStore(tmp_path)
    inc = _incident()
    inc.apply(IncidentEvent.START, 1.7e9)
    inc.bundles[3] = "/e/rank_3"
    store.save(inc)
    bad = tmp_path / "incidents" / "broken" / "state.json"
    bad.parent.mkdir(parents=True)
    bad.write_text("{not json")
    with caplog.at_level(logging.ERROR):
        [back] = store.load_all()
    assert "broken" in caplog.text
    assert (back.incident_id, back.state, back.bundles, back.verdict.ties) == (inc.incident_id, inc.state, {3: "/e/rank_3"}, [5])
    assert back.history == inc.history
    assert IncidentStore(None).load_all() == []
