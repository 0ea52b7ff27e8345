"""GRAPH-mode step time: a plain compiled training step vs the same step watched.

4-layer MLP (Dense 256x256 x3 + a 256->10 head, ReLU), batch 64, Momentum, a hand-written
TrainOneStep Cell (ops.GradOperation) compiled whole in GRAPH mode on CPU, attached the
way ``rankscope launch`` attaches (zero-code, sitecustomize). MindSpore reads its dump
config once per process, so every run is its own process; modes alternate run by run
(rotating order) so machine noise hits all of them alike. The figure is the ratio of
median step times vs plain; the kernel modes also print the most kernel-dump bytes and
iterations ever on disk at once.

Modes: plain (no rankscope), sentinels (parameters + loss, cluster.graph_kernels off),
kernels (the default kernel set: AllReduce + MatMul + Conv2D), all (every kernel), and the floor
under the last two: ms_kernels / ms_all, MindSpore's own tensor dump of the same kernels
with no rankscope at all (CPU builds can only dump tensors, each written to disk).

    .venv/bin/python bench/graph_step_time.py [--steps 40] [--rounds 3] [--modes plain,sentinels,kernels,ms_kernels,all,ms_all]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from rankscope.probe.graph.kernel_config import DEFAULT_KERNELS  # noqa: E402

KERNELS = {"sentinels": "off", "kernels": "default", "all": "all"}
#: MindSpore's own kernel dump with no rankscope at all (the floor under the kernel modes).
MS_DUMP = {"ms_kernels": (1, list(DEFAULT_KERNELS)), "ms_all": (0, [])}

JOB = r"""
import json, os, sys, time
import numpy as np
import mindspore as ms
from mindspore import nn, ops
ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
ms.set_seed(0)

class MLP(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Dense(256, 256), nn.Dense(256, 256), nn.Dense(256, 256)
        self.head = nn.Dense(256, 10)
        self.relu = nn.ReLU()
    def construct(self, x):
        return self.head(self.relu(self.fc3(self.relu(self.fc2(self.relu(self.fc1(x)))))))

class Step(nn.Cell):
    def __init__(self, net, opt):
        super().__init__()
        self.loss_net = nn.WithLossCell(net, nn.CrossEntropyLoss())
        self.opt, self.weights = opt, opt.parameters
        self.grad = ops.GradOperation(get_by_list=True)
    def construct(self, x, y):
        loss = self.loss_net(x, y)
        self.opt(self.grad(self.loss_net, self.weights)(x, y))
        return loss

net = MLP()
step = Step(net, nn.Momentum(net.trainable_params(), 0.01, 0.9))
rs = np.random.RandomState(0)
x = ms.Tensor(rs.randn(64, 256).astype(np.float32))
y = ms.Tensor(rs.randint(0, 10, 64).astype(np.int32))
times = []
for i in range(int(sys.argv[1]) + 3):
    t0 = time.perf_counter()
    step(x, y).asnumpy()
    if i >= 3:  # warm-up: the first call compiles
        times.append(time.perf_counter() - t0)
out = {"times": times}
try:
    from rankscope.probe.attach import autoattach
    s = autoattach.session()
    k = s.debugger.graph.kernels if s is not None else None
    if k is not None:
        c = k.counters
        out.update(hw_bytes=c.high_water_bytes, hw_iterations=c.high_water_iterations, files=c.files,
                   iterations=c.iterations)
except ImportError:
    pass
print("RESULT " + json.dumps(out), flush=True)
"""


def run(mode: str, steps: int, root: Path) -> dict:
    env = dict(os.environ, GLOG_v="3")
    env.pop("MINDSPORE_DUMP_CONFIG", None)
    if mode in MS_DUMP:
        dump_mode, kernels = MS_DUMP[mode]
        cfg = root / f"{mode}.json"
        cfg.write_text(json.dumps({"common_dump_settings": {
            "op_debug_mode": 0, "dump_mode": dump_mode, "path": str(root / mode), "net_name": "Net",
            "iteration": "all", "saved_data": "tensor", "input_output": 0, "kernels": kernels,
            "support_device": [0]}, "e2e_dump_settings": {"enable": True, "trans_flag": True}}))
        env["MINDSPORE_DUMP_CONFIG"] = str(cfg)
    elif mode != "plain":
        cfg = root / f"{mode}.json"
        cfg.write_text(json.dumps({"level": "L0", "task": "statistics",
                                   "cluster": {"graph_kernels": KERNELS[mode]}}))
        env.update(RANKSCOPE_ATTACH="1", RANKSCOPE_CONFIG=str(cfg), RANKSCOPE_DUMP_PATH=str(root / mode),
                   PYTHONPATH=os.pathsep.join([str(REPO / "agent" / "_attach"), str(REPO)]))
        env.pop("RANKSCOPE_AGENT", None)
    job = root / "graph_job.py"  # MindSpore compiles from source files, not from -c
    job.write_text(JOB)
    proc = subprocess.run([sys.executable, str(job), str(steps)], env=env, capture_output=True, text=True,
                          timeout=600, cwd=root)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if mode in MS_DUMP:
        shutil.rmtree(root / mode, ignore_errors=True)  # MindSpore never deletes its dump
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"{mode} run failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    return json.loads(line[7:])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default="plain,sentinels,kernels,all")
    args = ap.parse_args(argv)
    modes = args.modes.split(",")
    if "plain" not in modes:
        modes.insert(0, "plain")
    for m in modes:
        if m != "plain" and m not in KERNELS and m not in MS_DUMP:
            ap.error(f"--modes: unknown mode {m!r}; choose from plain, {', '.join([*KERNELS, *MS_DUMP])}")
    times: dict[str, list[float]] = {m: [] for m in modes}
    disk: dict[str, dict] = {}
    root = Path(tempfile.mkdtemp(prefix="rankscope-graph-bench-"))
    try:
        for r in range(args.rounds):
            for m in modes[r % len(modes):] + modes[:r % len(modes)]:
                out = run(m, args.steps, root)
                times[m] += out["times"]
                if "hw_bytes" in out:
                    d = disk.setdefault(m, {"hw_bytes": 0, "hw_iterations": 0, "files_per_step": 0})
                    d["hw_bytes"] = max(d["hw_bytes"], out["hw_bytes"])
                    d["hw_iterations"] = max(d["hw_iterations"], out["hw_iterations"])
                    d["files_per_step"] = round(out["files"] / max(1, out["iterations"]), 1)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    base = statistics.median(times["plain"])
    result: dict = {"plain_ms": round(base * 1e3, 3)}
    for m in modes:
        med = statistics.median(times[m])
        d = disk.get(m)
        extra = (f" | disk high-water {d['hw_bytes'] / 1024:.0f} KiB, {d['hw_iterations']} iteration(s), "
                 f"{d['files_per_step']} files/step") if d else ""
        print(f"{m:10s} {med * 1e3:8.2f} ms  {med / base:5.2f}x  (n={len(times[m])}){extra}")
        result[f"{m}_ratio"] = round(med / base, 3)
        if d:
            result[f"{m}_disk_high_water_bytes"] = d["hw_bytes"]
            result[f"{m}_disk_high_water_iterations"] = d["hw_iterations"]
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
