"""A rank's memory growth per step: the same PyNative loop plain, with sentinels, with L0.

The MLP of examples/train_dp.py (Adam, a fresh batch each step) runs ``--steps`` steps
in a fresh process per mode; each samples its own RSS every 200 steps after the first
fifth and prints the least-squares slope in KB per 1,000 steps. MindSpore's own growth
is the plain mode's; what rankscope adds is each mode's difference from it. A faster
check than ``bench/soak.py`` (no msrun, no launch) of the rank-side part of its
"rank RSS slope" target.

    .venv/bin/python bench/probe_rss.py [--steps 3000] [--modes plain,sentinels,L0]

The last line is JSON. Figures only: nothing here asserts.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile

CHILD = r'''
import json, sys, numpy as np, mindspore as ms
from mindspore import nn
ms.set_context(mode=ms.PYNATIVE_MODE); ms.set_device("CPU")
mode, steps, root = sys.argv[1], int(sys.argv[2]), sys.argv[3]
dbg = None
if mode != "plain":
    from rankscope import PrecisionDebugger
    cfg = f"{root}/{mode}.json"
    json.dump({"task": "statistics", "level": "L0", "dump_path": f"{root}/{mode}",
               "cluster": {"dump_keep_steps": 3}}, open(cfg, "w"))
    dbg = PrecisionDebugger(config_path=cfg)
ms.set_seed(1)
net = nn.SequentialCell(nn.Dense(32, 64), nn.ReLU(), nn.Dense(64, 64), nn.ReLU(), nn.Dense(64, 8))
opt = nn.Adam(net.trainable_params(), 1e-3)
loss_fn = nn.MSELoss()
grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, opt.parameters)
rs = np.random.RandomState(0)
pts = []
for step in range(steps):
    x = ms.Tensor(rs.randn(16, 32).astype(np.float32)); y = ms.Tensor(rs.randn(16, 8).astype(np.float32))
    if dbg is not None:
        dbg.start(net if mode == "L0" else None)
    loss, grads = grad_fn(x, y)
    opt(grads)
    if dbg is not None:
        dbg.stop(); dbg.step()
    float(loss.asnumpy())
    if step % 200 == 0 and step >= steps // 5:
        with open("/proc/self/statm") as f:
            pts.append((step, int(f.read().split()[1]) * 4))
a = np.array(pts, float)
print(json.dumps({"mode": mode, "kb_per_1k_steps": round(float(np.polyfit(a[:, 0], a[:, 1], 1)[0]) * 1000, 1),
                  "rss_kb_end": int(a[-1, 1])}))
'''


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--modes", default="plain,sentinels,L0")
    args = ap.parse_args()
    out = {}
    with tempfile.TemporaryDirectory(prefix="rankscope-rss-") as root:
        for mode in args.modes.split(","):
            proc = subprocess.run([sys.executable, "-c", CHILD, mode, str(args.steps), root],
                                  capture_output=True, text=True)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            if proc.returncode or not lines:
                print(f"{mode}: failed (exit {proc.returncode}): {proc.stderr[-500:]}", file=sys.stderr)
                continue
            out[mode] = json.loads(lines[-1])
            extra = "" if mode == "plain" or "plain" not in out else \
                f" ({out[mode]['kb_per_1k_steps'] - out['plain']['kb_per_1k_steps']:+.1f} over plain)"
            print(f"{mode:10s} RSS {out[mode]['kb_per_1k_steps']:9.1f} KB per 1,000 steps{extra}", flush=True)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
