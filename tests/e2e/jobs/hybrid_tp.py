"""A hand-written Megatron-style hybrid job: data parallel x tensor parallel, 4 ranks = 2 x 2.

Groups are made with ``create_group``: ``tp_0 = [0, 1]``, ``tp_1 = [2, 3]`` (the two shards
of one replica) and ``dp_0 = [0, 2]``, ``dp_1 = [1, 3]`` (the two replicas of one shard).
The first layer is column-parallel (each rank holds half the hidden units), the second
row-parallel, its partial sums added up by ``ops.AllReduce(group=tp)``; gradients are
averaged over the replicas by ``nn.DistributedGradReducer(group=dp)``. Both shards of a
replica read the same batch, so the two ranks of a replica print the same loss.

HYBRID_MODE=pynative (a value_and_grad loop, the default) or graph (a compiled TrainOneStep
cell). HYBRID_STEPS (default 8). HYBRID_FAULT=kind:rank:step injects one fault:

- ``scale_grad``: that rank's local gradients x50 before the replica reduction;
- ``nan_batch``: one NaN in that rank's copy of the batch (its tensor-parallel peer reads
  the same batch without it);
- ``nudge``: fc2's weight on that rank nudged by 1e-3 before the step (after the last
  optimizer update);
- ``exit``: that rank leaves with status 3 before the step.

HYBRID_NORM=1 puts a LayerNorm (on every rank, replicated) in front of the column-parallel
layer, behind Megatron's "copy to the tensor-parallel region": identity forward, its
gradient all-reduced over the tensor-parallel group backward, so both shards' norms learn
from the whole layer. HYBRID_NORM=unsynced is the bug every rank runs: the backward forgets
that all-reduce, each shard's norm learns from its half only and the tensor-parallel ranks'
norms drift apart from the first update, while the replicas of a shard still agree.

Knows nothing about rankscope.
"""
import os
import sys

import mindspore as ms
import numpy as np
from mindspore import nn, ops
from mindspore.communication import create_group, get_group_size, get_rank, init

MODE = os.environ.get("HYBRID_MODE", "pynative")
ms.set_context(mode=ms.GRAPH_MODE if MODE == "graph" else ms.PYNATIVE_MODE)
ms.set_device("CPU")
init()
RANK, WORLD = get_rank(), get_group_size()
TP = 2
DP = WORLD // TP
TP_INDEX, REPLICA = RANK % TP, RANK // TP
# A rank creates only the groups it is in (MindSpore refuses the others).
TP_GROUP, DP_GROUP = f"tp_{REPLICA}", f"dp_{TP_INDEX}"
create_group(TP_GROUP, [REPLICA * TP + t for t in range(TP)])
create_group(DP_GROUP, [r * TP + TP_INDEX for r in range(DP)])

STEPS = int(os.environ.get("HYBRID_STEPS", "8"))
spec = os.environ.get("HYBRID_FAULT", "")
KIND, FRANK, FSTEP = (spec.split(":")[0], int(spec.split(":")[1]), int(spec.split(":")[2])) if spec else ("", -1, -1)
IN, HIDDEN, OUT, BATCH = 16, 32, 4, 8
NORM = os.environ.get("HYBRID_NORM", "")

