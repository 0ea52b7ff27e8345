"""A plain data-parallel MindSpore training script, with an optional injected fault.

Nothing here knows about rankscope: ``rankscope launch -- msrun ... train_dp.py``
attaches the probe from outside. Run it under msrun (4 CPU ranks here):

    msrun --worker_num=4 --local_worker_num=4 --master_port=8118 --join=True examples/train_dp.py

``TRAIN_FAULT=kind:rank:step`` injects one real fault on one rank at one step:

- ``nan_batch``: one NaN in that rank's input batch. ReLU maps NaN to 0 on CPU, so the
  loss stays finite; the NaN surfaces in fc1's output and its weight gradient, and the
  AllReduce then spreads it to every rank's reduced gradient.
- ``scale_grad``: that rank's local gradients are multiplied by ``TRAIN_FAULT_SCALE``
  (default 50) before the reduction, as a faulty gradient kernel or a bad loss scale would.
- ``perturb_weight``: fc2's weights on that rank are nudged by 1e-3 as the step begins,
  as a bit flip or a bad optimizer step would; replicas stop being identical.
- ``bitflip``: the lowest bit of one of fc2's weights flips on that rank as the step
  begins, as a memory fault would: the value moves by one part in ten million.
- ``seed``: that rank initialises its model with a different seed.
- ``kill``: that rank kills itself with SIGKILL in the middle of the step (after its
  backward, before the gradient AllReduce).
- ``sdc_once``: one value of the model's output on that rank is NaN on the first
  execution of that step only, as a device that miscomputes once (silent data corruption)
  would: running the same step again gives the right value.
- ``sdc_always``: the same on every execution of that step, as a device that keeps
  miscomputing would.

At the end each rank prints a CRC-32 of its weights (``rank R/N weights crc32 X``): the
same on every rank of a healthy run, and the same as an unwatched run's.

``TRAIN_HIDDEN`` (default 64) sets the hidden width (fc2 is HIDDEN x HIDDEN);
``TRAIN_STEPS`` (default 12) sets the number of steps; ``TRAIN_STEP_SLEEP`` (seconds,
default 0) paces them, as a slow input pipeline would.
"""
from __future__ import annotations

import os
import signal
import sys
import time
import zlib

import mindspore as ms
import numpy as np
from mindspore import nn, ops
from mindspore.communication import get_group_size, get_rank, init

IN, OUT, BATCH = 32, 8, 16
HIDDEN = int(os.environ.get("TRAIN_HIDDEN", "64"))
SEED = 1234


class MLP(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Dense(IN, HIDDEN)
        self.relu1 = nn.ReLU()
        self.fc2 = nn.Dense(HIDDEN, HIDDEN)
        self.relu2 = nn.ReLU()
        self.head = nn.Dense(HIDDEN, OUT)

    def construct(self, x):
        return self.head(self.relu2(self.fc2(self.relu1(self.fc1(x)))))


def parse_fault(spec: str | None) -> tuple[str, int, int] | None:
    if not spec:
        return None
    try:
        kind, rank, step = spec.split(":")
        return kind, int(rank), int(step)
    except ValueError:
        sys.exit(f"TRAIN_FAULT must be kind:rank:step, got {spec!r}")


def batch_for(rank: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    """Each rank's shard of a fixed synthetic regression task (a random linear teacher)."""
    teacher = np.random.RandomState(7).randn(IN, OUT).astype(np.float32) / np.sqrt(IN)
    rs = np.random.RandomState(10_000 * (rank + 1) + step)
    x = rs.randn(BATCH, IN).astype(np.float32)
    y = (x @ teacher + 0.01 * rs.randn(BATCH, OUT)).astype(np.float32)
    return x, y


def main() -> int:
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    init()
    rank, world = get_rank(), get_group_size()
    fault = parse_fault(os.environ.get("TRAIN_FAULT"))
    steps = int(os.environ.get("TRAIN_STEPS", "12"))
    mine = fault if fault and fault[1] == rank else None

    ms.set_seed(SEED + (1 if mine and mine[0] == "seed" else 0))
    net = MLP()
    loss_fn = nn.MSELoss()
    optimizer = nn.Adam(net.trainable_params(), learning_rate=1e-2)
    reducer = nn.DistributedGradReducer(optimizer.parameters)

    executions: dict[int, int] = {}
    corrupt = np.zeros((BATCH, OUT), np.float32)
    corrupt[0, 0] = np.nan

    def forward(x, y):
        out = net(x)
        executions[step] = executions.get(step, 0) + 1
        if mine and mine[0] in ("sdc_once", "sdc_always") and step == mine[2] \
                and (mine[0] == "sdc_always" or executions[step] == 1):
            out = out + ms.Tensor(corrupt)
        return loss_fn(out, y)

    grad_fn = ms.value_and_grad(forward, None, optimizer.parameters)
    scale = float(os.environ.get("TRAIN_FAULT_SCALE", "50"))
    pace = float(os.environ.get("TRAIN_STEP_SLEEP", "0"))

    for step in range(steps):
        if pace:
            time.sleep(pace)
        x, y = batch_for(rank, step)
        if mine and mine[0] == "nan_batch" and step == mine[2]:
            x[3, 5] = np.nan
        if mine and mine[0] == "perturb_weight" and step == mine[2]:
            w = net.fc2.weight
            w.set_data(w + ops.ones_like(w) * 1e-3)
        if mine and mine[0] == "bitflip" and step == mine[2]:
            flipped = net.fc2.weight.asnumpy().copy()
            flipped.view(np.uint32)[HIDDEN // 2, 7] ^= 1
            net.fc2.weight.set_data(ms.Tensor(flipped))
        loss, grads = grad_fn(ms.Tensor(x), ms.Tensor(y))
        if mine and mine[0] == "kill" and step == mine[2]:
            # Mid-step, between backward and the AllReduce, as a crashed kernel would.
            print(f"rank {rank}: injecting SIGKILL in step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if mine and mine[0] == "scale_grad" and step == mine[2]:
            grads = tuple(g * scale for g in grads)
        grads = reducer(grads)
        optimizer(grads)
        print(f"rank {rank}/{world} step {step} loss {float(loss.asnumpy()):.6f}", flush=True)
    crc = zlib.crc32(b"".join(p.asnumpy().tobytes() for p in net.trainable_params()))
    print(f"rank {rank}/{world} weights crc32 {crc:08x}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
