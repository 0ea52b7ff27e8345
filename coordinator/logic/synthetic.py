"""Synthetic, realistic clean training statistics, for the soak test and benchmarks.

Models what the probe streams from a data-parallel job: parameters (PARAM, identical
on every rank, checksummed), activation norms (FORWARD), the local loss (LOSS), local
and reduced gradient norms (GRAD_LOCAL / GRAD_REDUCED). Curves follow a training run:
loss decays exponentially towards a floor with a linear LR warm-up then cosine decay;
gradient norms are large early, shrink after warm-up and drift up slowly as the LR
decays. Noise is what makes ranks differ legitimately: a per-step factor shared by every
rank (some global batches are harder), per-rank micro-batch noise with heavy (Student
t) tails, and a small persistent per-rank offset (data shards differ). Faults are
injected by the tests on the returned batches, not here.
"""
from __future__ import annotations

import zlib

import numpy as np

from rankscope.wire.records import Kind, StepBatch


class SyntheticTraining:
    def __init__(self, ranks: int = 8, tensors: int = 32, *, seed: int = 0, job: str = "synth",
                 total_steps: int = 10_000, warmup: int = 200, loss_noise: float = 0.08,
                 grad_noise: float = 0.12, act_noise: float = 0.03, common_noise: float = 0.15,
                 tail_df: float = 4.0, first_rank: int = 0) -> None:
        if tensors < 5:
            raise ValueError(f"tensors: need at least 5, got {tensors}")
        self.ranks, self.job, self.rng = ranks, job, np.random.default_rng(seed)
        self.rank_ids = np.arange(first_rank, first_rank + ranks)
        self.total, self.warmup = total_steps, warmup
        self.loss_noise, self.grad_noise, self.act_noise = loss_noise, grad_noise, act_noise
        self.common_noise, self.df = common_noise, tail_df
        p = (tensors - 1) // 4
        f = tensors - 1 - 3 * p
        self.n_params, self.n_act = p, f
        # Execution order of one step: params at step start, forward, loss, backward grads, reduced grads.
        self.names = ([f"Sentinel.param.layer{i}.weight" for i in range(p)]
                      + [f"Cell.layer{i}.Dense.forward.0.output.0" for i in range(f)]
                      + ["Sentinel.loss"]
                      + [f"Sentinel.grad_local.layer{i}.weight" for i in range(p)]
                      + [f"Sentinel.grad_reduced.layer{i}.weight" for i in range(p)])
        self.kinds = np.array([Kind.PARAM] * p + [Kind.FORWARD] * f + [Kind.LOSS]
                              + [Kind.GRAD_LOCAL] * p + [Kind.GRAD_REDUCED] * p, np.uint8)
        self.tensors = len(self.names)
        self.param_norm = self.rng.uniform(5, 50, p)
        self.param_size = self.rng.integers(1_000, 1_000_000, p)
        self.grad_scale = self.rng.uniform(0.05, 2.0, p)
        self.act_norm = self.rng.uniform(10, 500, f)
        self.rank_offset = self.rng.normal(0, 0.03, ranks)  # persistent shard difference
        self._sent_names: set[int] = set()

    def lr(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        frac = (step - self.warmup) / max(1, self.total - self.warmup)
        return 0.05 + 0.95 * 0.5 * (1 + np.cos(np.pi * min(frac, 1.0)))

    def _t(self, shape: tuple[int, ...]) -> np.ndarray:
        # Student t scaled to unit-ish spread, clipped: heavy tails, no impossible values.
        return np.clip(self.rng.standard_t(self.df, shape) / np.sqrt(self.df / (self.df - 2)), -8, 8)

    def arrays(self, step: int) -> dict[str, np.ndarray]:
        """(ranks, tensors) columns for one step, before splitting per rank."""
        r, p, f = self.ranks, self.n_params, self.n_act
        lr = self.lr(step)
        common = self.common_noise * self._t(())
        loss_curve = 0.3 + 2.2 * np.exp(-step / (self.total / 6)) + 0.5 * np.exp(-step / 50)
        loss = loss_curve * np.exp(common + self.rank_offset + self.loss_noise * self._t((r,)))
        g_level = self.grad_scale * (1.0 + 3.0 * np.exp(-step / 100)) * (1.2 - 0.4 * lr)
        g_local = g_level[None, :] * np.exp(common + self.rank_offset[:, None] + self.grad_noise * self._t((r, p)))
        g_red = np.repeat((g_level * np.exp(common) / np.sqrt(max(r, 1)) * 1.1)[None, :], r, axis=0)
        pnorm = self.param_norm * (1 + 0.2 * step / self.total)
        act = self.act_norm[None, :] * np.exp(0.1 * common + self.act_noise * self._t((r, f)))
        norm = np.concatenate([np.repeat(pnorm[None, :], r, 0), act, loss[:, None], g_local, g_red], axis=1)
        size = np.concatenate([self.param_size, np.full(f, 4096), [1], self.param_size, self.param_size])
        rms = norm / np.sqrt(size)[None, :]
        stats = np.empty((r, self.tensors, 4))
        stats[:, :, 0] = 3.5 * rms
        stats[:, :, 1] = -3.5 * rms
        stats[:, :, 2] = 0.01 * rms
        stats[:, :, 3] = norm
        li = p + f  # the loss is a scalar: Max = Min = Mean = value, Norm = |value|
        stats[:, li, :3] = loss[:, None]
        # Replicated records are bit-identical across ranks, checksums included.
        crc = np.full((r, self.tensors), -1, np.int64)
        for i in list(range(p)) + list(range(p + f + 1 + p, self.tensors)):
            crc[:, i] = zlib.crc32(f"{step}:{i}:{stats[0, i, 3]!r}".encode())
        return {"stats": stats, "crc": crc, "numel": np.repeat(size[None, :].astype(np.int64), r, 0)}

    def batches(self, step: int, arrays: dict[str, np.ndarray] | None = None) -> list[StepBatch]:
        a = self.arrays(step) if arrays is None else arrays
        ids = np.arange(self.tensors, dtype=np.uint32)
        zeros = np.zeros(self.tensors, np.int64)
        out = []
        for i, rank in enumerate(self.rank_ids):
            new = {} if i in self._sent_names else dict(enumerate(self.names))
            self._sent_names.add(i)
            out.append(StepBatch(
                job=self.job, rank=int(rank), step=step, name_ids=ids, kinds=self.kinds,
                exec_index=ids.copy(), stats=np.ascontiguousarray(a["stats"][i]), nan_count=zeros.copy(),
                inf_count=zeros.copy(), numel=np.ascontiguousarray(a["numel"][i]),
                crc32=np.ascontiguousarray(a["crc"][i]), new_names=new,
            ))
        return out

    def column(self, prefix: str) -> int:
        """Index of the first tensor whose name starts with ``prefix`` (for fault injection)."""
        return next(i for i, n in enumerate(self.names) if n.startswith(prefix))
