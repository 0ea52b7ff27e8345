"""One ingest shard's first step against its next ones, in process (no Ray, no sockets).

The first step of a job is where a shard learns every rank's tensor names: it decodes
them, writes them to its names file (read again by a restarted shard), learns them and
builds each rank's column layout. This bench encodes R ranks' steps as node agents do
(packed frames of 8 ranks, records of one of two shards), then times, per step, the
shard's decode, names file, ingest and judge (thread CPU time, so a shared machine's
other load counts less), and prints the first step next to the mean of the later ones
of the same run.

    .venv/bin/python bench/shard_first_step.py [--ranks 4096] [--tensors 128] [--steps 4]

The last line is JSON.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from rankscope.coordinator.logic.shards.shard import ShardCore
from rankscope.coordinator.server.ingest_load import simulated_batch
from rankscope.coordinator.server.names_file import NamesFile
from rankscope.wire import protocol
from rankscope.wire.shards import ShardMap
from rankscope.wire.step_pack import StepPack, pack_message

PER_AGENT, SHARD, CHUNK = 8, 1, 32


def _frames(ranks: int, tensors: int, steps: int) -> list[list[bytes]]:
    job, rng, smap = "bench", np.random.default_rng(0), ShardMap(2)
    seqs, agent_seq = [protocol.SeqCounter() for _ in range(ranks)], protocol.SeqCounter()
    out = []
    for s in range(steps):
        frames = []
        for a in range(0, ranks, PER_AGENT):
            parts = [(f"rank:{r}", seqs[r](), smap.split(simulated_batch(job, r, s, tensors, rng))[SHARD])
                     for r in range(a, min(a + PER_AGENT, ranks))]
            frames.append(protocol.encode(pack_message(job, f"agent:{a}", agent_seq(), parts)))
        out.append(frames)
    return out


def run(ranks: int, tensors: int, steps: int) -> dict:
    frames = _frames(ranks, tensors, steps)
    core = ShardCore({}, shard=SHARD)
    for r in range(ranks):
        core.on_register("bench", r, {"world_size": ranks})
    dec, names = protocol.Decoder(), NamesFile(Path(tempfile.mkdtemp(prefix="rankscope-bench-")) / "names.jsonl")
    rows = []
    for step in frames:
        t0 = time.thread_time()
        packs = [StepPack(dec.decode(f)) for f in step]
        t1 = time.thread_time()
        for i in range(0, len(packs), CHUNK):
            names.write(packs[i:i + CHUNK])
        t2 = time.thread_time()
        for i in range(0, len(packs), CHUNK):
            core.on_steps(packs[i:i + CHUNK])
        t3 = time.thread_time()
        core.judge(force=True)
        t4 = time.thread_time()
        rows.append({"decode": t1 - t0, "names_file": t2 - t1, "ingest": t3 - t2, "judge": t4 - t3})
    names.close()
    first, later = rows[0], rows[1:]
    ms = {k: round(v * 1000.0, 1) for k, v in first.items()}
    steady = {k: round(float(np.mean([r[k] for r in later])) * 1000.0, 1) for k in first}
    total1, total_n = sum(first.values()), float(np.mean([sum(r.values()) for r in later]))
    return {"ranks": ranks, "tensors": tensors, "first_step_ms": ms, "later_step_ms": steady,
            "first_step_total_ms": round(total1 * 1000.0, 1), "later_step_total_ms": round(total_n * 1000.0, 1),
            "first_vs_later": round(total1 / total_n, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4096)
    ap.add_argument("--tensors", type=int, default=128)
    ap.add_argument("--steps", type=int, default=4)
    a = ap.parse_args()
    if a.steps < 2 or a.ranks < 1 or a.tensors < 3:
        ap.error(f"need --steps >= 2, --ranks >= 1, --tensors >= 3 (got {a.steps}, {a.ranks}, {a.tensors})")
    out = run(a.ranks, a.tensors, a.steps)
    print(f"first step {out['first_step_total_ms']} ms {out['first_step_ms']}; later steps "
          f"{out['later_step_total_ms']} ms {out['later_step_ms']}; first/later x{out['first_vs_later']}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
