"""Run by tests/e2e/test_console_wide.py in a process of its own: a local Ray started in
the test process would inherit the Ray configuration an earlier test left there (the Helm
test switches Ray's token authentication), and Ray allows one per process.

Prints one line ``RESULT {json}``: what the page showed, and what the run planted."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.browser import chromium_page  # noqa: E402

RANKS = 1024
SHOTS = os.environ.get("RANKSCOPE_SHOTS")


def _until(what: str, cond, timeout: float = 60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"no {what} within {timeout} s")


def main() -> int:
    from rankscope.coordinator.console.server import ConsoleServer
    from rankscope.coordinator.server.ingest_bench import run_ingest
    seen: dict = {}

    def attach(coord):
        server = ConsoleServer(coord, None)
        url = server.start()

        def look() -> None:  # called once every step is judged, before the coordinator stops
            try:
                with chromium_page() as page:
                    errors: list[str] = []
                    page.on("pageerror", lambda exc: errors.append(str(exc)))
                    page.goto(url)
                    verdict = page.locator("tr.verdict").first
                    _until("the verdict", lambda: page.locator("tr.verdict").count() > 0)
                    seen["rank"] = int(verdict.locator("td.rank").inner_text())
                    seen["step"] = int(verdict.locator("td.step").inner_text())
                    fig = page.locator("figure.grid").first
                    seen["caption"] = fig.locator("figcaption").inner_text()
                    seen["ranks_drawn"] = int(fig.get_attribute("data-ranks"))
                    canvas = fig.locator("canvas")
                    block, ch, cw = (int(canvas.get_attribute(f"data-{k}")) for k in ("block", "ch", "cw"))
                    seen["block"] = block
                    seen["rows_tall"] = int(canvas.evaluate("c => c.height")) // ch
                    first = int(seen["caption"].rsplit("steps ", 1)[1].split("–")[0])
                    col = seen["step"] - first  # judged steps, oldest left, one column each
                    box = canvas.bounding_box()
                    scale = box["width"] / float(canvas.evaluate("c => c.width"))

                    def click(column: int, rank: int) -> None:
                        canvas.click(position={"x": (column * cw + cw / 2) * scale,
                                               "y": ((rank // block) * ch + ch / 2) * scale})
                        _until(f"the model tree of step {first + column}",
                               lambda: f"step {first + column} " in page.locator("#tree-caption").inner_text() + " ")
                    click(0, 0)  # another step first: the page starts on the newest one
                    click(col, seen["rank"])  # the block holding the named rank, at its step
                    page.locator("#tree-list li.leaf").first.click()
                    _until("the tensor view", lambda: page.locator("#tensor-table tr[data-rank]").count() > 0)
                    top_row = page.locator("#tensor-table tr[data-rank]").first
                    seen["first_row"] = int(top_row.get_attribute("data-rank"))
                    if SHOTS:  # the closing notes' picture of the wide grid
                        page.screenshot(path=str(Path(SHOTS) / "console-1024-ranks.png"), full_page=True)
                    seen["tree_caption"] = page.locator("#tree-caption").inner_text()
                    seen["table_rows"] = page.locator("#rank-table tbody tr").count()
                    seen["leaves"] = page.locator("#tree-list li.leaf").all_inner_texts()
                    seen["errors"] = errors
            except Exception as exc:  # noqa: BLE001 - asserted after the run, which must stop its actor
                seen["failed"] = repr(exc)
            finally:
                server.stop()
        return look

    out = run_ingest(RANKS, 8, 4, paced=2, pace_s=0.2, attach=attach, log=lambda m: None)
    print("RESULT " + json.dumps({"seen": seen, "out": {k: out[k] for k in ("correct", "fault_rank", "flagged_step")}}),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
