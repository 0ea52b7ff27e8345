"""Node agents routing steps to the ingest shards vs the verdict actor relaying them: CPU per
record of the node agent and of the verdict actor, and records/s end to end, in one run.

    .venv/bin/python bench/agent_routing.py [--ranks 4 --tensors 256 --steps 300 --repeats 2 --shards 2]

A private Ray with one real coordinator of K ingest shards (the verdict actor + K shard
actors). Each run starts a real node agent process (``NodeAgent``, what ``rankscope agent``
runs) and R rank processes (``AgentClient``, real sockets) that stream S prebuilt steps of T
records of mixed kinds as fast as the agent takes them (waiting, never dropping). Runs
alternate, so machine noise hits both alike:

- routed: the agent splits each step over the shards (``route_steps=True``, the default);
- relayed: every step goes to the verdict actor, which splits it and hands it on over Ray
  (``route_steps=False``, what an agent that does not route costs the coordinator).

Each run is its own job on the same coordinator. From "go" to the shards' last ingest of the
run: the agent's CPU (user+sys, /proc) per record, the verdict actor's and the shards' CPU per
record, and records / elapsed. Ratios are routed/relayed of the medians. The verdict actor's
CPU includes this driver's status polls (every 0.25 s, alike in both modes).

The last line printed is one JSON object with every figure.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process on this machine."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


# --- roles run as subprocesses -------------------------------------------------------
def role_agent(args: argparse.Namespace) -> int:
    import threading

    from rankscope.node.daemon import NodeAgent
    from rankscope.node.settings import AgentSettings

    run = Path(args.dir)
    settings = AgentSettings(listen=f"ipc://{run}/agent.sock", coordinator=args.endpoint, job=args.job,
                             spool_dir=run / "spool", bundle_dir=run / "bundles", assign_wait_s=5.0,
                             route_steps=args.route == "routed")
    agent = NodeAgent(settings)
    loop = threading.Thread(target=agent.run)
    loop.start()
    # Ready once the coordinator has said something: the ranks' registrations are then held
    # for its answer, which names the shards, so a routing agent routes from the first step.
    deadline = time.monotonic() + 60
    while not agent.core.held.heard and time.monotonic() < deadline:
        time.sleep(0.02)
    print(agent.endpoint, flush=True)
    sys.stdin.readline()
    agent.stop()
    loop.join()
    return 0


def role_rank(args: argparse.Namespace) -> int:
    import numpy as np

    from rankscope.client.agent_client import AgentClient, RankClaim
    from rankscope.coordinator.server.ingest_load import simulated_batch
    from rankscope.probe.gate import StepGate
    from rankscope.wire.records import StepOutput

    client = AgentClient(args.endpoint, args.job, StepGate(), queue_max=args.queue_max)
    rank = client.register(RankClaim.here(args.rank, world_size=args.ranks), timeout=30.0)
    r = rank if rank is not None else args.rank
    # Built first: the figures are about the agent and the coordinator, not the probe.
    rng = np.random.default_rng(r)
    batches = [simulated_batch(args.job, r, s, args.tensors, rng) for s in range(args.steps)]
    print("ready", flush=True)
    sys.stdin.readline()  # every rank starts streaming at once
    for batch in batches:
        client.emit(StepOutput(batch, f"rank{r}"))
        while len(client.state.queue) >= args.queue_max:  # wait, never drop
            time.sleep(0.0005)
    client.close(timeout=120)
    print(json.dumps({"rank": r, "dropped": client.dropped}), flush=True)
    return 0


# --- driver ----------------------------------------------------------------------------
def _spawn(*argv: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *argv], stdout=subprocess.PIPE,
                            stdin=subprocess.PIPE, text=True, cwd=ROOT, env=env)


def _wait(fn, timeout_s: float, every: float = 0.25):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(every)
    raise TimeoutError(f"no result within {timeout_s}s")


def one_run(coord, args: argparse.Namespace, mode: str, n: int, tmp: Path) -> dict:
    job = f"route-{mode}-{n}"
    run = tmp / job
    run.mkdir()
    st = coord.status()
    records0, relayed0 = st["records"], st["metrics"]["records_ingested"]
    agent = _spawn("--role", "agent", "--route", mode, "--endpoint", coord.endpoint(), "--job", job, "--dir", str(run))
    endpoint = agent.stdout.readline().strip()
    common = ["--job", job, "--endpoint", endpoint, "--ranks", str(args.ranks), "--steps", str(args.steps),
              "--tensors", str(args.tensors), "--queue-max", str(args.queue_max)]
    ranks = [_spawn("--role", "rank", "--rank", str(r), *common) for r in range(args.ranks)]
    for p in ranks:
        assert p.stdout.readline().strip() == "ready", "a rank did not start"
    pids = {"agent": agent.pid, "verdict": st["pid"], **{f"shard{s['shard']}": s["pid"] for s in st["shards"]}}
    cpu0 = {k: cpu_s(p) for k, p in pids.items()}
    t0 = time.time()
    for p in ranks:
        p.stdin.write("go\n")
        p.stdin.flush()
    want = args.ranks * args.steps * args.tensors
    end = _wait(lambda: (s := coord.status())["records"] - records0 >= want and s, args.timeout)
    cpu1 = {k: cpu_s(p) for k, p in pids.items()}
    docs = [json.loads(p.stdout.readline() or "{}") for p in ranks]
    for p in ranks:
        p.wait(60)
    agent.stdin.write("stop\n")
    agent.stdin.flush()
    agent.wait(60)
    elapsed = max(s["last_step_wall"] for s in end["shards"]) - t0
    cpu = {k: cpu1[k] - cpu0[k] for k in pids}
    return {"mode": mode, "records": end["records"] - records0, "elapsed_s": elapsed,
            "records_per_s": want / elapsed, "dropped": sum(d.get("dropped", 0) for d in docs),
            "relayed_by_verdict": end["metrics"]["records_ingested"] - relayed0,
            "agent_us_per_record": cpu["agent"] / want * 1e6, "verdict_us_per_record": cpu["verdict"] / want * 1e6,
            "shards_us_per_record": sum(v for k, v in cpu.items() if k.startswith("shard")) / want * 1e6}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--role", choices=("driver", "agent", "rank"), default="driver")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--tensors", type=int, default=256)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--queue-max", type=int, default=256)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--route", choices=("routed", "relayed"))
    ap.add_argument("--endpoint")
    ap.add_argument("--job")
    ap.add_argument("--dir")
    ap.add_argument("--rank", type=int, default=0)
    args = ap.parse_args()
    if args.role == "agent":
        return role_agent(args)
    if args.role == "rank":
        return role_rank(args)

    from rankscope.coordinator.server.client import Coordinator, connect_ray, disconnect_ray

    started = connect_ray(None, "rankscope-bench-route", num_cpus=2)
    runs: dict[str, list[dict]] = {"routed": [], "relayed": []}
    with tempfile.TemporaryDirectory(prefix="rankscope-route-") as d:
        tmp = Path(d)
        # The lag check is off: ranks streaming flat out arrive skewed (a load generator's
        # artefact, not a lagging rank).
        cluster = {"on_divergence": "continue", "shards": args.shards, "deadline_s": 120.0,
                   "detectors": {"progress": {"lag_steps": None}}}
        coord = Coordinator.start(str(tmp / "coord"), cluster, name="bench-route", namespace="rankscope-bench-route")
        try:
            for n in range(args.repeats):
                for mode in (("routed", "relayed") if n % 2 == 0 else ("relayed", "routed")):
                    r = one_run(coord, args, mode, n, tmp)
                    runs[mode].append(r)
                    print(f"{mode:>8}: {r['records']} records in {r['elapsed_s']:.2f}s = {r['records_per_s']:,.0f}/s; "
                          f"agent {r['agent_us_per_record']:.2f} us/record, verdict actor "
                          f"{r['verdict_us_per_record']:.2f} us/record, shards {r['shards_us_per_record']:.2f} "
                          f"us/record; relayed by the verdict actor: {r['relayed_by_verdict']}; "
                          f"dropped {r['dropped']}", flush=True)
        finally:
            coord.stop()
            if started:
                disconnect_ray()
    med = {m: {k: statistics.median(r[k] for r in v) for k in ("records_per_s", "agent_us_per_record",
                                                                  "verdict_us_per_record", "shards_us_per_record")}
           for m, v in runs.items()}
    ratio = {k: med["routed"][k] / med["relayed"][k] for k in med["routed"]}
    print(f"routed/relayed: agent CPU per record x{ratio['agent_us_per_record']:.2f}, verdict actor CPU per record "
          f"x{ratio['verdict_us_per_record']:.2f}, shards x{ratio['shards_us_per_record']:.2f}, "
          f"records/s {med['relayed']['records_per_s']:,.0f} -> {med['routed']['records_per_s']:,.0f} "
          f"(x{ratio['records_per_s']:.2f})")
    print(json.dumps({"ranks": args.ranks, "tensors": args.tensors, "steps": args.steps, "shards": args.shards,
                      "median": med, "routed_vs_relayed": ratio, "runs": runs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
