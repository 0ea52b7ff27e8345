"""Data-parallel training the way MindSpore 2.x's tutorials write it: PyNative mode, a
functional ``ms.value_and_grad`` step compiled with ``@ms.jit`` (the gradient AllReduce
of nn.DistributedGradReducer and the optimizer inside it), a small CNN with BatchNorm,
and a sharded mindspore.dataset pipeline iterated with create_tuple_iterator.

JIT_FAULT=nan_batch:RANK:STEP puts one NaN in that rank's images at that step (steps
from 0). JIT_STEPS (default 8). Knows nothing about rankscope.
"""
import os

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn
from mindspore.communication import get_group_size, get_rank, init

ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_device("CPU")
init()
RANK, WORLD = get_rank(), get_group_size()
ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
ms.set_seed(5)

STEPS, BATCH = int(os.environ.get("JIT_STEPS", "8")), 8
kind, f_rank, f_step = (os.environ.get("JIT_FAULT") or "none:-1:-1").split(":")

rng = np.random.default_rng(0)
images = rng.standard_normal((WORLD * BATCH * STEPS, 1, 8, 8)).astype(np.float32)
labels = (images[:, 0].mean(axis=(1, 2)) > 0).astype(np.int32)
data = ds.NumpySlicesDataset({"image": images, "label": labels}, shuffle=False, num_shards=WORLD, shard_id=RANK)
data = data.batch(BATCH, drop_remainder=True)


class SmallCNN(nn.Cell):
    def __init__(self):
        super().__init__()
        self.features = nn.SequentialCell(nn.Conv2d(1, 4, 3, pad_mode="same"), nn.BatchNorm2d(4), nn.ReLU(),
                                          nn.MaxPool2d(kernel_size=2, stride=2))
        self.head = nn.SequentialCell(nn.Flatten(), nn.Dense(4 * 4 * 4, 16), nn.ReLU(), nn.Dense(16, 2))

    def construct(self, x):
        return self.head(self.features(x))


net = SmallCNN()
loss_fn = nn.CrossEntropyLoss()
opt = nn.Momentum(net.trainable_params(), learning_rate=0.05, momentum=0.9)


def forward(x, y):
    return loss_fn(net(x), y)


grad_fn = ms.value_and_grad(forward, None, opt.parameters)
reducer = nn.DistributedGradReducer(opt.parameters)


@ms.jit
def train_step(x, y):
    loss, grads = grad_fn(x, y)
    opt(reducer(grads))
    return loss


net.set_train()
for step, (x, y) in enumerate(data.create_tuple_iterator()):
    if kind == "nan_batch" and RANK == int(f_rank) and step == int(f_step):
        bad = x.asnumpy()
        bad[0, 0, 3, 3] = np.nan
        x = ms.Tensor(bad)
    loss = train_step(x, y)
    print(f"rank {RANK} step {step} loss {float(loss.asnumpy()):.6f}", flush=True)
print(f"rank {RANK} finished {STEPS} steps", flush=True)
