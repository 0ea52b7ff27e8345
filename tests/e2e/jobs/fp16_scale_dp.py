"""Float16 data-parallel training with a dynamic loss scale, written by hand as on CPU
(``TrainOneStepWithLossScaleCell`` needs an NPU status op the CPU backend lacks):
PyNative, ``net.to_float(float16)``, ``amp.DynamicLossScaler(2**24, 2, 50)``, gradients
reduced with ``nn.DistributedGradReducer``, unscaled, ``amp.all_finite``, the update
skipped on overflow, ``scaler.adjust``. Steps 0-6 overflow on every rank while the scale
searches down from 2**24, and step 8 on one rank only, at the scale's ceiling.

FP16_FAULT=KIND:RANK:STEP (steps from 0): ``nan`` puts a NaN in that rank's batch at
that step; ``big`` multiplies that rank's batch by 30 at that step (only its float16
gradients overflow); ``floor`` multiplies the targets by 1e6 from that step on, on that
rank or, with RANK -1, on every rank (the scale falls every step). FP16_STEPS (16).
Prints ``LOSS rank=R step=S <loss> finite=<bool> scale=<scale>``. Knows nothing about
rankscope.
"""
import os

import mindspore as ms
import numpy as np
from mindspore import amp, nn
from mindspore.communication import get_group_size, get_rank, init

ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_device("CPU")
init()
RANK, WORLD = get_rank(), get_group_size()
ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
ms.set_seed(3)
STEPS = int(os.environ.get("FP16_STEPS", "16"))
kind, f_rank, f_step = (os.environ.get("FP16_FAULT") or "none:-9:-1").split(":")
f_rank, f_step = int(f_rank), int(f_step)


class MLP(nn.Cell):
    def __init__(self):
        super().__init__()
        self.body = nn.SequentialCell(nn.Dense(32, 64), nn.ReLU(), nn.Dense(64, 64), nn.ReLU())
        self.head = nn.Dense(64, 4)

    def construct(self, x):
        return self.head(self.body(x))


net = MLP()
net.to_float(ms.float16)
loss_fn = nn.MSELoss()
opt = nn.Adam(net.trainable_params(), learning_rate=1e-3)
scaler = amp.DynamicLossScaler(2 ** 24, 2, 50)


def forward(x, y):
    loss = loss_fn(net(x).astype(ms.float32), y)
    return scaler.scale(loss), loss


grad_fn = ms.value_and_grad(forward, None, opt.parameters, has_aux=True)
reducer = nn.DistributedGradReducer(opt.parameters)

rs = np.random.RandomState(7 + RANK)
for step in range(STEPS):
    x = rs.randn(16, 32).astype(np.float32)
    y = rs.randn(16, 4).astype(np.float32) * 2
    if kind == "nan" and RANK == f_rank and step == f_step:
        x[3, 7] = np.nan
    if kind == "big" and RANK == f_rank and step == f_step:
        x *= 30
    if kind == "floor" and f_rank in (-1, RANK) and step >= f_step:
        y *= 1e6
    (_, loss), grads = grad_fn(ms.Tensor(x), ms.Tensor(y))
    grads = scaler.unscale(reducer(grads))
    finite = amp.all_finite(grads)
    if finite:
        opt(grads)
    scaler.adjust(finite)
    print(f"LOSS rank={RANK} step={step} {loss.asnumpy().item():.9g} finite={bool(finite)} "
          f"scale={scaler.scale_value.asnumpy().item()}", flush=True)
