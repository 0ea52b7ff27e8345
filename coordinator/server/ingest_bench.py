"""The ingest benchmark behind ``rankscope bench ingest``: records/s into a real coordinator
actor, and detection latency.

Simulated ranks run in separate processes (``--nodes`` of them), each playing node agents
of ``--ranks-per-node`` ranks (8, an 8-accelerator server) as in a real cluster, and send
real wire frames over real ZeroMQ sockets into a real coordinator Ray actor.

Two phases, so each figure means one thing:

1. throughput: ``steps - 1`` clean steps sent as fast as the sockets take them;
   ``records_per_s`` = records / (coordinator's last ingest - first send).
   Frames are encoded before the clock starts: the sender's cost is not the
   coordinator's.
2. paced: ``PACED_STEPS`` clean steps, one every ``pace_s`` (``--pace-s``, the step rate
   the coordinator must keep up with); per step, the time from
   its last frame sent to the coordinator having judged it (when a fault in that step
   would be found): ``judge_latency_ms`` median and p99.
3. detection: one more step in which ``--fault-rank`` has a NaN in a local gradient;
   ``detect_latency_ms`` = incident recorded (wall clock in the actor) - last frame of
   that step sent.

With ``shards`` > 1 the coordinator is K ingest shard actors and a verdict actor: each
simulated node agent learns the shard map from its registration replies and sends, per step
and shard, one packed frame (wire.step_pack) with its ranks' records of that shard, as a
node agent does. Per shard: records/s (its records over its own first-to-last ingest),
records per CPU-second of its process (on a machine with fewer cores than shards plus
senders, wall-clock rates measure the sharing; this one the shard's own cost), frames
taken in, and peak memory (RSS of its process).

``records_lost`` = records sent - records the coordinator took in, counted once they are
all in or none arrived for ``STALL_S`` (0 unless frames were dropped on the way, or a
shard stalled that long). The last line printed is JSON.
"""
from __future__ import annotations

import multiprocessing as mp
import tempfile
import time
import uuid
from typing import Any

import numpy as np

from rankscope.coordinator.server.ingest_load import (
    PACE_S,
    PACED_STEPS,
    RANKS_PER_NODE,
    STALL_S,
    sender,
    simulated_batch,
)
from rankscope.wire import protocol

