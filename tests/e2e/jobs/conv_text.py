"""A small text classifier trained data-parallel the way a stranger might write it:
an embedding, a 1-D convolution and max-pooling, a TrainOneStepCell subclass whose
construct does the backward, an optional gradient tweak and the reduction, and
Momentum as the optimizer. PyNative, a hand loop over synthetic token batches.

TEXT_FAULT=grads:RANK:STEP multiplies that rank's own gradients by TEXT_FAULT_SCALE
(default 50) at that step (counted from 0), before the AllReduce, as a bad loss scale
would. TEXT_STEPS (default 9). Knows nothing about rankscope.
"""
import os

import mindspore as ms
import numpy as np
from mindspore import nn, ops
from mindspore.communication import get_group_size, get_rank, init
from mindspore.context import ParallelMode

VOCAB, DIM, SEQ, CLASSES, BATCH = 50, 12, 10, 3, 8

ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_device("CPU")
init()
RANK, WORLD = get_rank(), get_group_size()
ms.set_auto_parallel_context(parallel_mode=ParallelMode.DATA_PARALLEL, gradients_mean=True)
ms.set_seed(3)


class TextCNN(nn.Cell):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.conv = nn.Conv1d(DIM, 16, 3, pad_mode="same", has_bias=True)
        self.act = nn.Tanh()
        self.out = nn.Dense(16, CLASSES)

    def construct(self, tokens):
        h = self.embed(tokens).transpose(0, 2, 1)      # (B, DIM, SEQ)
        h = self.act(self.conv(h)).max(axis=2)         # (B, 16)
        return self.out(h)


class StepWithTweak(nn.TrainOneStepCell):
    """One training step; ``scale`` multiplies this rank's gradients before reduction."""

    def __init__(self, net, opt):
        super().__init__(net, opt)
        self.scale = 1.0

    def construct(self, *inputs):
        loss = self.network(*inputs)
        sens = ops.fill(loss.dtype, loss.shape, self.sens)  # the grad operation takes sens last
        grads = self.grad(self.network, self.weights)(*inputs, sens)
        if self.scale != 1.0:
            grads = tuple(g * self.scale for g in grads)
        grads = self.grad_reducer(grads)
        self.optimizer(grads)
        return loss


def main():
    fault = os.environ.get("TEXT_FAULT", "")
    kind, f_rank, f_step = (fault.split(":") + ["", "-1", "-1"])[:3] if fault else ("", "-1", "-1")
    scale = float(os.environ.get("TEXT_FAULT_SCALE", "50"))
    net = TextCNN()
    loss = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    step_cell = StepWithTweak(loss, nn.Momentum(net.trainable_params(), 0.05, 0.9))
    step_cell.set_train()
    rng = np.random.default_rng(100 + RANK)
    for step in range(int(os.environ.get("TEXT_STEPS", "9"))):
        tokens = rng.integers(0, VOCAB, size=(BATCH, SEQ)).astype(np.int32)
        labels = (tokens[:, 0] % CLASSES).astype(np.int32)
        step_cell.scale = scale if (kind == "grads" and int(f_rank) == RANK and int(f_step) == step) else 1.0
        value = step_cell(ms.Tensor(tokens), ms.Tensor(labels))
        print(f"[text {RANK}/{WORLD}] step {step} loss {float(value.asnumpy()):.5f}", flush=True)


if __name__ == "__main__":
    main()
