"""A bundle written only to be sent is sent once and then gone: the incident folder is
the one copy; a bundle that lives elsewhere is left alone."""
from __future__ import annotations

import queue

from rankscope.client.transfers import export_scratch, run_export
from rankscope.rdr.bundle import write_bundle


def _export(on_export) -> list:
    out: queue.Queue = queue.Queue()
    run_export(out, on_export, "inc-1", "inc-1", 3)
    items = []
    while not out.empty():
        items.append(out.get())
    return items


def test_a_scratch_bundle_is_sent_then_removed():
    made = {}

    def on_export(incident):
        bundle = write_bundle(export_scratch(incident), 3, reason="export", steps=())
        made["root"] = bundle
        return [p for p in bundle.rglob("*") if p.is_file()]

    items = _export(on_export)
    paths = {body["path"] for kind, body in items if kind == "chunk"}
    assert "manifest.json" in {p.rsplit("/", 1)[-1] for p in paths}, paths
    scratch = [p for p in made["root"].parents if p.name.startswith("rankscope-export-inc-1")]
    assert scratch and not scratch[0].exists()


def test_a_bundle_outside_the_scratch_folders_stays(tmp_path):
    bundle = write_bundle(tmp_path / "keep", 3, reason="export", steps=())
    items = _export(lambda incident: [p for p in bundle.rglob("*") if p.is_file()])
    assert [k for k, _ in items if k == "chunk"]
    assert (bundle / "manifest.json").is_file()
