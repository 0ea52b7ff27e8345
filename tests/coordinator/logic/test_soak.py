"""Zero false alarms: long clean soaks with default thresholds raise nothing.

Two sources of clean data: (1) SyntheticTraining, many ranks and thousands of steps of
noisy but healthy curves (warm-up, LR decay, heavy-tailed micro-batch noise, per-rank
shard offsets), in a quiet and a noisy regime and for 1/3/256-rank groups; (2) a real
data-parallel training run of a small NumPy MLP (8 ranks, each its own micro-batches
of a noisy 10-class problem, gradients averaged like AllReduce, Adam), its statistics
taken the way the probe takes them (Max/Min/Mean/Norm, CRC-32 of the raw bytes). Each
soak then gets one real fault, to show the detectors were awake the whole time.
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest
from logic_helpers import FakeClock, feed_step
from repo_paths import DATA

from rankscope.coordinator.logic.core import CoordinatorCore
from rankscope.coordinator.logic.synthetic import SyntheticTraining
from rankscope.wire.records import Kind, NameTable, StepBatchBuilder


def _soak(sim: SyntheticTraining, steps: int, fault=None):
    clock = FakeClock()
    core = CoordinatorCore({}, clock=clock)
    for r in sim.rank_ids:
        core.on_register(sim.job, int(r), {"world_size": sim.ranks})
    found = []
    for step in range(steps):
        batches = sim.batches(step)
        if fault is not None:
            fault(step, batches)
        found += feed_step(core, clock, batches, dt=0.05)
    assert core.status()["counters"]["steps_judged"] == steps
    return found


@pytest.mark.parametrize("ranks, tensors, steps, noise", [
    (64, 32, 1500, "quiet"),
    (16, 32, 2000, "noisy"),
    (256, 64, 150, "quiet"),
    (4, 32, 2000, "noisy"),
    (1, 16, 1500, "quiet"),
])
def test_clean_synthetic_soak_raises_nothing(ranks, tensors, steps, noise) -> None:
    kw = {"loss_noise": 0.15, "grad_noise": 0.2, "tail_df": 5.0} if noise == "noisy" else {}
    sim = SyntheticTraining(ranks=ranks, tensors=tensors, seed=ranks * 7 + steps, total_steps=steps, **kw)
    assert _soak(sim, steps) == []


@pytest.mark.parametrize("noise, factor", [("quiet", 10.0), ("noisy", 20.0)])
def test_the_same_soak_still_catches_a_late_fault(noise, factor) -> None:
    kw = {"loss_noise": 0.15, "grad_noise": 0.2, "tail_df": 5.0} if noise == "noisy" else {}
    sim = SyntheticTraining(ranks=16, tensors=32, seed=99, total_steps=1000, **kw)
    li = sim.column("Sentinel.loss")

    def fault(step, batches):
        if step == 900:
            batches[11].stats[li] *= factor

    found = _soak(sim, 1000, fault)
    assert [(v.detector, v.rank, v.step, v.tensor) for v in found] == [("outlier", 11, 900, "Sentinel.loss")]


# --- a real data-parallel run ------------------------------------------------------------

def _stats(a: np.ndarray) -> tuple[float, float, float, float]:
    return float(a.max()), float(a.min()), float(a.mean()), float(np.linalg.norm(a))


class DataParallelMLP:
    """8 replicas of a 3-layer tanh MLP trained with averaged gradients (AllReduce) and Adam."""

    def __init__(self, ranks: int = 8, batch: int = 16, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.rng, self.ranks, self.batch = rng, ranks, batch
        self.centers = rng.normal(0, 1.0, (10, 32))
        sizes = [32, 64, 64, 10]
        self.params = {}
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            self.params[f"layer{i}.weight"] = (rng.normal(0, 1, (a, b)) / np.sqrt(a)).astype(np.float32)
            self.params[f"layer{i}.bias"] = np.zeros(b, np.float32)
        self.m = {k: np.zeros_like(v) for k, v in self.params.items()}
        self.v = {k: np.zeros_like(v) for k, v in self.params.items()}
        self.tables = [NameTable() for _ in range(ranks)]

    def _data(self):
        y = self.rng.integers(0, 10, self.batch)
        x = self.centers[y] + self.rng.normal(0, 1.2, (self.batch, 32))
        flip = self.rng.random(self.batch) < 0.05  # label noise: heavy-tailed per-batch loss
        y = np.where(flip, self.rng.integers(0, 10, self.batch), y)
        return x.astype(np.float32), y

    def _local(self, x, y):
        p, acts, h = self.params, [], x
        for i in range(3):
            z = h @ p[f"layer{i}.weight"] + p[f"layer{i}.bias"]
            h = np.tanh(z) if i < 2 else z
            acts.append((f"Cell.layer{i}.Dense.forward.0.output.0", h))
        logits = h - h.max(axis=1, keepdims=True)
        prob = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
        loss = float(-np.log(prob[np.arange(len(y)), y] + 1e-12).mean())
        d = prob
        d[np.arange(len(y)), y] -= 1
        d /= len(y)
        grads, hs = {}, [x] + [a for _, a in acts]
        for i in (2, 1, 0):
            grads[f"layer{i}.weight"] = hs[i].T @ d
            grads[f"layer{i}.bias"] = d.sum(axis=0)
            if i:
                d = (d @ p[f"layer{i}.weight"].T) * (1 - hs[i] ** 2)
        return loss, acts, {k: g.astype(np.float32) for k, g in grads.items()}

    def step(self, step: int, job: str = "mlp") -> list:
        lr = 3e-3 * min(1.0, (step + 1) / 50) * (0.5 * (1 + np.cos(np.pi * step / 600)))
        builders = [StepBatchBuilder(t) for t in self.tables]
        for bld in builders:  # parameters at step start: identical on every replica
            for k, w in self.params.items():
                bld.add(f"Sentinel.param.{k}", Kind.PARAM, _stats(w), numel=w.size, crc=zlib.crc32(w.tobytes()))
        local = []
        for bld in builders:
            loss, acts, grads = self._local(*self._data())
            for name, a in acts:
                bld.add(name, Kind.FORWARD, _stats(a), numel=a.size)
            bld.add("Sentinel.loss", Kind.LOSS, (loss, loss, loss, abs(loss)), numel=1)
            for k, g in grads.items():
                bld.add(f"Sentinel.grad_local.{k}", Kind.GRAD_LOCAL, _stats(g), numel=g.size)
            local.append(grads)
        reduced = {k: (np.sum([g[k] for g in local], axis=0) / self.ranks).astype(np.float32) for k in local[0]}
        for bld in builders:
            for k, g in reduced.items():
                bld.add(f"Sentinel.grad_reduced.{k}", Kind.GRAD_REDUCED, _stats(g), numel=g.size,
                        crc=zlib.crc32(g.tobytes()))
        batches = [bld.build(job, r, step) for r, bld in enumerate(builders)]
        for k, g in reduced.items():  # Adam, the same update on every replica
            self.m[k] = 0.9 * self.m[k] + 0.1 * g
            self.v[k] = 0.999 * self.v[k] + 0.001 * g * g
            mh, vh = self.m[k] / (1 - 0.9 ** (step + 1)), self.v[k] / (1 - 0.999 ** (step + 1))
            self.params[k] = (self.params[k] - lr * mh / (np.sqrt(vh) + 1e-8)).astype(np.float32)
        return batches


def _train(steps: int, fault_step: int | None = None):
    mlp = DataParallelMLP()
    clock = FakeClock()
    core = CoordinatorCore({}, clock=clock)
    for r in range(mlp.ranks):
        core.on_register("mlp", r, {"world_size": mlp.ranks})
    found, first_loss, last_loss = [], None, None
    for step in range(steps):
        batches = mlp.step(step)
        li = 9  # 6 params, 3 activations, then the loss
        loss = float(np.mean([b.stats[li, 2] for b in batches]))
        first_loss = loss if first_loss is None else first_loss
        last_loss = loss
        if step == fault_step:  # silent data corruption: one bit of rank 5's layer1.weight copy
            batches[5].crc32[2] ^= 1 << 7
        found += feed_step(core, clock, batches)
    return found, first_loss, last_loss


def test_real_data_parallel_training_raises_nothing_then_catches_a_corrupted_replica() -> None:
    found, first, last = _train(400)
    assert last < 0.7 * first  # it really trained
    assert found == []
    found, _, _ = _train(200, fault_step=150)
    assert [(v.detector, v.rank, v.step, v.tensor) for v in found] == [
        ("replica", 5, 150, "Sentinel.param.layer1.weight")]


# --- real statistics from a real msrun job ------------------------------------------------

def test_real_msrun_statistics_clean_steps_raise_nothing_and_the_nan_origin_is_named() -> None:
    """4-rank MindSpore CPU DP job (tests/data/msrun_dp4_nan_rank2_step3/README.md)."""

    from rankscope.rdr.steps_file import load_steps

    root = DATA / "msrun_dp4_nan_rank2_step3"
    ranks = [load_steps((root / f"rank_{r}.msgpack").read_bytes()) for r in range(4)]
    clock = FakeClock()
    core = CoordinatorCore({}, clock=clock)
    job = ranks[0][0][0].job
    for r in range(4):
        core.on_register(job, r, {"world_size": 4})
    found_by_step = {}
    for step in range(5):
        batches = []
        for batches_of_rank, names in ranks:
            [b] = [b for b in batches_of_rank if b.step == step]
            if step == 0:
                b.new_names = dict(names)  # the ring kept the name table apart from the batches
            batches.append(b)
        found_by_step[step] = feed_step(core, clock, batches)
        if step == 0:
            view_kinds = set(core.aligner.keys[job].kind[: len(core.aligner.keys[job])].tolist())
            assert {2, 3, 4, 5} <= view_kinds  # params, local and reduced grads, loss were all compared
    assert found_by_step[0] == found_by_step[1] == found_by_step[2] == []
    [v] = found_by_step[3]
    assert (v.detector, v.rank, v.step, v.ties) == ("nan_origin", 2, 3, [])
    assert v.tensor.startswith("Cell.fc1.") and v.kind == "forward"
