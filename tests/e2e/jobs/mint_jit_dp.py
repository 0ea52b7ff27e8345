"""Data-parallel training written with ``mindspore.mint`` and ``@ms.jit`` helpers of the
job's own inside the eager forward and the loss: a fused SwiGLU that averages its gate
over the ranks with an AllReduce (a collective inside the helper, called by every
block, so its graph runs several times a step), and an MSE loss. PyNative,
``value_and_grad``, ``DistributedGradReducer``, ``AdamWeightDecay``.

MINT_FAULT=nan:RANK:STEP puts a NaN in that rank's batch at that step. MINT_STEPS (8).
Prints ``LOSS rank=R step=S <loss>``. Knows nothing about rankscope.
"""
import os

import mindspore as ms
import numpy as np
from mindspore import mint, nn, ops
from mindspore.communication import get_group_size, get_rank, init

ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_device("CPU")
init()
RANK, WORLD = get_rank(), get_group_size()
ms.set_seed(11)
kind, f_rank, f_step = (os.environ.get("MINT_FAULT") or "none:-1:-1").split(":")
allreduce = ops.AllReduce()


@ms.jit
def swiglu_synced(gate, up):
    return mint.nn.functional.silu(allreduce(gate) / WORLD) * up


@ms.jit
def mse(pred, target):
    return mint.mean((pred - target) ** 2)


class Block(nn.Cell):
    def __init__(self, d, h):
        super().__init__()
        self.gate, self.up, self.down = mint.nn.Linear(d, h), mint.nn.Linear(d, h), mint.nn.Linear(h, d)

    def construct(self, x):
        return x + self.down(swiglu_synced(self.gate(x), self.up(x)))


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.inp = mint.nn.Linear(24, 48)
        self.blocks = nn.CellList([Block(48, 96) for _ in range(2)])
        self.out = mint.nn.Linear(48, 3)

    def construct(self, x):
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return self.out(h)


net = Net()
opt = nn.AdamWeightDecay(net.trainable_params(), learning_rate=1e-3, weight_decay=0.01)
grad_fn = ms.value_and_grad(lambda x, y: mse(net(x), y), None, opt.parameters)
reducer = nn.DistributedGradReducer(opt.parameters, mean=True, degree=WORLD)
rs = np.random.RandomState(100 + RANK)
for step in range(int(os.environ.get("MINT_STEPS", "8"))):
    x, y = rs.randn(16, 24).astype(np.float32), rs.randn(16, 3).astype(np.float32)
    if kind == "nan" and RANK == int(f_rank) and step == int(f_step):
        x[2, 5] = np.nan
    loss, grads = grad_fn(ms.Tensor(x), ms.Tensor(y))
    opt(reducer(grads))
    print(f"LOSS rank={RANK} step={step} {loss.asnumpy().item():.9g}", flush=True)
