"""A data-parallel job whose ranks are deliberately at different points of a step.

Every rank but ``SKEW_FAST_RANK`` sleeps ``SKEW_SLEEP_S`` between its gradient
AllReduce and its optimizer step, so the fast rank is almost always already inside the
*next* step's AllReduce while the others are still finishing the current one: the
shape in which "pause every rank at its next boundary" deadlocks. Each rank prints its
loss as the float32's bytes, so runs can be compared bit for bit.

``TRAIN_FAULT=perturb:RANK:STEP`` nudges one rank's weights at that step (a silent
replica divergence, for a divergence pause). ``TRAIN_STEPS`` sets the length.
"""
import os
import sys
import time

import mindspore as ms
import numpy as np
from mindspore import nn, ops
from mindspore.communication import get_rank, init


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.body = nn.SequentialCell([nn.Dense(24, 48), nn.Tanh(), nn.Dense(48, 48), nn.Tanh()])
        self.out = nn.Dense(48, 4)

    def construct(self, x):
        return self.out(self.body(x))


def main():
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    init()
    rank = get_rank()
    steps = int(os.environ.get("TRAIN_STEPS", "10"))
    fast = int(os.environ.get("SKEW_FAST_RANK", "2"))
    sleep_s = float(os.environ.get("SKEW_SLEEP_S", "0.4"))
    fault = os.environ.get("TRAIN_FAULT", "")
    f_rank, f_step = (int(v) for v in fault.split(":")[1:]) if fault else (-1, -1)
    ms.set_seed(7)
    net = Net()
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.05, momentum=0.9)
    reduce_grads = nn.DistributedGradReducer(opt.parameters)
    grad_of = ms.value_and_grad(lambda x, y: nn.MSELoss()(net(x), y), None, opt.parameters)
    data = np.random.default_rng(100 + rank)
    for step in range(steps):
        x = data.standard_normal((8, 24)).astype(np.float32)
        y = np.tanh(x[:, :4]).astype(np.float32)
        if rank == f_rank and step == f_step:
            w = net.out.weight
            w.set_data(w + ops.ones_like(w) * 1e-3)
        loss, grads = grad_of(ms.Tensor(x), ms.Tensor(y))
        grads = reduce_grads(grads)
        if rank != fast:
            time.sleep(sleep_s)
        opt(grads)
        print(f"LOSS rank={rank} step={step} {loss.asnumpy().astype(np.float32).tobytes().hex()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
