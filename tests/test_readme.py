"""The README's config.json example must load: users copy it first."""
from __future__ import annotations

import json
import re
from pathlib import Path

from agent.config import load_config
from coordinator.logic.settings import parse_settings

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_config_example() -> dict:
    text = README.read_text()
    section = text[text.index("### config.json"):]
    block = re.search(r"```json\n(.*?)```", section, re.S)
    assert block, "README's config.json section has no json block"
    return json.loads(block.group(1))


def test_readme_config_example_is_accepted_by_probe_and_coordinator(tmp_path):
    doc = readme_config_example()
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc))
    cfg = load_config(str(path))
    assert cfg.level == doc["level"] and cfg.task == doc["task"]
    assert cfg.step == [0, 1, 2, 3, 10]  # "0-3" expanded, as msProbe does
    assert cfg.cluster.on_divergence == doc["cluster"]["on_divergence"]
    parse_settings(doc["cluster"])  # raises naming the field if the example rotted


def test_probe_and_coordinator_accept_the_same_cluster_fields():
    # One config.json feeds both: a key one side accepts and the other rejects would
    # make a valid coordinator setting crash every rank at construction.
    from agent.config import ClusterConfig, parse_cluster
    from coordinator.logic.settings import SettingsError
    probe_keys = set(ClusterConfig.__dataclass_fields__)
    for key in probe_keys:
        try:
            parse_settings({key: None})
        except SettingsError as exc:
            assert "unknown field" not in str(exc), f"coordinator rejects probe field {key}"
    sample = {"pause_timeout_s": 5, "export_timeout_s": 60, "max_pending_steps": 16, "deadline_s": 10}
    parse_cluster(sample)
    parse_settings(sample)
