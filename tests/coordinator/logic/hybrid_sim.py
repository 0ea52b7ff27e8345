"""Clean statistics of a data x tensor parallel job, as its ranks would stream them.

Rank ``r`` is shard ``r % tp`` of data replica ``r // tp`` (Megatron's numbering). The
shards of one weight differ (their own CRC per shard); replicas of a shard hold the same
parameters and reduced gradients; both shards of a replica read the same batch, so their
loss is the same; each rank's tensor-parallel AllReduce hands its replica's shards one
output. Every parameter is recorded at the step's start and after the update
(``Sentinel.param_end``, equal to the next start). Tests inject faults on the batches.
``norm``: a LayerNorm weight every rank holds whole (``Sentinel.param.norm.gamma``), the
same on every rank, last in the batch.
"""
from __future__ import annotations

import zlib

import numpy as np

from rankscope.wire.records import NO_CRC, Kind, StepBatch


def tp_facts(rank: int, tp: int = 2, dp: int = 2) -> dict:
    """What a rank of this job says of its layout (wire.layout_facts)."""
    d, t = rank // tp, rank % tp
    return {"mindspore_rank": rank, "world": tp * dp, "world_group": "mccl_world_group",
            "groups": {f"tp_{d}": [d * tp + x for x in range(tp)], f"dp_{t}": [x * tp + t for x in range(dp)]},
            "reducers": [f"dp_{t}"], "collectives": [["AllReduce", f"tp_{d}"]], "params": "fc:(8, 16)"}


class HybridTraining:
    def __init__(self, tp: int = 2, dp: int = 2, params: int = 3, seed: int = 0, job: str = "hybrid",
                 norm: bool = False) -> None:
        self.tp, self.dp, self.p, self.job = tp, dp, params, job
        self.rng = np.random.default_rng(seed)
        self.ranks = tp * dp
        p = params
        self.names = ([f"Sentinel.param.fc{i}.weight" for i in range(p)]
                      + [f"Cell.fc{i}.Dense.forward.0.output.0" for i in range(p)]
                      + ["Sentinel.collective.tp_{d}.AllReduce.0.input.0", "Sentinel.collective.tp_{d}.AllReduce.0.output.0",
                         "Sentinel.loss"]
                      + [f"Sentinel.grad_local.fc{i}.weight" for i in range(p)]
                      + [f"Sentinel.grad_reduced.fc{i}.weight" for i in range(p)]
                      + [f"Sentinel.param_end.fc{i}.weight" for i in range(p)])
        self.kinds = np.array([Kind.PARAM] * p + [Kind.FORWARD] * (p + 2) + [Kind.LOSS] + [Kind.GRAD_LOCAL] * p
                              + [Kind.GRAD_REDUCED] * p + [Kind.PARAM] * p, np.uint8)
        if norm:
            self.names.append("Sentinel.param.norm.gamma")
            self.kinds = np.append(self.kinds, np.uint8(Kind.PARAM))
        self.norm = norm
        self.shard_level = self.rng.uniform(0.5, 2.0, (tp, p))
        self._sent: set[int] = set()

    def col(self, prefix: str) -> int:
        return next(i for i, n in enumerate(self.names) if n.startswith(prefix))

    def _param(self, step: int, t: int, i: int) -> tuple[float, int]:
        norm = 10.0 + t + i + 0.01 * step
        return norm, zlib.crc32(f"p{step}:{t}:{i}".encode())

    def batches(self, step: int) -> list[StepBatch]:
        p, tp = self.p, self.tp
        common = 0.15 * self.rng.standard_normal()
        data = 0.1 * self.rng.standard_normal(self.dp)  # each replica's batch
        out = []
        n = len(self.names)
        for r in range(self.ranks):
            d, t = r // tp, r % tp
            norm = np.empty(n)
            crc = np.full(n, NO_CRC, np.int64)
            for i in range(p):
                norm[i], crc[i] = self._param(step, t, i)
                norm[4 * p + 3 + i], crc[4 * p + 3 + i] = self._param(step + 1, t, i)  # after the update
                norm[p + i] = 100.0 * np.exp(common + data[d] + 0.02 * self.rng.standard_normal())
                g = self.shard_level[t, i] * np.exp(common + data[d] + 0.05 * self.rng.standard_normal())
                norm[2 * p + 3 + i] = g
                norm[3 * p + 3 + i] = self.shard_level[t, i] * np.exp(common)  # reduced: per shard
                crc[3 * p + 3 + i] = zlib.crc32(f"g{step}:{t}:{i}".encode())
            norm[2 * p] = 50.0 * np.exp(common + 0.1 * self.rng.standard_normal())  # this shard's partial sum
            norm[2 * p + 1] = 80.0 * np.exp(common + data[d])  # the replica's reduced activation
            crc[2 * p + 1] = zlib.crc32(f"a{step}:{d}".encode())
            norm[2 * p + 2] = np.exp(-step / 50 + common + data[d])  # the replica's loss
            if self.norm:
                norm[-1], crc[-1] = 4.0 + 0.001 * step, zlib.crc32(f"norm{step}".encode())
            stats = np.stack([norm * 0.1, -norm * 0.1, norm * 0.001, norm], axis=1)
            stats[2 * p + 2, :3] = norm[2 * p + 2]
            names = [nm.replace("{d}", str(d)) for nm in self.names]
            first = r not in self._sent
            self._sent.add(r)
            ids = np.arange(n, dtype=np.uint32)
            out.append(StepBatch(job=self.job, rank=r, step=step, name_ids=ids, kinds=self.kinds, exec_index=ids.copy(),
                                 stats=stats, nan_count=np.zeros(n, np.int64), inf_count=np.zeros(n, np.int64),
                                 numel=np.full(n, 128, np.int64), crc32=crc,
                                 new_names=dict(enumerate(names)) if first else {}))
        return out