# The full weights, the same on every rank; each rank keeps its shard.
full = np.random.RandomState(3)
W1 = (full.randn(HIDDEN, IN) / np.sqrt(IN)).astype(np.float32)
W2 = (full.randn(OUT, HIDDEN) / np.sqrt(HIDDEN)).astype(np.float32)
SHARD = slice(TP_INDEX * HIDDEN // TP, (TP_INDEX + 1) * HIDDEN // TP)


class ColumnParallel(nn.Cell):
    def __init__(self):
        super().__init__()
        self.weight = ms.Parameter(ms.Tensor(W1[SHARD]), name="weight")
        self.bias = ms.Parameter(ms.Tensor(np.zeros(HIDDEN // TP, np.float32)), name="bias")

    def construct(self, x):
        return ops.relu(ops.matmul(x, self.weight.T) + self.bias)


class RowParallel(nn.Cell):
    def __init__(self):
        super().__init__()
        self.weight = ms.Parameter(ms.Tensor(W2[:, SHARD]), name="weight")
        self.bias = ms.Parameter(ms.Tensor(np.zeros(OUT, np.float32)), name="bias")
        self.reduce = ops.AllReduce(group=TP_GROUP)

    def construct(self, h):
        return self.reduce(ops.matmul(h, self.weight.T)) + self.bias


class CopyToTensorParallel(nn.Cell):
    """Identity forward; backward, the gradient summed over the tensor-parallel group
    (each shard's input gradient is only its part of the whole)."""

    def __init__(self, synced):
        super().__init__()
        self.synced = synced
        self.reduce = ops.AllReduce(group=TP_GROUP)

    def construct(self, x):
        return x

    def bprop(self, x, out, dout):
        if self.synced:
            return (self.reduce(dout),)
        return (dout,)


class TPNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm((IN,)) if NORM else None
        self.copy = CopyToTensorParallel(NORM != "unsynced") if NORM else None
        self.fc1 = ColumnParallel()
        self.fc2 = RowParallel()

    def construct(self, x):
        if self.norm is not None:
            x = self.copy(self.norm(x))
        return self.fc2(self.fc1(x))


def batch(step):
    rs = np.random.RandomState(100 * REPLICA + step)
    x = rs.randn(BATCH, IN).astype(np.float32)
    y = np.tanh(x[:, :OUT]).astype(np.float32)
    if RANK == FRANK and step == FSTEP and KIND == "nan_batch":
        x[2, 3] = np.nan
    return x, y


def before_step(net, step):
    if RANK != FRANK or step != FSTEP:
        return
    if KIND == "nudge":
        w = net.fc2.weight
        w.set_data(ms.Tensor(w.asnumpy() + 1e-3))
    elif KIND == "exit":
        print(f"rank {RANK}: leaving before step {step}", flush=True)
        sys.stdout.flush()
        os._exit(3)


net = TPNet()
loss_fn = nn.MSELoss()
opt = nn.SGD(net.trainable_params(), learning_rate=0.05)
reducer = nn.DistributedGradReducer(opt.parameters, mean=True, degree=DP, group=DP_GROUP)

if MODE == "graph":
    class WithLoss(nn.Cell):
        def __init__(self):
            super().__init__(auto_prefix=False)
            self.net, self.loss = net, loss_fn

        def construct(self, x, y):
            return self.loss(self.net(x), y)

    class TrainStep(nn.Cell):
        def __init__(self, loss_net):
            super().__init__(auto_prefix=False)
            self.loss_net, self.opt, self.reducer = loss_net, opt, reducer
            self.weights = opt.parameters
            self.grad = ops.GradOperation(get_by_list=True)

        def construct(self, x, y, scale):
            loss = self.loss_net(x, y)
            grads = self.grad(self.loss_net, self.weights)(x, y)
            grads = tuple(g * scale for g in grads)
            self.opt(self.reducer(grads))
            return loss

    step_cell = TrainStep(WithLoss())
    step_cell.set_train()
    for i in range(STEPS):
        before_step(net, i)
        x, y = batch(i)
        scale = 50.0 if (RANK == FRANK and i == FSTEP and KIND == "scale_grad") else 1.0
        loss = step_cell(ms.Tensor(x), ms.Tensor(y), ms.Tensor(scale, ms.float32))
        print(f"rank {RANK} step {i} loss {float(loss.asnumpy()):.6f}", flush=True)
else:
    def forward(x, y):
        return loss_fn(net(x), y)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)
    for i in range(STEPS):
        before_step(net, i)
        x, y = batch(i)
        loss, grads = grad_fn(ms.Tensor(x), ms.Tensor(y))
        if RANK == FRANK and i == FSTEP and KIND == "scale_grad":
            grads = tuple(g * 50.0 for g in grads)
        opt(reducer(grads))
        print(f"rank {RANK} step {i} loss {float(loss.asnumpy()):.6f}", flush=True)
print(f"rank {RANK} finished", flush=True)
