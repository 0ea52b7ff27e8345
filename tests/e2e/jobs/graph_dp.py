"""A static-graph data-parallel job, the way people write them for production, in one
of three styles (GRAPH_STYLE):

  custom   a hand-written TrainOneStep Cell: ops.GradOperation + nn.DistributedGradReducer
  cell     nn.WithLossCell + nn.TrainOneStepCell called in a Python loop
  model    Model.train over a GeneratorDataset (GRAPH_SINK=1 for dataset sink mode)

A weighted regression: each sample carries a loss weight, so a bad shard can scale one
rank's gradients without touching the compiled graph.

GRAPH_FAULT=kind:rank:step (steps from 0): nan_batch (one NaN in the batch), heavy_batch
(loss weights x50 -> that rank's local gradients x50), nudge (a weight nudged by 1e-3
before the step), exit (os._exit(3) before the step). GRAPH_STEPS (default 8).
Knows nothing about rankscope.
"""
import os

import mindspore as ms
import numpy as np
from mindspore import nn, ops
from mindspore.communication import get_group_size, get_rank, init
from mindspore.context import ParallelMode
from mindspore.train import Callback, Model

ms.set_context(mode=ms.GRAPH_MODE)
ms.set_device("CPU")
init()
RANK, WORLD = get_rank(), get_group_size()
ms.set_auto_parallel_context(parallel_mode=ParallelMode.DATA_PARALLEL, gradients_mean=True)
ms.set_seed(11)

STYLE = os.environ.get("GRAPH_STYLE", "custom")
STEPS = int(os.environ.get("GRAPH_STEPS", "8"))
spec = os.environ.get("GRAPH_FAULT", "")
KIND, FRANK, FSTEP = (spec.split(":")[0], int(spec.split(":")[1]), int(spec.split(":")[2])) if spec else ("", -1, -1)
BATCH, FEATURES = 16, 20


class Tower(nn.Cell):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Dense(FEATURES, 48, activation="relu")
        self.l2 = nn.Dense(48, 48, activation="relu")
        self.l3 = nn.Dense(48, 16, activation="relu")
        self.l4 = nn.Dense(16, 1)

    def construct(self, x):
        return self.l4(self.l3(self.l2(self.l1(x))))


class WeightedLoss(nn.Cell):
    def __init__(self, net):
        super().__init__(auto_prefix=False)
        self.net = net

    def construct(self, x, y, w):
        err = self.net(x) - y
        return (w * err * err).mean()


class TrainStep(nn.Cell):
    def __init__(self, loss_net, optimizer):
        super().__init__(auto_prefix=False)
        self.loss_net = loss_net
        self.optimizer = optimizer
        self.weights = optimizer.parameters
        self.grad = ops.GradOperation(get_by_list=True)
        self.reducer = nn.DistributedGradReducer(self.weights, mean=True, degree=WORLD)

    def construct(self, x, y, w):
        loss = self.loss_net(x, y, w)
        grads = self.grad(self.loss_net, self.weights)(x, y, w)
        grads = self.reducer(grads)
        self.optimizer(grads)
        return loss


def shard(step):
    rs = np.random.RandomState(1000 * RANK + step)
    x = rs.randn(BATCH, FEATURES).astype(np.float32)
    y = np.tanh(x[:, :1] - 0.5 * x[:, 1:2]).astype(np.float32)
    w = np.ones((BATCH, 1), np.float32)
    if RANK == FRANK and step == FSTEP:
        if KIND == "nan_batch":
            x[3, 5] = np.nan
        elif KIND == "heavy_batch":
            w *= 50.0
    return x, y, w


def before_step(net, step):
    if RANK != FRANK or step != FSTEP:
        return
    if KIND == "nudge":
        p = net.l2.weight
        p.set_data(ms.Tensor(p.asnumpy() + 1e-3))
    elif KIND == "exit":
        os._exit(3)


net = Tower()
loss_net = WeightedLoss(net)
opt = nn.Momentum(net.trainable_params(), learning_rate=0.02, momentum=0.9)

if STYLE == "custom":
    step_cell = TrainStep(loss_net, opt)
    step_cell.set_train()
    for i in range(STEPS):
        before_step(net, i)
        loss = step_cell(*map(ms.Tensor, shard(i)))
        print(f"rank {RANK} step {i} loss {float(loss.asnumpy()):.5f}", flush=True)
elif STYLE == "cell":
    step_cell = nn.TrainOneStepCell(loss_net, opt)
    step_cell.set_train()
    for i in range(STEPS):
        before_step(net, i)
        loss = step_cell(*map(ms.Tensor, shard(i)))
        print(f"rank {RANK} step {i} loss {float(loss.asnumpy()):.5f}", flush=True)
else:
    class Nudge(Callback):
        def on_train_step_begin(self, run_context):
            before_step(net, run_context.original_args().cur_step_num - 1)

    def rows():
        for i in range(STEPS):
            x, y, w = shard(i)
            for j in range(BATCH):
                yield x[j], y[j], w[j]

    data = ms.dataset.GeneratorDataset(rows, ["x", "y", "w"], shuffle=False).batch(BATCH)
    model = Model(nn.TrainOneStepCell(loss_net, opt))
    model.train(1, data, callbacks=[Nudge()], dataset_sink_mode=os.environ.get("GRAPH_SINK") == "1")
print(f"rank {RANK} finished", flush=True)
