"""Ingest shards' logic alone: records/s per shard and memory per shard (run through
``bench/coordinator_logic.py --shards 1,2,4``; see its docstring).

Each shard gets what node agents send it: per step, its part of every rank's records,
packed ``--ranks-per-node`` ranks to a frame (``1``: one frame per rank, as before
packing) and handed to the shard's core a step at a time, as its front end does: a
decoded frame is one StepPack, which the core places whole in the usual case."""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
import tracemalloc

from rankscope.coordinator.logic.shards.merge import VerdictMerge
from rankscope.coordinator.logic.shards.shard import ShardCore
from rankscope.coordinator.logic.synthetic import SyntheticTraining
from rankscope.wire import protocol
from rankscope.wire.shards import ShardMap
from rankscope.wire.step_pack import StepPack, pack_message, record_count

#: Bytes one (rank, column) cell of one pending step costs in a StepSlot: present (1),
#: exec/nan/inf/numel/crc (5 x 8), stats (4 x 8).
SLOT_BYTES = 1 + 5 * 8 + 4 * 8


def _stream(ranks: int, tensors: int, steps: int, distinct: int = 4):
    sim = SyntheticTraining(ranks=ranks, tensors=tensors, seed=0, total_steps=max(steps, 100))
    first = sim.batches(0)
    arrays = [sim.arrays(s) for s in range(distinct)]
    return sim, [[dataclasses.replace(b, step=s) for b in (first if s == 0 else sim.batches(s, arrays[s % distinct]))]
                 for s in range(steps)]


def _shard(sim, parts: list[list], shard: int, ranks: int, mem: bool) -> dict:
    clock = [0.0]
    core = ShardCore({}, clock=lambda: clock[0], shard=shard)
    for r in range(ranks):
        core.on_register(sim.job, r, {"world_size": ranks})
    if mem:
        tracemalloc.start()
        tracemalloc.reset_peak()
    wall = cpu = 0.0
    findings = []
    for batches in parts:
        c0, t0 = time.process_time(), time.perf_counter()
        core.on_steps(batches)
        findings.append(core.judge())
        wall, cpu = wall + time.perf_counter() - t0, cpu + time.process_time() - c0
        clock[0] += 0.01
    out = {"records": record_count([b for bs in parts for b in bs]), "wall": wall, "cpu": cpu, "findings": findings,
           "columns": len(core.aligner.keys[sim.job])}
    if mem:
        out["mem_now"], out["mem_peak"] = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return out


def _window(sim, parts: list[list], ranks: int, window: int) -> float:
    """Bytes per (rank, column, pending step) when one rank lags and ``window`` steps wait."""
    clock = [0.0]
    core = ShardCore({"max_pending_steps": window, "deadline_s": 1e9, "detectors": {"progress": {"lag_steps": None}}},
                     clock=lambda: clock[0])
    for r in range(ranks):
        core.on_register(sim.job, r, {"world_size": ranks})
    for b in parts[0]:  # names and layouts learned before measuring
        core.on_step(b)
    core.judge(force=True)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for s, batches in enumerate(parts[1:window + 1], 1):
        for b in batches[1:]:  # rank 0 lags: nothing can be judged
            core.on_step(b)
        core.judge()
    held = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return held / (ranks * len(core.aligner.keys[sim.job]) * core.aligner.pending_steps())


def _packed(batches: list, per_node: int) -> list:
    """The batches as a shard's front end hands them to its core: one decoded StepPack per
    node agent's STEPS frame (packing, encoding and decoding are done here, before any
    clock starts: the agents' work and the front end's, timed by ``bench ingest``)."""
    if per_node <= 1:
        return batches
    out = []
    dec = protocol.Decoder(job=batches[0].job) if batches else None
    for i in range(0, len(batches), per_node):
        chunk = [(f"rank:{b.rank}", 0, b) for b in batches[i:i + per_node]]
        out.append(StepPack(dec.decode(protocol.encode(pack_message(chunk[0][2].job, "node", 0, chunk)))))
    return out


