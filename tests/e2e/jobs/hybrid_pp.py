"""A hand-written pipeline-parallel job: data parallel x two pipeline stages, 4 ranks = 2 x 2.

Stage 0 (ranks 0, 1) holds the first layer, stage 1 (ranks 2, 3) the second and the loss;
ranks d and 2 + d are one replica's two stages and read the same batch. CPU MindSpore has
no Send/Receive, so a stage hands a tensor on with ``ops.AllReduce`` in a two-rank group
``pp_<d> = [d, 2 + d]`` where the receiving side contributes zeros: the activation goes
forward, its gradient comes back the same way. Each stage averages its gradients over its
replicas with ``nn.DistributedGradReducer(group=dp_<stage>)``. PyNative, value_and_grad.

PP_STEPS (default 8). PP_FAULT=kind:rank:step injects one fault: ``nan_batch`` (one NaN in
that rank's batch: on a stage-0 rank it goes forward into stage 1), ``scale_grad`` (that
rank's local gradients x50 before the reduction), ``nudge`` (its first weight nudged by
1e-3 before the step), ``exit`` (it leaves with status 3 before the step).
Knows nothing about rankscope.
"""
import os
import sys

import mindspore as ms
import numpy as np
from mindspore import nn, ops
from mindspore.communication import create_group, get_rank, init

ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_device("CPU")
init()
RANK = get_rank()
STAGE, REPLICA = RANK // 2, RANK % 2
PP_GROUP, DP_GROUP = f"pp_{REPLICA}", f"dp_{STAGE}"
create_group(PP_GROUP, [REPLICA, 2 + REPLICA])
create_group(DP_GROUP, [2 * STAGE, 2 * STAGE + 1])

STEPS = int(os.environ.get("PP_STEPS", "8"))
spec = os.environ.get("PP_FAULT", "")
KIND, FRANK, FSTEP = (spec.split(":")[0], int(spec.split(":")[1]), int(spec.split(":")[2])) if spec else ("", -1, -1)
IN, HIDDEN, OUT, BATCH = 12, 24, 3, 8
ms.set_seed(21)  # the same initial weights on both replicas of a stage


class Front(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(IN, HIDDEN)

    def construct(self, x):
        return ops.tanh(self.dense(x))


class Back(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(HIDDEN, OUT)

    def construct(self, h):
        return self.dense(h)


def batch(step):
    rs = np.random.RandomState(50 * REPLICA + step)
    x = rs.randn(BATCH, IN).astype(np.float32)
    y = np.sin(x[:, :OUT]).astype(np.float32)
    if RANK == FRANK and step == FSTEP and KIND == "nan_batch":
        x[1, 2] = np.nan
    return ms.Tensor(x), ms.Tensor(y)


net = Front() if STAGE == 0 else Back()
opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
reducer = nn.DistributedGradReducer(opt.parameters, mean=True, degree=2, group=DP_GROUP)
hand_over = ops.AllReduce(group=PP_GROUP)
loss_fn = nn.MSELoss()

if STAGE == 0:
    def surrogate(x, dh):  # d(sum(h * dh))/dw is the gradient stage 1 sends back
        return (net(x) * dh).sum()
    grad_fn = ms.value_and_grad(surrogate, None, opt.parameters)
else:
    def forward(h, y):
        return loss_fn(net(h), y)
    grad_fn = ms.value_and_grad(forward, 0, opt.parameters)

for step in range(STEPS):
    if RANK == FRANK and step == FSTEP:
        if KIND == "nudge":
            w = net.dense.weight
            w.set_data(ms.Tensor(w.asnumpy() + 1e-3))
        elif KIND == "exit":
            print(f"rank {RANK}: leaving before step {step}", flush=True)
            os._exit(3)
    x, y = batch(step)
    zeros = ops.zeros((BATCH, HIDDEN), ms.float32)
    if STAGE == 0:
        h = hand_over(net(x))  # forward: stage 1 adds zeros
        dh = hand_over(zeros)  # backward: stage 1's gradient comes back
        _, grads = grad_fn(x, dh)
        what = f"sent {float(h.abs().mean().asnumpy()):.6f}"
    else:
        h = hand_over(zeros)  # stage 0's activation arrives
        loss, (dh, grads) = grad_fn(h, y)
        hand_over(dh)  # stage 0 adds zeros
        what = f"loss {float(loss.asnumpy()):.6f}"
    if RANK == FRANK and step == FSTEP and KIND == "scale_grad":
        grads = tuple(g * 50.0 for g in grads)
    opt(reducer(grads))
    print(f"rank {RANK} stage {STAGE} step {step} {what}", flush=True)
print(f"rank {RANK} finished", flush=True)
sys.exit(0)
