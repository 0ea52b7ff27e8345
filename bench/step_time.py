"""Step time of a probed vs a plain training step.

4-layer MLP (Dense WxW x3 + a W->10 head, ReLU; W = 256 unless ``--width``), batch 64, Adam,
PyNative CPU, with the explicit in-rank API (bench/watch_cost.py measures the zero-code
probe as launch runs it, across model sizes).
Modes run in alternating rounds inside one process so machine noise hits all of them
alike; the figure is the ratio of median step times vs plain.

    .venv/bin/python bench/step_time.py [--steps 30] [--rounds 5] [--modes plain,sentinels,L0,L1,mix]
    .venv/bin/python bench/step_time.py --modes plain,sentinels,sentinels_norerun,L0,L0_norerun

Prints one line per mode and a final JSON line.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np


def build(width: int = 256):
    import mindspore as ms
    from mindspore import nn

    class MLP(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2, self.fc3 = nn.Dense(width, width), nn.Dense(width, width), nn.Dense(width, width)
            self.head = nn.Dense(width, 10)
            self.relu = nn.ReLU()

        def construct(self, x):
            x = self.relu(self.fc1(x))
            x = self.relu(self.fc2(x))
            x = self.relu(self.fc3(x))
            return self.head(x)

    net = MLP()
    loss_fn = nn.CrossEntropyLoss()
    opt = nn.Adam(net.trainable_params(), 1e-3)
    grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, opt.parameters)
    return net, opt, grad_fn


def run_mode(mode: str, steps: int, dump_root: str, data, width: int = 256) -> tuple[list[float], list[float], list[float]]:
    """(wall, process CPU, training-thread CPU) seconds per step. CPU times are far less
    disturbed by other load than wall time; the process figure counts MindSpore's backend
    threads too, the thread figure only the Python thread where every hook runs."""
    from rankscope import PrecisionDebugger
    x, y = data
    dbg = None
    base = mode.removesuffix("_norerun")
    if mode != "plain":
        # "<mode>_norerun": the same with cluster.rerun off (the anomaly check on each
        # value_and_grad call is what it leaves out).
        level = "L0" if base == "sentinels" else base
        cfg = os.path.join(dump_root, f"{mode}.json")
        with open(cfg, "w") as f:
            json.dump({"task": "statistics", "level": level, "dump_path": os.path.join(dump_root, mode),
                       "cluster": {"rerun": base == mode}}, f)
        dbg = PrecisionDebugger(config_path=cfg)
    net, opt, grad_fn = build(width)
    times, cpu, thread = [], [], []
    for i in range(steps + 3):
        t0, c0, h0 = time.perf_counter(), time.process_time(), time.thread_time()
        if dbg is not None:
            dbg.start(net if base != "sentinels" else None)
        loss, grads = grad_fn(x, y)
        opt(grads)
        if dbg is not None:
            dbg.stop()
            dbg.step()
        loss.asnumpy()
        if i >= 3:  # warm-up: first calls compile kernels
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            thread.append(time.thread_time() - h0)
    if dbg is not None:
        dbg.close()
    return times, cpu, thread


def _p10(xs: list[float]) -> float:
    """10th percentile: other load only ever adds time, so the fast tail is the least
    disturbed estimate of a mode's own cost on a shared machine."""
    return sorted(xs)[max(0, len(xs) // 10 - 1)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--modes", default="plain,sentinels,L0")
    ap.add_argument("--width", type=int, default=256)
    args = ap.parse_args(argv)
    import mindspore as ms
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    ms.set_seed(0)
    rs = np.random.RandomState(0)
    data = (ms.Tensor(rs.randn(64, args.width).astype(np.float32)),
            ms.Tensor(rs.randint(0, 10, 64).astype(np.int32)))
    modes = args.modes.split(",")
    if "plain" not in modes:
        modes.insert(0, "plain")
    samples: dict[str, list[float]] = {m: [] for m in modes}
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    thr: dict[str, list[float]] = {m: [] for m in modes}
    root = tempfile.mkdtemp(prefix="rankscope-bench-")
    try:
        for r in range(args.rounds):
            # rotate the order every round so no mode always follows the same one
            for m in modes[r % len(modes):] + modes[:r % len(modes)]:
                wall, cpus, threads = run_mode(m, args.steps, root, data, args.width)
                samples[m] += wall
                cpu[m] += cpus
                thr[m] += threads
    finally:
        shutil.rmtree(root, ignore_errors=True)
    base = statistics.median(samples["plain"])
    cbase, tbase = statistics.median(cpu["plain"]), statistics.median(thr["plain"])
    result = {"plain_ms": round(base * 1e3, 3), "plain_cpu_ms": round(cbase * 1e3, 3),
              "plain_thread_ms": round(tbase * 1e3, 3)}
    qbase = _p10(samples["plain"])
    for m in modes:
        med, cmed, tmed = (statistics.median(x[m]) for x in (samples, cpu, thr))
        q = _p10(samples[m])
        print(f"{m:10s} wall {med * 1e3:7.2f} ms {med / base:5.2f}x | wall p10 {q * 1e3:7.2f} ms {q / qbase:5.2f}x | "
              f"process cpu {cmed / cbase:5.2f}x | thread cpu {tmed / tbase:5.2f}x  (n={len(samples[m])})")
        result[f"{m}_p10_ratio"] = round(q / qbase, 3)
        result[f"{m}_ratio"] = round(med / base, 3)
        result[f"{m}_cpu_ratio"] = round(cmed / cbase, 3)
        result[f"{m}_thread_ratio"] = round(tmed / tbase, 3)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
