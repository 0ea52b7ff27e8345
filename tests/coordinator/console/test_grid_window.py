"""The console's own grid window: the coordinator's new steps merged in, each column
encoded once, and the page's JSON the same as the whole grid encoded at once."""
from __future__ import annotations

import json

import pytest

from rankscope.coordinator.console.grid import GridWindow, with_grid


def _grid(ranks, steps):
    return {"g": {"ranks": ranks, "steps": steps, "deviation": [[round(s * 0.1 + r, 4) for r in ranks] for s in steps]}}


def test_new_steps_merge_into_a_window_of_the_newest_steps():
    w = GridWindow(3)
    assert w.since() == {} and json.loads(w.encoded()) == {}
    w.merge(_grid([0, 1], [1, 2]))
    assert w.since() == {"g": 2}
    w.merge(_grid([0, 1], [2, 3, 4]))  # step 2 again (a second reader asked before the merge): once
    assert json.loads(w.encoded()) == _grid([0, 1], [2, 3, 4])
    w.merge(_grid([0, 1], []))
    assert w.since() == {"g": 4}


def test_a_group_whose_ranks_changed_starts_over_and_a_group_gone_is_dropped():
    w = GridWindow(8)
    w.merge({**_grid([0, 1], [1, 2]), "h": {"ranks": [2], "steps": [1], "deviation": [[None]]}})
    w.merge({"g": _grid([0, 1, 2], [3])["g"]})
    assert json.loads(w.encoded()) == _grid([0, 1, 2], [3])


def test_the_page_json_carries_the_grid_beside_the_rest():
    w = GridWindow(4)
    w.merge(_grid([0], [5]))
    doc = json.loads(with_grid(b'{"job":"j","ranks":{}}', w.encoded()))
    assert doc == {"job": "j", "ranks": {}, "grid": _grid([0], [5])}
    assert json.loads(with_grid(b"{}", b"{}")) == {"grid": {}}
    with pytest.raises(ValueError, match="JSON object"):
        with_grid(b"[1]", b"{}")
