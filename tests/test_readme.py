"""The README's config.json example must load: users copy it first."""
from __future__ import annotations

import json
import re

from repo_paths import REPO

from rankscope.config.cluster import parse_cluster
from rankscope.config.msprobe import load_config

README = REPO / "README.md"


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
    parse_cluster(doc["cluster"])  # raises naming the field if the example rotted
