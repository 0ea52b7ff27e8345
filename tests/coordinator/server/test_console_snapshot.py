"""The console's snapshot from a real coordinator service (its loop thread, no Ray): the
grid's steps after the ones the console holds, the coverage kept between reads, and a
malformed ``since`` refused naming the field."""
from __future__ import annotations

import numpy as np
import pytest

from rankscope.coordinator.server.ingest_load import simulated_batch
from rankscope.coordinator.server.service import CoordinatorService
from rankscope.wire import protocol

RANKS, TENSORS = 4, 8


@pytest.fixture
def svc(tmp_path):
    s = CoordinatorService(tmp_path / "out", {"job": "j"}, job="j")
    s.start()
    yield s
    s.stop()


def _judge(svc, steps):
    core, dec, rng = svc.core, protocol.Decoder(job="j"), np.random.default_rng(0)

    def feed():
        for r in range(RANKS):
            core.on_register("j", r, {"world_size": RANKS})
        for s in steps:
            frames = [protocol.encode(protocol.step_message(simulated_batch("j", r, s, TENSORS, rng), f"rank:{r}", s))
                      for r in range(RANKS)]
            core.on_steps([protocol.step_from_message(dec.decode(f)) for f in frames])
            core.tick()
    svc.frontend.call_sync(feed)


def test_a_snapshot_sends_only_the_steps_after_the_ones_held(svc):
    _judge(svc, range(8))
    whole = svc.console("snapshot", {})
    [(group, grid)] = whole["grid"].items()
    assert grid["ranks"] == list(range(RANKS)) and grid["steps"][-1] >= 5
    assert whole["ranks"].keys() == {str(r) for r in range(RANKS)} and whole["coverage"]["j"]["steps"]
    held = grid["steps"][-1]
    assert svc.console("snapshot", {"since": {group: held}})["grid"][group]["steps"] == []
    _judge(svc, range(8, 11))
    newer = svc.console("snapshot", {"since": {group: held}})
    assert newer["grid"][group]["steps"] and min(newer["grid"][group]["steps"]) == held + 1
    # Coverage is read again only every few seconds: the held one until then.
    assert newer["coverage"] == whole["coverage"]


@pytest.mark.parametrize("since", [[1], {"g": "7"}, {"g": True}, {3: 4}])
def test_a_malformed_since_is_refused_naming_the_field(svc, since):
    with pytest.raises(ValueError, match="args.since must map a group to a step"):
        svc.console("snapshot", {"since": since})
