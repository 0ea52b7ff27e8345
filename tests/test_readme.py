"""The README and the documentation site: the config.json example users copy first must
load, the README stays a short front page, and every link and page of the site holds."""
from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from repo_paths import REPO

from rankscope.config.cluster import parse_cluster
from rankscope.config.msprobe import load_config

README = REPO / "README.md"
DOCS = REPO / "docs"
CONFIG_PAGE = DOCS / "reference" / "config.md"
README_MAX_LINES = 200

#: [text](target) and ![alt](target); a target ends at whitespace or ")".
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def config_example() -> dict:
    text = CONFIG_PAGE.read_text()
    block = re.search(r"```json\n(.*?)```", text, re.S)
    assert block, f"{CONFIG_PAGE.relative_to(REPO)} has no json block"
    return json.loads(block.group(1))


def test_config_example_is_accepted_by_probe_and_coordinator(tmp_path):
    doc = config_example()
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc))
    cfg = load_config(str(path))
    assert cfg.level == doc["level"] and cfg.task == doc["task"]
    assert cfg.step == [0, 1, 2, 3, 10]  # "0-3" expanded, as msProbe does
    assert cfg.cluster.on_divergence == doc["cluster"]["on_divergence"]
    parse_cluster(doc["cluster"])  # raises naming the field if the example rotted


def test_readme_is_a_short_front_page_with_the_two_commands():
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES, "move detail into docs/, not into the README"
    # .ci/run and the Makefile's header promise these two, exactly.
    assert "make demo    #" in text and "make test    #" in text


def relative_links(page: Path) -> list[str]:
    # Code blocks hold shell and JSON, whose brackets are not links.
    text = FENCE.sub("", page.read_text())
    return [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def doc_pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def test_every_relative_link_in_the_readme_and_the_docs_points_to_a_file():
    broken = []
    for page in [README, *doc_pages()]:
        for target in relative_links(page):
            path = target.split("#", 1)[0]
            if path and not (page.parent / path).resolve().exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
    assert not broken, broken


def nav_pages(node) -> set[str]:
    if isinstance(node, str):
        return {node}
    if isinstance(node, list):
        return set().union(*(nav_pages(n) for n in node))
    if isinstance(node, dict):
        return set().union(*(nav_pages(v) for v in node.values()))
    return set()


def test_every_docs_page_is_in_the_nav():
    nav = nav_pages(yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"])
    pages = {p.relative_to(DOCS).as_posix() for p in doc_pages()}
    assert pages - nav == set(), "pages missing from mkdocs.yml's nav"
    assert nav - pages == set(), "nav entries with no page"
