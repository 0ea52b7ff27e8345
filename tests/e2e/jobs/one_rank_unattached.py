"""A two-rank data-parallel job in the hand-written-loop style (TrainOneStepCell called
directly), where one rank's environment is wrong for rankscope: a site wrapper exports
MS_RDR_MODE=7 on rank 1 only, so that rank cannot attach and trains on unwatched.

UNATTACHED_RANK (default 1) picks the rank; STEPS (default 6). Knows nothing about rankscope.
"""
import os

if os.environ.get("RANK_ID") == os.environ.get("UNATTACHED_RANK", "1"):
    os.environ["MS_RDR_MODE"] = "7"  # before MindSpore (and so the probe) starts

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402
from mindspore import nn  # noqa: E402
from mindspore.communication import get_rank, init  # noqa: E402
from mindspore.context import ParallelMode  # noqa: E402

ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_device("CPU")
init()
ms.set_auto_parallel_context(parallel_mode=ParallelMode.DATA_PARALLEL, gradients_mean=True)
ms.set_seed(11)

net = nn.SequentialCell([nn.Dense(6, 16), nn.ReLU(), nn.Dense(16, 3)])
step_cell = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.Adam(net.trainable_params(), 1e-3))
rng = np.random.default_rng(get_rank())
for step in range(int(os.environ.get("STEPS", "6"))):
    x = ms.Tensor(rng.standard_normal((8, 6)).astype(np.float32))
    y = ms.Tensor(rng.standard_normal((8, 3)).astype(np.float32))
    loss = step_cell(x, y)
    print(f"rank {get_rank()} step {step} loss {float(loss.asnumpy()):.5f}", flush=True)
