"""The ingest benchmark's load generator: simulated ranks grouped into node agents, each
group a process sending real wire frames over real ZeroMQ sockets, in the two timed
phases :mod:`~rankscope.coordinator.server.ingest_bench` describes."""
from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from rankscope.wire import protocol
from rankscope.wire.records import Kind, StepBatch
from rankscope.wire.step_pack import pack_message

#: Kinds of the simulated tensors, in execution order after the loss.
_CYCLE = (Kind.FORWARD, Kind.PARAM, Kind.GRAD_LOCAL, Kind.GRAD_REDUCED, Kind.OPT_STATE)


def simulated_batch(job: str, rank: int, step: int, tensors: int, rng: np.random.Generator,
                    fault: bool = False) -> StepBatch:
    """One rank's step: replicated kinds identical on every rank (same crc/stats),
    local kinds with a few percent per-rank noise, like a healthy DP job."""
    n = tensors
    kinds = np.array([Kind.LOSS] + [_CYCLE[i % len(_CYCLE)] for i in range(n - 1)], np.uint8)[:n]
    base = 1.0 + np.arange(n, dtype=np.float64) / n  # per-tensor magnitude, same on all ranks
    scale = base * (1.0 + 0.001 * step)
    local = np.isin(kinds, [Kind.FORWARD, Kind.GRAD_LOCAL, Kind.LOSS])
    noise = np.where(local, 1.0 + 0.02 * rng.standard_normal(n), 1.0)
    norm = scale * noise
    stats = np.stack([norm / 8, -norm / 8, norm / 100, norm], axis=1)
    crc = np.where(local, -1, (np.arange(n) * 2654435761 + step) % (1 << 31)).astype(np.int64)
    nan = np.zeros(n, np.int64)
    if fault:
        j = int(np.flatnonzero(kinds == Kind.GRAD_LOCAL)[0])
        nan[j] = 7
        stats[j] = np.nan
    return StepBatch(job=job, rank=rank, step=step, name_ids=np.arange(n, dtype=np.uint32), kinds=kinds,
                     exec_index=np.arange(n, dtype=np.uint32), stats=stats, nan_count=nan,
                     inf_count=np.zeros(n, np.int64), numel=np.full(n, 4096, np.int64), crc32=crc,
                     new_names={i: f"Cell.layer{i}.{Kind(int(k)).name.lower()}.0" for i, k in enumerate(kinds)}
                     if step == 0 else {}, wall_time=0.0)


#: Sender processes meet at a barrier every this many steps, like a real DP job whose
#: allreduce keeps ranks in step (free-running load generators drift apart by hundreds).
SYNC_EVERY = 4
#: Phase 2: clean steps sent one every PACE_S, each timed from last frame to judged.
PACED_STEPS = 10
PACE_S = 0.5
#: Phase 1 stops waiting for records that stopped coming (lost frames) after this long.
STALL_S = 20.0
#: Ranks per simulated node agent (an 8-accelerator server).
RANKS_PER_NODE = 8


def _learn_shards(sock: Any, n: int, timeout_s: float) -> dict | None:
    """The shard map from the registration replies (None: one coordinator, no map)."""
    decoder = protocol.Decoder()
    detail = None
    deadline = time.monotonic() + timeout_s
    got = 0
    while got < n and time.monotonic() < deadline:
        if not sock.poll(100):
            continue
        msg = decoder.decode(sock.recv())
        if msg is not None and msg.type == protocol.STATUS and msg.body["what"] == "assigned":
            got += 1
            detail = msg.body["detail"].get("shards")
    if got < n:
        raise TimeoutError(f"simulated node: {got} of {n} registrations answered")
    return detail


