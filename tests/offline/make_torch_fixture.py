"""Make the PyTorch fixture: dump trees written by the published msProbe on a real 4-rank
PyTorch job (gloo, CPU), one clean and one per injected fault, packed as
``fixtures/msprobe_torch.tar.gz``.

Why a fixture and not a CI step: PyTorch with msProbe is a second ~1 GB framework install
that the tests would need only to produce these few hundred kilobytes. Kept here so the
fixture can be made again and checked. It was made with torch 2.13.0+cpu and
mindstudio-probe 26.2.0 (``pip install torch mindstudio-probe``), by::

    python tests/offline/make_torch_fixture.py

The job is written as a PyTorch user would, with nothing of rankscope in it: a LayerNorm +
GELU MLP, AdamW, gradients averaged by ``dist.all_reduce`` per parameter inside the
dumped span (so the tree holds the communication calls), msProbe's ``PrecisionDebugger``
with ``level: mix``. Faults, each on one rank at step 3 of 5: ``nan_batch`` (rank 2: one
NaN in its input), ``scale_grad`` (rank 1: its gradient scale 50 instead of 1, before the reduction),
``drift_weight`` (rank 3: one weight nudged by 1e-3 between steps). ``md5_nan`` is the
``nan_batch`` run with ``summary_mode: md5`` and ``level: L1``.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

RUNS = {"clean": ("none", "mix", "statistics"), "nan_batch": ("nan_batch", "mix", "statistics"),
        "scale_grad": ("scale_grad", "mix", "statistics"), "drift_weight": ("drift_weight", "mix", "statistics"),
        "md5_nan": ("nan_batch", "L1", "md5")}
FAULT_RANK = {"nan_batch": 2, "scale_grad": 1, "drift_weight": 3}
FAULT_STEP, STEPS, WORLD = 3, 5, 4
OUT = Path(__file__).with_name("fixtures") / "msprobe_torch.tar.gz"


def worker(rank: int, fault: str, level: str, summary: str, dump: str, port: int) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    cfg = {"task": "statistics", "dump_path": dump, "rank": [], "step": [], "level": level,
           "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": summary}}
    cfg_path = os.path.join(tempfile.mkdtemp(), "config.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    from msprobe.pytorch import PrecisionDebugger

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    debugger = PrecisionDebugger(config_path=cfg_path)
    gen = torch.Generator().manual_seed(1000 + rank)
    for step in range(STEPS):
        x, y = torch.randn(6, 10, generator=gen), torch.randn(6, 4, generator=gen)
        mine = FAULT_RANK.get(fault) == rank and step == FAULT_STEP
        if mine and fault == "nan_batch":
            x[1, 3] = float("nan")
        if mine and fault == "drift_weight":
            with torch.no_grad():
                model[3].weight.add_(1e-3)
        debugger.start(model)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        scale = 50.0 if mine and fault == "scale_grad" else 1.0  # a loss scale, wrong on one rank
        for p in model.parameters():
            p.grad.mul_(scale)
            dist.all_reduce(p.grad)
            p.grad.div_(WORLD)
        opt.step()
        debugger.stop()
        debugger.step()
    dist.destroy_process_group()


def main() -> int:
    import torch.multiprocessing as mp

    work = Path(tempfile.mkdtemp(prefix="msprobe_torch_"))
    for i, (name, (fault, level, summary)) in enumerate(RUNS.items()):
        mp.spawn(worker, args=(fault, level, summary, str(work / name), 29650 + i), nprocs=WORLD, join=True)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(OUT, "w:gz") as tar:
        for name in RUNS:
            tar.add(work / name, arcname=name)
    shutil.rmtree(work)
    print(f"{OUT}: {OUT.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
