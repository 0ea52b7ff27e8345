"""A 4-rank data-parallel MindSpore job dumped by the published msProbe itself (no rankscope).

Run under msrun; every rank writes msProbe's own tree under ``MSP_DUMP`` (``step{N}/rank{R}/``).
The model, loop and optimizer differ on purpose from examples/train_dp.py: a two-branch
cell, Momentum, a loss with a mean over a mask, and the gradients averaged by one eager
``mint.distributed.all_reduce`` per gradient inside the dumped span, so the dump holds the AllReduce calls.
(``DistributedGradReducer`` and the optimizer run compiled, and msProbe's hooks inside a
compiled cell fail compilation: the update runs after ``stop()``.)

``MSP_FAULT=kind:rank:step``: ``nan_batch`` (one NaN in that rank's input), ``scale_grad``
(its gradient scale 50 instead of 1, before the reduction), ``drift_weight`` (one weight nudged by 1e-3
as the step begins). ``MSP_LEVEL`` (mix), ``MSP_TASK`` (statistics), ``MSP_SUMMARY``
(statistics | md5), ``MSP_STEPS`` (4).

msProbe 26.x computes its Norm with ``mint.norm``, whose kernel MindSpore's CPU build does
not register: the one function is replaced by an equivalent made of CPU kernels, the only
change to msProbe.
"""
from __future__ import annotations

import json
import os
import sys

import mindspore as ms
import numpy as np
from mindspore import mint, nn, ops
from mindspore.communication import get_group_size, get_rank, init
from mindspore.mint import distributed as dist


class _CpuMint:
    """mindspore.mint as msProbe's statistics see it, with a norm CPU kernels can run."""

    def __getattr__(self, name):
        return getattr(mint, name)

    @staticmethod
    def norm(x):
        return ops.sqrt((x * x).sum())


def _patch_msprobe_norm() -> None:
    from msprobe.core.dump.data_dump.data_processor import mindspore_processor
    mindspore_processor.mint = _CpuMint()


class TwoBranch(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Dense(12, 24)
        self.left = nn.Dense(24, 16)
        self.right = nn.Dense(24, 16)
        self.act = nn.Tanh()
        self.out = nn.Dense(16, 3)

    def construct(self, x):
        h = self.act(self.stem(x))
        return self.out(self.act(self.left(h)) + self.act(self.right(h)))


def main() -> int:
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    init()
    rank, world = get_rank(), get_group_size()
    kind, frank, fstep = (os.environ.get("MSP_FAULT") or "none:-1:-1").split(":")
    frank, fstep = int(frank), int(fstep)
    dump = os.environ["MSP_DUMP"]
    cfg = {"task": os.environ.get("MSP_TASK", "statistics"), "dump_path": dump, "rank": [], "step": [],
           "level": os.environ.get("MSP_LEVEL", "mix"),
           "statistics": {"scope": [], "list": [], "data_mode": ["all"],
                          "summary_mode": os.environ.get("MSP_SUMMARY", "statistics")},
           "tensor": {"scope": [], "list": [], "data_mode": ["all"]}}
    cfg_path = os.path.join(os.environ.get("MSP_CFG_DIR", dump), f"msprobe_config_{rank}.json")
    os.makedirs(os.path.dirname(cfg_path), exist_ok=True)
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    _patch_msprobe_norm()
    from msprobe.mindspore import PrecisionDebugger

    ms.set_seed(7)
    net = TwoBranch()
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.05, momentum=0.9)

    def allreduce(g):
        g = g.copy()
        dist.all_reduce(g)  # in place
        return g

    def loss_of(x, y, mask):
        err = (net(x) - y) ** 2
        return (err * mask).sum() / mask.sum()

    grad_fn = ms.value_and_grad(loss_of, None, opt.parameters)
    debugger = PrecisionDebugger(config_path=cfg_path)
    rs = np.random.RandomState(100 + rank)
    for step in range(int(os.environ.get("MSP_STEPS", "4"))):
        x = rs.uniform(-1, 1, (8, 12)).astype(np.float32)
        y = rs.uniform(-1, 1, (8, 3)).astype(np.float32)
        mask = (rs.uniform(0, 1, (8, 1)) > 0.2).astype(np.float32)
        mine = rank == frank and step == fstep
        if mine and kind == "nan_batch":
            x[2, 4] = np.nan
        if mine and kind == "drift_weight":  # between steps, as a bit flip would: msProbe sees no call
            w = net.left.weight
            w.set_data(w + ops.ones_like(w) * 1e-3)
        debugger.start(net)
        loss, grads = grad_fn(ms.Tensor(x), ms.Tensor(y), ms.Tensor(mask))
        scale = 50.0 if mine and kind == "scale_grad" else 1.0  # a gradient scale, wrong on one rank
        grads = tuple(g * scale for g in grads)
        grads = tuple(allreduce(g) / world for g in grads)
        debugger.stop()
        opt(grads)
        debugger.step()
        print(f"rank {rank} step {step} loss {float(loss.asnumpy()):.5f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