def inprocess_baseline(ranks: int, tensors: int, steps: int) -> float:
    """Records/s of decode + core alone, one thread, no sockets, no Ray, on the same kind
    of frames: the same-run baseline the actor's figure is compared with."""
    from rankscope.coordinator.logic.core import CoordinatorCore

    rng = np.random.default_rng(0)
    steps = max(2, min(steps, 4096 // ranks + 1))  # bounded work; step 0 (names) is warm-up
    frames = [protocol.encode(protocol.step_message(simulated_batch("base", r, s, tensors, rng), f"rank:{r}", s))
              for s in range(steps) for r in range(ranks)]
    core = CoordinatorCore({})
    for r in range(ranks):
        core.on_register("base", r, {"world_size": ranks})
    decoder = protocol.Decoder(job="base")

    def feed(chunk: list[bytes]) -> None:
        core.on_steps([protocol.step_from_message(decoder.decode(f)) for f in chunk])
        core.tick()

    feed(frames[:ranks])
    timed = frames[ranks:]
    t0 = time.perf_counter()
    for i in range(0, len(timed), 1024):
        feed(timed[i:i + 1024])
    return len(timed) * tensors / (time.perf_counter() - t0)


def _ingested(st: dict) -> int:
    return st["records"] if "shards" in st else st["metrics"]["records_ingested"]


def _peak_rss(pid: int) -> int | None:
    """Peak resident memory of a process on this machine (VmHWM), bytes."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return None


def _percentile(xs: list[float], q: float) -> float | None:
    return round(float(np.percentile(xs, q)), 1) if xs else None


def run_ingest(ranks: int, tensors: int, steps: int, *, nodes: int | None = None, fault_rank: int | None = None,
               export_dir: str | None = None, timeout_s: float = 300.0, shards: int = 1,
               paced: int = PACED_STEPS, pace_s: float = PACE_S, ranks_per_node: int = RANKS_PER_NODE,
               log=print, attach: Any = None) -> dict:
    """``attach(coordinator)``: called once the coordinator is up, before any frame is sent
    (a console, say); what it returns, if callable, is called when the run ends."""
    from rankscope.coordinator.server.client import Coordinator, connect_ray, disconnect_ray

    if steps < 2 or ranks < 1 or tensors < 3:
        raise ValueError(f"need steps >= 2, ranks >= 1, tensors >= 3 (got {steps}, {ranks}, {tensors})")
    # Two load generators: on a 2-core machine more sender processes mostly measure their
    # own context switches, and in a real cluster the senders are other hosts anyway.
    nodes = nodes or max(1, min(2, ranks))
    fault_rank = ranks // 3 if fault_rank is None else fault_rank
    job = f"bench-{uuid.uuid4().hex[:8]}"
    export_dir = export_dir or tempfile.mkdtemp(prefix="rankscope-bench-")
    started_ray = connect_ray(None, "rankscope-bench", num_cpus=2)
    # The lag check is off here: phase 1 blasts frames as fast as sockets take them, so
    # one sender's frames can sit in buffers while the other's arrive (arrival skew of a
    # load generator, not a rank lagging). Deadlines and the other detectors stay on.
    cluster = {"on_divergence": "continue", "export_timeout_s": 1.0, "deadline_s": 60.0,
               "detectors": {"progress": {"lag_steps": None}}, "shards": shards}
    coord = Coordinator.start(export_dir, cluster, name=job, namespace="rankscope-bench", job=job)
    detach = None
    try:
        endpoint = coord.endpoint()
        detach = attach(coord) if attach is not None else None
        spawn = mp.get_context("spawn")
        ready = [spawn.Event() for _ in range(nodes)]
        go1, go2, results, sync = spawn.Event(), spawn.Event(), spawn.Queue(), spawn.Barrier(nodes)
        share = [list(range(ranks))[i::nodes] for i in range(nodes)]
        args = {"job": job, "tensors": tensors, "steps": steps, "ranks": ranks, "fault_rank": fault_rank,
                "paced": paced, "pace_s": pace_s, "timeout_s": timeout_s, "ranks_per_node": ranks_per_node}
        procs = [spawn.Process(target=sender, args=(i, share[i], args, endpoint, ready[i], go1, go2, results, sync),
                               daemon=True) for i in range(nodes)]
        for p in procs:
            p.start()
        for ev in ready:
            if not ev.wait(timeout_s):
                raise TimeoutError("simulated nodes did not get ready (encoding frames)")
        records1 = ranks * tensors * (steps - 1)
        log(f"bench ingest: {ranks} ranks x {tensors} tensors x {steps} steps from {nodes} processes "
            f"(node agents of {ranks_per_node} ranks) -> {endpoint}")
        go1.set()
        # The figure uses the actor's own last-ingest time, not this poll. Frames lost on
        # the way would leave it short for ever: it gives up once nothing arrived for STALL_S.
        st = _wait(coord, lambda s: _ingested(s) >= records1, timeout_s, every=0.25, stall=_ingested)
        judged_wait = _wait(coord, lambda s: (s.get("last_judged_step") or -1) >= steps - 2, 30.0,
                            must=False)
        log(f"bench ingest: phase 1 in; {paced} paced steps, one every {pace_s} s")
        go2.set()
        # Each poll is a status call on every shard's ingest thread: gently, as the
        # latencies come from the actors' own clocks, not from when this poll saw them.
        _wait(coord, lambda s: bool(s["incidents"]), timeout_s, every=0.5)
        sent = [results.get(timeout=timeout_s) for _ in procs]
        for p in procs:
            p.join(10)
        phase1_first = min(r["phase1_start"] for r in sent)
        phase2_sent = max(r["phase2_sent"] for r in sent)
        incs = coord.incidents()
        inc = min(incs, key=lambda i: i["detected_at_epoch"])
        last_wall = max(x["last_step_wall"] for x in st["shards"]) if "shards" in st else st["last_step_wall"]
        elapsed = last_wall - phase1_first
        # Records still queued at a shard that is behind are not lost: wait until they are
        # in (or stopped coming) before counting.
        total = ranks * tensors * (steps + paced)
        final = _wait(coord, lambda s: _ingested(s) >= total, timeout_s, every=0.25, stall=_ingested)
        fault_step = steps - 1 + paced
        walls = final.get("judged_walls") or []
        lat = []
        for s, _ in sent[0]["paced_sent"]:
            t_sent = max(dict(r["paced_sent"])[s] for r in sent)
            judged = next((w for j, w in walls if j >= s), None)
            if judged is not None:
                lat.append((judged - t_sent) * 1000.0)
        if "shards" in final:
            # Throughput from phase 1 alone (its status), memory at the end.
            per = [{"shard": x["shard"], "node": x.get("node"), "records": y["records"],
                    # Phase 1 from the first frame sent to this shard's last ingest (its own
                    # first-to-last span is a few bursts, too short to mean anything).
                    "records_per_s": round(x["records"] / max(x["last_step_wall"] - phase1_first, 1e-9)),
                    # Steady state: the paced steps (names and layouts were learned in phase 1).
                    "records_per_cpu_s": round((y["records"] - x["records"]) / max(y["cpu_s"] - x["cpu_s"], 1e-9)),
                    "frames_in": y["frames_in"], "rejected": y["rejected"], "duplicates": y["duplicates"],
                    "peak_rss_mb": round(y["peak_rss_bytes"] / 2**20, 1)}
                   for x, y in zip(st["shards"], final["shards"])]
        else:
            peak = _peak_rss(final["pid"])
            per = [{"shard": 0, "records": _ingested(final), "records_per_s": round(records1 / elapsed, 1),
                    "peak_rss_mb": None if peak is None else round(peak / 2**20, 1)}]
        out = {
            "ranks": ranks, "tensors": tensors, "steps": steps, "nodes": nodes, "shards": shards,
            "records": ranks * tensors * (steps + paced), "pace_s": pace_s,
            # Sent against taken in: frames dropped anywhere on the way show up here.
            "records_ingested": _ingested(final), "records_lost": ranks * tensors * (steps + paced) - _ingested(final),
            "records_per_s": round(records1 / elapsed, 1),
            "rank_steps_per_s": round(ranks * (steps - 1) / elapsed, 1),  # each rank's step, packed or not
            "per_shard": per,
            "judge_latency_ms_median": _percentile(lat, 50), "judge_latency_ms_p99": _percentile(lat, 99),
            "judge_latency_ms": [round(x, 1) for x in lat],
            # Step 0 from its first frame sent to judged: names and column layouts are learned
            # in it (phase 1 sends step 1 right behind it, so this is an upper bound).
            "first_step_judged_ms": next((round((w - phase1_first) * 1000.0, 1) for j, w in walls if j >= 0), None),
            "detect_latency_ms": round((inc["detected_at_epoch"] - phase2_sent) * 1000.0, 1),
            "detector": inc["detector"], "flagged_rank": inc["first_diverging_rank"], "flagged_step": inc["step"],
            "correct": inc["first_diverging_rank"] == fault_rank and inc["step"] == fault_step,
            "fault_rank": fault_rank, "rejected": final.get("rejected"), "duplicates": final.get("duplicates"),
            "judged_before_fault": judged_wait is not None, "export_dir": export_dir,
        }
        # Let the incident finish (export times out: simulated ranks send no bundle) so
        # incident.json and report.html land in export_dir.
        coord.drain(10.0)
        base = inprocess_baseline(ranks, tensors, steps)
        out["inprocess_records_per_s"] = round(base, 1)
        out["vs_inprocess"] = round(out["records_per_s"] / base, 3)
        return out
    finally:
        if callable(detach):
            detach()
        coord.stop()
        if started_ray:
            disconnect_ray()


def _wait(coord: Any, cond, timeout_s: float, must: bool = True, every: float = 0.05,
          stall: Any = None) -> dict | None:
    """Poll the brief status until ``cond``; with ``stall`` (a progress measure of the
    status), also return once it has not moved for STALL_S."""
    deadline = time.monotonic() + timeout_s
    last, moved = None, time.monotonic()
    while True:
        st = coord.status(brief=True)
        if cond(st):
            return st
        if stall is not None:
            now, seen = time.monotonic(), stall(st)
            if seen != last:
                last, moved = seen, now
            elif now - moved > STALL_S:
                return st
        if time.monotonic() > deadline:
            if must:
                raise TimeoutError(f"bench: coordinator did not get there within {timeout_s}s: "
                                   f"{ {k: st.get(k) for k in ('metrics', 'last_judged_step', 'rejected')} }")
            return None
        time.sleep(every)  # status() runs on the ingest thread: poll gently


def run_scale(sizes: list[int], tensors: int, min_records: int, shards: int = 1, log=print) -> list[dict]:
    """One run per rank count in one Ray; steps chosen so that every run measures at
    least ``min_records`` records (a short run is all start-up noise)."""
    from rankscope.coordinator.server.client import connect_ray, disconnect_ray
    started = connect_ray(None, "rankscope-bench", num_cpus=2)
    try:
        rows = []
        for r in sizes:
            steps = max(20, -(-min_records // (r * tensors)) + 1)
            rows.append(run_ingest(r, tensors, steps, shards=shards, log=log))
            o = rows[-1]
            log(f"  {r:>5} ranks x {tensors} tensors x {steps:>3} steps: {o['records_per_s'] / 1e3:8.0f}k records/s "
                f"({o['vs_inprocess']:.2f}x in-process decode+core), detection {o['detect_latency_ms']:7.1f} ms, "
                f"{'right rank' if o['correct'] else 'WRONG'}")
        return rows
    finally:
        if started:
            disconnect_ray()


