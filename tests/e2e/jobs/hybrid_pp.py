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

PP_TIED=1 ties a word embedding across the two stages, as Megatron does: stage 0 adds a
token's embedding to its activation, stage 1 scores its activation against the same table
(a copy of it, named ``word_embeddings`` on both stages, started from one value); after the
backward each stage's gradient of the table is summed over the embedding group (the
replica's two stages, ``pp_<d>``), so both copies take the same update. PP_TIED=unsynced is
the bug every rank runs: that sum is forgotten and the copies drift apart from the first
update, while the replicas of a stage still agree.
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
VOCAB = 10
TIED = os.environ.get("PP_TIED", "")
EMBED0 = (np.random.RandomState(5).randn(VOCAB, HIDDEN) * 0.1).astype(np.float32)  # one value on both stages
ms.set_seed(21)  # the same initial weights on both replicas of a stage


def embedding_table():
    return ms.Parameter(ms.Tensor(EMBED0), name="word_embeddings") if TIED else None


class Front(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(IN, HIDDEN)
        self.word_embeddings = embedding_table()

    def construct(self, x, tok):
        h = ops.tanh(self.dense(x))
        if self.word_embeddings is not None:
            h = h + ops.gather(self.word_embeddings, tok, 0)
        return h


class Back(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(HIDDEN, OUT)
        self.word_embeddings = embedding_table()

    def construct(self, h):
        out = self.dense(h)
        if self.word_embeddings is None:
            return out, ops.zeros((), ms.float32)
        return out, 0.01 * ops.matmul(h, self.word_embeddings.T).square().mean()


def batch(step):
    rs = np.random.RandomState(50 * REPLICA + step)
    x = rs.randn(BATCH, IN).astype(np.float32)
    y = np.sin(x[:, :OUT]).astype(np.float32)
    if RANK == FRANK and step == FSTEP and KIND == "nan_batch":
        x[1, 2] = np.nan
    tok = rs.randint(0, VOCAB, BATCH).astype(np.int32)
    return ms.Tensor(x), ms.Tensor(y), ms.Tensor(tok)


net = Front() if STAGE == 0 else Back()
opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
reducer = nn.DistributedGradReducer(opt.parameters, mean=True, degree=2, group=DP_GROUP)
hand_over = ops.AllReduce(group=PP_GROUP)
loss_fn = nn.MSELoss()

if STAGE == 0:
    def surrogate(x, tok, dh):  # d(sum(h * dh))/dw is the gradient stage 1 sends back
        return (net(x, tok) * dh).sum()
    grad_fn = ms.value_and_grad(surrogate, None, opt.parameters)
else:
    def forward(h, y):
        out, tied = net(h)
        return loss_fn(out, y) + tied
    grad_fn = ms.value_and_grad(forward, 0, opt.parameters)


def sum_tied(grads):
    """The embedding group's sum of the tied table's gradient (both stages hold a copy)."""
    if TIED != "1":
        return grads
    return tuple(hand_over(g) if p.name.endswith("word_embeddings") else g for p, g in zip(opt.parameters, grads))

for step in range(STEPS):
    if RANK == FRANK and step == FSTEP:
        if KIND == "nudge":
            w = net.dense.weight
            w.set_data(ms.Tensor(w.asnumpy() + 1e-3))
        elif KIND == "exit":
            print(f"rank {RANK}: leaving before step {step}", flush=True)
            os._exit(3)
    x, y, tok = batch(step)
    zeros = ops.zeros((BATCH, HIDDEN), ms.float32)
    if STAGE == 0:
        h = hand_over(net(x, tok))  # forward: stage 1 adds zeros
        dh = hand_over(zeros)  # backward: stage 1's gradient comes back
        _, grads = grad_fn(x, tok, dh)
        what = f"sent {float(h.abs().mean().asnumpy()):.6f}"
    else:
        h = hand_over(zeros)  # stage 0's activation arrives
        loss, (dh, grads) = grad_fn(h, y)
        hand_over(dh)  # stage 0 adds zeros
        what = f"loss {float(loss.asnumpy()):.6f}"
    grads = sum_tied(grads)
    if RANK == FRANK and step == FSTEP and KIND == "scale_grad":
        grads = tuple(g * 50.0 for g in grads)
    opt(reducer(grads))
    print(f"rank {RANK} stage {STAGE} step {step} {what}", flush=True)
print(f"rank {RANK} finished", flush=True)
sys.exit(0)