def sender(node: int, ranks: list[int], args: dict, endpoint: str, ready: Any, go1: Any, go2: Any,
            results: Any, sync: Any) -> None:
    import zmq

    from rankscope.wire.shards import ShardMap
    from rankscope.wire.transport import connect_dealer

    job, tensors, steps = args["job"], args["tensors"], args["steps"]
    rng = np.random.default_rng(node)
    seqs = {r: protocol.SeqCounter() for r in ranks}
    ident = f"agent:simnode{node}:{os.getpid()}".encode()
    ctx = zmq.Context()
    # Phase 1 is a burst: let it queue (no send limit), the clock is on the receiver. No
    # ZMTP pings: a coordinator many steps behind stops reading (its queue is full) and
    # would be taken for dead, and these senders have no spool to replay what that loses.
    sock = connect_dealer(ctx, endpoint, ident, sndhwm=0, heartbeat=False)
    for r in ranks:
        sock.send(protocol.encode(protocol.Message(protocol.REGISTER, job, f"rank:{r}", seqs[r](), {
            "host": f"simnode{node}", "pid": 100000 + r, "claimed_rank": r, "assigned_rank": r,
            "world_size": args["ranks"]})))
    shards = _learn_shards(sock, len(ranks), 120.0)
    smap = ShardMap.from_wire(shards) if shards else ShardMap(1)
    socks = [sock]
    if shards:
        socks = [connect_dealer(ctx, ep, ident, sndhwm=0, heartbeat=False) for ep in shards["endpoints"]]

    per_agent = args["ranks_per_node"]
    agents = [ranks[i:i + per_agent] for i in range(0, len(ranks), per_agent)]
    pack_seq = protocol.SeqCounter()

    def frames(s: int, fault: bool = False) -> list[tuple[Any, bytes]]:
        # What a node agent does with its ranks' step: to one coordinator, each rank's frame
        # as it is; to K shards, one frame per shard with its ranks' records of that shard.
        out = []
        for a, group in enumerate(agents):
            parts: list[list] = [[] for _ in socks]
            for r in group:
                b = simulated_batch(job, r, s, tensors, rng, fault=fault and r == args["fault_rank"])
                seq = seqs[r]()
                if not shards:
                    out.append((sock, protocol.encode(protocol.step_message(b, f"rank:{r}", seq))))
                    continue
                for i, part in enumerate(smap.split(b)):
                    parts[i].append((f"rank:{r}", seq, part))
            if shards:
                src = f"agent:simnode{node}-{a}"
                out += [(sk, protocol.encode(pack_message(job, src, pack_seq(), p))) for sk, p in zip(socks, parts)]
        return out

    n1, paced = steps - 1, args["paced"]
    phase1 = [frames(s) for s in range(n1)]
    phase_p = [frames(n1 + i) for i in range(paced)]
    phase2 = frames(n1 + paced, fault=True)
    ready.set()
    go1.wait()
    t0 = time.time()
    for s, step_frames in enumerate(phase1):
        for sk, f in step_frames:
            sk.send(f)
        if s % SYNC_EVERY == SYNC_EVERY - 1:
            sync.wait()
    t1 = time.time()
    go2.wait()
    paced_sent = []
    for i, step_frames in enumerate(phase_p):
        sync.wait()  # every node starts the step together, like ranks after an allreduce
        for sk, f in step_frames:
            sk.send(f)
        paced_sent.append((n1 + i, time.time()))
        time.sleep(args["pace_s"])
    sync.wait()
    for sk, f in phase2:
        sk.send(f)
    t2 = time.time()
    results.put({"node": node, "phase1_start": t0, "phase1_sent": t1, "phase2_sent": t2, "paced_sent": paced_sent})
    # Control from the coordinator (export) is never read: simulated ranks have no gate and
    # no bundle, so the incident is written at its export timeout.
    time.sleep(0.2)
    for sk in {id(s): s for s in [sock, *socks]}.values():
        # Frames still queued (a coordinator behind by many steps) must reach it: a shorter
        # linger dropped them, which the coordinator then counted as lost.
        sk.close(linger=int(args["timeout_s"] * 1000))
    ctx.term()
