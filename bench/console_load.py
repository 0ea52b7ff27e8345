"""What open console pages cost the coordinator: ingest throughput and judge latency of
``rankscope bench ingest`` (simulated ranks over real sockets into a real coordinator
actor) without a console, and with a console serving PAGES open pages, rounds
alternating. Each page holds the event stream open, as a browser tab does, and asks for
the model tree every few seconds as someone clicking around would.

    .venv/bin/python bench/console_load.py --ranks 256 --pages 20 --rounds 5 [--paced 30]

Prints one line per run and a JSON line: the medians of the runs and their ratios
(console / none), and the judge latency's percentiles over every paced step of every round.
"""
from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: Seconds between two model-tree requests of one page.
TREE_EVERY_S = 3.0


class Pages:
    """PAGES threads, each an open console page: the event stream read to its end."""

    def __init__(self, server, n: int) -> None:
        self.server, self.n = server, n
        self.events = 0
        self.trees = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._page, daemon=True) for _ in range(n)]
        for t in self._threads:
            t.start()

    def _page(self) -> None:
        # A stand-in for a browser on another machine: it takes no CPU from this host's
        # job at the job's expense (the console's own threads run at this priority too).
        from rankscope.coordinator.console.priority import yield_cpu
        yield_cpu()
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=30)
        conn.request("GET", f"/api/events?token={self.server.token}")
        resp = conn.getresponse()
        side = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=30)
        next_tree = time.monotonic() + TREE_EVERY_S
        while not self._stop.is_set():
            line = resp.fp.readline()
            if not line:
                break
            if line.startswith(b"data: "):
                self.events += 1
                if time.monotonic() < next_tree:
                    continue  # a browser on another machine parses it there, not on this host
                group = next(iter(json.loads(line[6:]).get("grid") or {}), None)
                if group:
                    side.request("GET", f"/api/tensors?group={group}&token={self.server.token}")
                    side.getresponse().read()
                    self.trees += 1
                    next_tree = time.monotonic() + TREE_EVERY_S
        conn.close()
        side.close()

    def close(self) -> None:
        self._stop.set()


def one_run(args: argparse.Namespace, pages: int) -> dict:
    from rankscope.coordinator.console.server import ConsoleServer
    from rankscope.coordinator.server.ingest_bench import run_ingest
    held: dict = {}

    def attach(coord):
        if not pages:
            return None
        server = ConsoleServer(coord, None)
        server.start()
        held["pages"] = Pages(server, pages)
        held["server"] = server

        def detach():
            held["pages"].close()
            held["reads"] = server.feed.reads
            held["read_ms"] = round(server.feed.last_read_s * 1e3, 1)
            server.stop()
        return detach

    out = run_ingest(args.ranks, args.tensors, args.steps, attach=attach, log=lambda m: None, paced=args.paced)
    if pages:
        out["page_events"] = held["pages"].events
        out["page_trees"] = held["pages"].trees
        out["coordinator_reads"] = held["reads"]
        out["snapshot_ms"] = held["read_ms"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=256)
    ap.add_argument("--tensors", type=int, default=128)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--pages", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--paced", type=int, default=30,
                    help="clean steps sent one every 0.5 s after the burst, each timed to its verdict (default: %(default)s)")
    args = ap.parse_args()
    runs: dict[str, list[dict]] = {"none": [], "console": []}
    for i in range(args.rounds):
        for mode, pages in (("none", 0), ("console", args.pages)):
            r = one_run(args, pages)
            runs[mode].append(r)
            extra = (f"  pages got {r['page_events']} snapshots, {r['page_trees']} model trees; "
                     f"{r['coordinator_reads']} coordinator reads, the last {r['snapshot_ms']} ms") if pages else ""
            print(f"round {i + 1} {mode:8s} {r['records_per_s']:>12,.0f} records/s  judge latency median "
                  f"{r['judge_latency_ms_median']} ms  p99 {r['judge_latency_ms_p99']} ms  correct {r['correct']}"
                  + extra, flush=True)

    def med(mode: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[mode])

    summary = {"ranks": args.ranks, "tensors": args.tensors, "pages": args.pages, "rounds": args.rounds,
               "paced": args.paced}
    for key in ("records_per_s", "judge_latency_ms_median", "judge_latency_ms_p99"):
        summary[key] = {"none": med("none", key), "console": med("console", key),
                        "ratio": round(med("console", key) / med("none", key), 3)}
    # One run's p99 is the largest of its few paced steps: pooled over the rounds, the
    # percentiles stand on rounds x paced steps each.
    for q in (50, 95, 99):
        pooled = {m: float(np.percentile([x for r in runs[m] for x in r["judge_latency_ms"]], q)) for m in runs}
        summary[f"pooled_judge_latency_ms_p{q}"] = {m: round(v, 1) for m, v in pooled.items()} | {
            "ratio": round(pooled["console"] / pooled["none"], 3)}
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
