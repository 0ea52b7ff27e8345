"""The console at 1,024 ranks, in Debian's Chromium: a real coordinator actor fed by
simulated ranks over real sockets (``rankscope bench ingest``'s generator), its fault
planted on one rank at a known step. The grid draws every rank in blocks (a block shows its
worst rank), the verdict names the rank, a click on the block that holds it picks that
rank and step and loads the model tree, and the rank table lists every rank. The run is
tests/e2e/console_wide_run.py, in a process of its own (a private Ray)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.browser import MISSING

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600),
              pytest.mark.skipif(MISSING is not None, reason=str(MISSING))]
RUN = Path(__file__).with_name("console_wide_run.py")
RANKS = 1024


def test_a_thousand_ranks_on_one_page():
    r = subprocess.run([sys.executable, str(RUN)], capture_output=True, text=True, timeout=540)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert r.returncode == 0 and line, (r.returncode, r.stdout[-2000:], r.stderr[-4000:])
    got = json.loads(line[len("RESULT "):])
    seen, out = got["seen"], got["out"]
    assert "failed" not in seen, seen["failed"]
    assert out["correct"], out
    assert (seen["rank"], seen["step"]) == (out["fault_rank"], out["flagged_step"])
    assert seen["ranks_drawn"] == RANKS and seen["block"] == 4 and seen["rows_tall"] == RANKS // 4
    assert f"{RANKS} ranks in blocks of 4" in seen["caption"], seen["caption"]
    # The click picked the faulty rank out of its block, at the verdict's step: the tensor
    # view lists it first.
    assert f"step {seen['step']}" in seen["tree_caption"] and seen["first_row"] == seen["rank"], seen
    assert any(f"furthest off: rank {seen['rank']}" in t for t in seen["leaves"]), seen["leaves"][:10]
    assert seen["table_rows"] == RANKS
    assert not seen["errors"], seen["errors"]
