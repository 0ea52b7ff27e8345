"""A pure data-parallel job with a bug every rank runs (code, not a machine).

Written as a stranger would: a small two-tower regressor with a ``Parameter`` bias added
after the model was built, trained on 4 CPU ranks under msrun; it knows nothing of
rankscope. ``BUG`` picks the bug, ``STYLE`` the loop:

- ``BUG=unreduced``: the gradient reducer is built before the extra bias exists, so that
  bias is updated from each rank's own gradient and never reduced: the replicas drift
  apart on it from the first update, on every rank alike;
- ``BUG=same_data``: the sampler does not shard: every rank reads rank 0's batches, so
  four ranks train on one rank's data;
- ``BUG=fwd_nan_once:R:S``: on rank R at step S, one NaN appears in the left tower's hidden
  activation on the first execution of that step only (a device that miscomputed once);
  ReLU swallows it, so the loss and gradients stay finite;
- ``BUG=fwd_nan_always:R:S``: the same on every execution of that step (code or data);
- ``BUG=`` (unset): a correct job.

``STYLE=loop`` (default): a PyNative ``value_and_grad`` loop; ``STYLE=graph``: one
compiled training Cell (GRAPH mode). ``STEPS`` (default 6).
"""
import os

import mindspore as ms
import numpy as np
from mindspore import nn, ops
from mindspore.communication import get_group_size, get_rank, init

STYLE = os.environ.get("STYLE", "loop")
BUG = os.environ.get("BUG", "")
STEPS = int(os.environ.get("STEPS", "6"))
ms.set_context(mode=ms.GRAPH_MODE if STYLE == "graph" else ms.PYNATIVE_MODE)
ms.set_device("CPU")
init()
if STYLE == "graph":
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
RANK, WORLD = get_rank(), get_group_size()
ms.set_seed(77)


KIND, GRANK, GSTEP = (BUG.split(":")[0], int(BUG.split(":")[1]), int(BUG.split(":")[2])) if BUG.count(":") == 2 \
    else (BUG, -1, -1)
now = {"step": -1, "calls": 0}


class Glitch(nn.Cell):
    """Identity, except where the fault says: a NaN in one hidden unit."""

    def construct(self, x):
        if RANK == GRANK and now["step"] == GSTEP and STYLE == "loop":
            now["calls"] += 1
            if KIND == "fwd_nan_always" or now["calls"] == 1:
                bad = np.zeros(x.shape, np.float32)
                bad[0, 0] = np.nan
                x = x + ms.Tensor(bad)
        return x


class TwoTower(nn.Cell):
    def __init__(self, d_in=24, width=40):
        super().__init__()
        self.left = nn.SequentialCell(nn.Dense(d_in, width), Glitch(), nn.ReLU(), nn.Dense(width, 1))
        self.right = nn.SequentialCell(nn.Dense(d_in, width // 2), nn.Tanh(), nn.Dense(width // 2, 1))

    def construct(self, x):
        return self.left(x) + self.right(x)


model = TwoTower()
params = list(model.trainable_params())
reducer = nn.DistributedGradReducer(params, mean=True, degree=WORLD)
# Added after the reducer was built: its gradient is left out of the reduction below.
model.offset = ms.Parameter(ms.Tensor(np.zeros(1, np.float32)), name="offset")
params.append(model.offset)
opt = nn.SGD(params, learning_rate=0.05, momentum=0.9)
loss_fn = nn.MSELoss()


def forward(x, y):
    return loss_fn(model(x) + model.offset, y)


def reduce(grads):
    if KIND == "unreduced":
        return reducer(grads[:-1]) + (grads[-1],)
    return reducer(grads[:-1]) + (ops.AllReduce()(grads[-1]) / WORLD,)


grad_fn = ms.value_and_grad(forward, None, opt.parameters)


class TrainStep(nn.Cell):
    def __init__(self):
        super().__init__()
        self.grad_fn, self.opt = grad_fn, opt

    def construct(self, x, y):
        loss, grads = self.grad_fn(x, y)
        grads = reduce(grads)
        self.opt(grads)
        return loss


def batch(step):
    shard = 0 if KIND == "same_data" else RANK
    rs = np.random.RandomState(1000 * step + shard)
    x = rs.rand(32, 24).astype(np.float32)
    return ms.Tensor(x), ms.Tensor((x.sum(axis=1, keepdims=True) * 0.1 + 0.5).astype(np.float32))


train = TrainStep() if STYLE == "graph" else None
for step in range(STEPS):
    now["step"] = step
    x, y = batch(step)
    if train is not None:
        loss = train(x, y)
    else:
        loss, grads = grad_fn(x, y)
        opt(reduce(grads))
    print(f"rank {RANK} step {step} loss {float(loss.asnumpy()):.6f}", flush=True)
