"""A data-parallel job in the high-level style: Model.train over a GeneratorDataset, with
faults injected from callbacks and the loss, the way a stranger's job would fail.

CRASH_FAULT=kind:rank:step (step counted from 0):
  exit137  os._exit(137) as the step begins (before its forward)
  kill     SIGKILL from inside the forward pass (mid-step, before the gradient AllReduce)
  raise    an uncaught exception as the step begins
  stop     SIGSTOP as the step begins: the others wait in the gradient AllReduce
  sleep    a long sleep as the step begins (a stuck data loader, a deadlock)
CRASH_STEPS (default 10). Knows nothing about rankscope.
"""
import os
import signal
import time

import mindspore as ms
import numpy as np
from mindspore import nn
from mindspore.communication import get_group_size, get_rank, init
from mindspore.context import ParallelMode
from mindspore.train import Callback, Model

ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_device("CPU")
init()
RANK, WORLD = get_rank(), get_group_size()
ms.set_auto_parallel_context(parallel_mode=ParallelMode.DATA_PARALLEL, gradients_mean=True)
ms.set_seed(5)

spec = os.environ.get("CRASH_FAULT", "")
KIND, FRANK, FSTEP = (spec.split(":")[0], int(spec.split(":")[1]), int(spec.split(":")[2])) if spec else ("", -1, -1)
STEPS = int(os.environ.get("CRASH_STEPS", "10"))
state = {"step": 0}


class Regressor(nn.Cell):
    def __init__(self):
        super().__init__()
        self.body = nn.SequentialCell([nn.Dense(12, 24), nn.Tanh(), nn.Dense(24, 24), nn.Tanh()])
        self.out = nn.Dense(24, 1)

    def construct(self, x):
        if KIND == "kill" and RANK == FRANK and state["step"] == FSTEP:
            os.kill(os.getpid(), signal.SIGKILL)
        return self.out(self.body(x))


class Faults(Callback):
    def on_train_step_begin(self, run_context):
        state["step"] = run_context.original_args().cur_step_num - 1
        if RANK != FRANK or state["step"] != FSTEP:
            return
        if KIND == "exit137":
            os._exit(137)
        if KIND == "raise":
            raise ValueError(f"corrupt record in shard {RANK} at step {FSTEP}")
        if KIND == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        if KIND == "sleep":
            time.sleep(600)


def samples():
    rs = np.random.RandomState(100 + RANK)
    w = np.linspace(-1, 1, 12).astype(np.float32)
    for _ in range(STEPS * 8):
        x = rs.randn(12).astype(np.float32)
        yield x, np.array([x @ w], np.float32)


data = ms.dataset.GeneratorDataset(samples, ["x", "y"], shuffle=False).batch(8)
net = Regressor()
model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=0.05))
model.train(1, data, callbacks=[Faults()], dataset_sink_mode=False)
print(f"rank {RANK} done", flush=True)
