"""What the watch costs as the model grows: plain against the default and the full tier.

A one-process PyNative CPU job as a new user runs it under ``rankscope launch`` with no
config: a 4-layer W x W MLP (ReLU, a W -> 10 head), Adam, batch 64, no rankscope call in
its loop (the probe attaches itself, as launch does, through RANKSCOPE_ATTACH). Each run is
its own process; plain, default and full alternate in every round so machine noise hits
them alike; the figure is the ratio of the medians of the script's own step times, after
32 steps left out in every mode (compiling; the default tier settling its plan).

    .venv/bin/python bench/watch_cost.py [--widths 256,1024,2048,4096] [--rounds 3] [--steps 40] [--deep]

Prints one line per width and mode and a final JSON line, with each tier's measured share
of a step, K (weights fingerprinted every K steps) and the bytes copied to the host a
step, as the rank itself reported them in its watch line. Beside the ratio of the pooled
medians: each round's own ratio (the spread shows what the machine's noise does to the
figure) and the ratio of the median CPU time a step (the process's, all its threads).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

JOB = r'''
import json, sys, time
import numpy as np
import mindspore as ms
from mindspore import nn
ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_device("CPU")
ms.set_seed(0)
W, STEPS = int(sys.argv[1]), int(sys.argv[2])
# Left out of the figures, in every mode alike: the first steps compile, and the default
# tier measures its Cell hooks on and off in alternating blocks over steps 1-25 before it
# settles.
WARM = 32

class MLP(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Dense(W, W), nn.Dense(W, W), nn.Dense(W, W)
        self.head, self.relu = nn.Dense(W, 10), nn.ReLU()
    def construct(self, x):
        x = self.relu(self.fc1(x)); x = self.relu(self.fc2(x)); x = self.relu(self.fc3(x))
        return self.head(x)

net = MLP()
loss_fn = nn.CrossEntropyLoss()
opt = nn.Adam(net.trainable_params(), 1e-4)
grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, opt.parameters)
rs = np.random.RandomState(0)
x = ms.Tensor(rs.randn(64, W).astype(np.float32))
y = ms.Tensor(rs.randint(0, 10, 64).astype(np.int32))
NAN_AT = int(sys.argv[3]) if len(sys.argv) > 3 else -1
bad = x.asnumpy().copy()
bad[0, 0] = np.nan
times, cpu = [], []
for i in range(STEPS + WARM):
    t0, c0 = time.perf_counter(), time.process_time()
    loss, grads = grad_fn(ms.Tensor(bad) if i == NAN_AT else x, y)
    opt(grads)
    loss.asnumpy()
    if i == NAN_AT:
        print(f"ANOMALOUS_STEP {time.perf_counter() - t0}", flush=True)
        break  # the weights are NaN from here on
    if i >= WARM:
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
print("STEP_TIMES " + json.dumps(times), flush=True)
print("STEP_CPU " + json.dumps(cpu), flush=True)
'''

COST = re.compile(r"watch cost: ([^\n]*)")


def run(mode: str, width: int, steps: int, work: Path, nan_at: int = -1) -> tuple[list[float], str, list[float]]:
    env = dict(os.environ)
    for k in [k for k in env if k.startswith("RANKSCOPE_")]:
        env.pop(k)
    env["GLOG_v"] = "3"
    if mode != "plain":
        cfg = work / f"{mode}.json"
        cfg.write_text(json.dumps({"task": "statistics", "level": "L0", "cluster": {"watch": mode}}))
        env.update({"RANKSCOPE_ATTACH": "1", "RANKSCOPE_CONFIG": str(cfg),
                    "RANKSCOPE_DUMP_PATH": str(work / f"dump-{mode}-{width}"),
                    "PYTHONPATH": os.pathsep.join([str(ROOT / "agent" / "_attach"), str(ROOT)])})
    proc = subprocess.run([sys.executable, str(work / "job.py"), str(width), str(steps), str(nan_at)], env=env,
                          capture_output=True, text=True, timeout=1800)
    shutil.rmtree(work / f"dump-{mode}-{width}", ignore_errors=True)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("STEP_TIMES ")), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"{mode} at W={width} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    said = COST.findall(proc.stderr)
    times = json.loads(line.split(" ", 1)[1])
    cpu_line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("STEP_CPU ")), None)
    cpu = json.loads(cpu_line.split(" ", 1)[1]) if cpu_line else []
    odd = next((ln for ln in proc.stdout.splitlines() if ln.startswith("ANOMALOUS_STEP ")), None)
    if odd is not None:  # the anomalous step last, after the healthy ones
        times.append(float(odd.split()[1]))
    return times, said[-1] if said else "", cpu


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", default="256,1024,2048,4096")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40,
                    help="steps timed per run, after the 32 left out (default: %(default)s)")
    ap.add_argument("--modes", default="plain,default,full")
    ap.add_argument("--deep", action="store_true",
                    help="also time the default tier's deep capture: a NaN batch after the Cell hooks' plan is "
                         "made (step 40), whose step is re-run in the rank (with the hooks back on where they "
                         "were taken off)")
    args = ap.parse_args(argv)
    modes = args.modes.split(",")
    work = Path(tempfile.mkdtemp(prefix="rankscope-watch-cost-"))
    (work / "job.py").write_text(JOB)
    result: dict = {}
    try:
        for width in (int(w) for w in args.widths.split(",")):
            times: dict[str, list[float]] = {m: [] for m in modes}
            cpu: dict[str, list[float]] = {m: [] for m in modes}
            rounds: dict[str, list[float]] = {m: [] for m in modes}  # each round's median step
            said: dict[str, str] = {}
            for r in range(args.rounds):
                for m in modes[r % len(modes):] + modes[:r % len(modes)]:
                    got, line, used = run(m, width, args.steps, work)
                    times[m] += got
                    cpu[m] += used
                    rounds[m].append(statistics.median(got))
                    said[m] = line or said.get(m, "")
            base = statistics.median(times["plain"])
            base_cpu = statistics.median(cpu["plain"]) if cpu["plain"] else None
            row = {"parameters": 3 * width * width + 3 * width + 10 * width + 10, "plain_ms": round(base * 1e3, 2)}
            for m in modes:
                med = statistics.median(times[m])
                row[f"{m}_ms"] = round(med * 1e3, 2)
                row[f"{m}_ratio"] = round(med / base, 3)
                # The spread a round to the next (this machine's neighbours come and go), and
                # the ratio of CPU time a step, which another tenant's load moves far less.
                per_round = [a / b for a, b in zip(rounds[m], rounds["plain"])]
                row[f"{m}_round_ratios"] = [round(x, 3) for x in per_round]
                cpu_ratio = statistics.median(cpu[m]) / base_cpu if base_cpu and cpu[m] else None
                row[f"{m}_cpu_ratio"] = None if cpu_ratio is None else round(cpu_ratio, 3)
                if m != "plain":
                    row[f"{m}_said"] = said.get(m, "")
                spread = f"rounds {min(per_round):.2f}-{max(per_round):.2f}x" if per_round else ""
                cpu_text = f"cpu {cpu_ratio:.2f}x" if cpu_ratio is not None else ""
                print(f"W={width:5d} {m:8s} {med * 1e3:9.2f} ms {med / base:5.2f}x  {spread}  {cpu_text}  "
                      f"{said.get(m, '')}", flush=True)
            if args.deep:
                got, line, _ = run("default", width, 12, work, nan_at=40)
                row["deep_step_ms"] = round(got[-1] * 1e3, 2)
                row["deep_vs_default_median"] = round(got[-1] / statistics.median(got[:-1]), 2)
                row["deep_said"] = line
                print(f"W={width:5d} deep     {got[-1] * 1e3:9.2f} ms {row['deep_vs_default_median']:5.2f}x "
                      f"the default's median step  {line}", flush=True)
            result[str(width)] = row
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