def run(ranks: int, tensors: int, steps: int, shards: list[int], mem: bool, per_node: int = 8) -> list[dict]:
    sim, stream = _stream(ranks, tensors, steps)
    results = []
    for k in shards:
        smap = ShardMap(k)
        t0 = time.perf_counter()
        split = [smap.split(b) for bs in stream for b in bs]
        split_s = time.perf_counter() - t0
        per = [[_packed([split[s * ranks + r][i] for r in range(ranks)], per_node) for s in range(steps)]
               for i in range(k)]
        merge = VerdictMerge(k)
        rows = []
        for i in range(k):
            res = _shard(sim, per[i], i, ranks, mem=False)
            if mem:
                m = _shard(sim, per[i], i, ranks, mem=True)
                res["mem_peak"], res["mem_now"] = m["mem_peak"], m["mem_now"]
            for f in res.pop("findings"):
                merge.add(f)
            rows.append(res)
        verdicts = merge.release(force=True)
        total = sum(r["records"] for r in rows)
        results.append({
            "shards": k, "ranks": ranks, "tensors": tensors, "steps": steps, "ranks_per_node": per_node,
            "per_shard_records_per_s": [round(r["records"] / r["wall"]) for r in rows],
            "per_shard_records_per_cpu_s": [round(r["records"] / r["cpu"]) for r in rows],
            "per_shard_columns": [r["columns"] for r in rows],
            # Shards run side by side on separate cores: the slowest one sets the pace.
            "total_records_per_s_if_parallel": round(total / max(r["wall"] for r in rows)),
            "split_records_per_s": round(total / split_s),
            "peak_mem_mb_per_shard": [round(r["mem_peak"] / 2**20, 1) for r in rows] if mem else None,
            "held_mem_mb_per_shard": [round(r["mem_now"] / 2**20, 1) for r in rows] if mem else None,
            "verdicts_on_clean_data": len(verdicts),
        })
    base = min(results[0]["per_shard_records_per_cpu_s"])
    for r in results:
        r["per_shard_cpu_ratio_vs_1_shard"] = [round(x / base, 2) for x in r["per_shard_records_per_cpu_s"]] \
            if results[0]["shards"] == 1 else None
    if mem:
        results[0]["bytes_per_rank_tensor_pending_step"] = round(_window(sim, [
            [b for b in bs] for bs in stream], ranks, min(16, steps - 1)), 1)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=256)
    ap.add_argument("--tensors", type=int, default=128)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--shards", default="1,2,4", help="shard counts, comma separated (the first is the baseline)")
    ap.add_argument("--no-mem", action="store_true", help="skip the tracemalloc pass")
    ap.add_argument("--ranks-per-node", type=int, default=8,
                    help="ranks whose parts a node agent packs in one frame (1: a frame per rank)")
    args = ap.parse_args()
    res = run(args.ranks, args.tensors, args.steps, [int(x) for x in args.shards.split(",")], not args.no_mem,
              args.ranks_per_node)
    for r in res:
        print(f"{r['shards']} shard(s), {r['ranks']} ranks x {r['tensors']} tensors: per shard "
              f"{[f'{x:,}' for x in r['per_shard_records_per_s']]} rec/s wall, "
              f"{[f'{x:,}' for x in r['per_shard_records_per_cpu_s']]} rec/CPU-s "
              f"(x{r['per_shard_cpu_ratio_vs_1_shard']} of 1 shard), columns {r['per_shard_columns']}, "
              f"peak MB {r['peak_mem_mb_per_shard']}, split {r['split_records_per_s']:,} rec/s")
    print(f"{SLOT_BYTES} B per rank x tensor per pending step in a slot (stated); measured "
          f"{res[0].get('bytes_per_rank_tensor_pending_step')} B")
    print(json.dumps(res))
