"""A rank process for the node-agent tests: registers, streams steps, answers control.

No MindSpore: the agent and the wire do not care what produced the statistics, and the
tests stay fast. Prints one JSON line per event on stdout (the tests read them):
``{"event": "registered", "rank": ...}``, ``{"event": "done", "sent": ..., "dropped": ...}``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rankscope.client.agent_client import AgentClient, RankClaim  # noqa: E402
from rankscope.dump.writer import DumpWriter  # noqa: E402
from rankscope.probe.gate import RankscopeTerminated, StepGate  # noqa: E402
from rankscope.wire.records import Kind, NameTable, StepBatchBuilder, StepOutput  # noqa: E402


def say(**doc) -> None:
    print(json.dumps(doc), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--job", default="j")
    ap.add_argument("--claim", type=int, default=None)
    ap.add_argument("--dp-index", type=int, default=None)
    ap.add_argument("--world-size", type=int, default=None)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--tensors", type=int, default=4)
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--dump", default=None)
    ap.add_argument("--then", choices=("exit", "hang"), default="exit")
    ap.add_argument("--exit-on-terminate", action="store_true")
    ap.add_argument("--grads", action="store_true", help="a local gradient per layer too (another kind)")
    ap.add_argument("--nan-at", type=int, default=None, help="layer 0's gradient is NaN at this step")
    ap.add_argument("--burst", action="store_true",
                    help="build every step first, then emit them back to back (no dump)")
    a = ap.parse_args()

    gate = StepGate(exit_on_terminate=a.exit_on_terminate)
    client = AgentClient(a.endpoint, a.job, gate, queue_max=4096)
    claim = RankClaim.here(a.claim, world_size=a.world_size, dp_index=a.dp_index)
    rank = client.register(claim, timeout=10.0)
    say(event="registered", rank=rank, pid=os.getpid(), remapped=client.remapped)
    label = f"rank{rank}" if rank is not None else f"proc{os.getpid()}"
    sinks = [client]
    if a.dump:
        sinks.append(DumpWriter(a.dump, task="statistics", level="L0"))
    names = NameTable()
    builder = StepBatchBuilder(names)
    if a.burst:
        outs = []
        for step in range(a.steps):
            for i in range(a.tensors):
                builder.add(f"Cell.layer{i}.Dense.forward.0", Kind.FORWARD, (1.0, -1.0, 0.5, 2.0), numel=16)
            outs.append(StepOutput(builder.build(a.job, rank if rank is not None else -1, step), label))
        for out in outs:
            client.emit(out)
        say(event="done", sent_steps=a.steps, dropped=client.dropped)
        client.close(timeout=30)
        return 0
    try:
        for step in range(a.steps):
            gate.at_step_boundary(step)
            for i in range(a.tensors):
                v = float(step * 100 + i)
                builder.add(f"Cell.layer{i}.Dense.forward.0", Kind.FORWARD, (v, -v, v / 2, abs(v) + 1.0),
                            numel=16)
                if a.grads:
                    nan = (i == 0 and step == a.nan_at)
                    g = float("nan") if nan else 0.01 * (i + 1)
                    builder.add(f"Cell.layer{i}.Dense.weight.grad", Kind.GRAD_LOCAL, (g, -g, 0.0, g), nan=16 * nan,
                                numel=16)
            batch = builder.build(a.job, rank if rank is not None else -1, step, wall_time=time.time())
            entries = {f"Cell.layer{i}.Dense.forward.0": {"output": [{"type": "mindspore.Tensor", "Max": 1.0}]}
                       for i in range(a.tensors)}
            out = StepOutput(batch, label, entries=entries)
            for sink in sinks:
                sink.emit(out)
            if a.sleep:
                time.sleep(a.sleep)
        gate.at_step_boundary(a.steps)
    except RankscopeTerminated as exc:
        say(event="terminated", message=str(exc))
        client.close()
        return 3
    say(event="done", sent_steps=a.steps, dropped=client.dropped)
    if a.then == "hang":
        while True:
            time.sleep(1)
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
