"""Parts of a packed frame (wire.step_pack) are aligned exactly as the same batches sent one
by one: the aligner writes runs of packed parts in one go, and must never write a row or
column differently from the one-by-one path, whatever the layouts in the pack."""
from __future__ import annotations

import dataclasses
import random

import numpy as np
from logic_helpers import FakeClock

from rankscope.coordinator.logic.core import CoordinatorCore
from rankscope.coordinator.server.ingest_load import simulated_batch
from rankscope.wire import protocol
from rankscope.wire.columns import STEP_COLUMNS
from rankscope.wire.step_pack import StepPack, pack_message

SLOT_ARRAYS = ("reported", "token", "present", "exec", "stats", "nan", "inf", "numel", "crc")


def _odd(b, rank: int, rng: random.Random):
    """Layouts a real job produces besides the usual one, so a pack mixes them."""
    what = rng.choice(["same"] * 30 + ["reversed", "fewer", "unknown_id", "empty", "token"])
    if what == "reversed":  # the same names in another order: a scatter, not a slice
        idx = np.arange(len(b))[::-1]
    elif what == "fewer":
        idx = np.arange(len(b) - 3)
    elif what == "unknown_id":  # an id whose name the coordinator never got
        b = dataclasses.replace(b, name_ids=b.name_ids.copy())
        b.name_ids[2] = 999
        return b
    elif what == "empty":
        idx = np.arange(0)
    elif what == "token":
        return dataclasses.replace(b, token=rank * 3)
    else:
        return b
    arrays = {c: getattr(b, c)[idx] for c in STEP_COLUMNS}
    return dataclasses.replace(b, **arrays)


def _scenario(seed: int, ranks: int = 12, tensors: int = 9, steps: int = 5) -> list[list]:
    """Bursts of batches as a shard receives them: several steps interleaved, a rank sent
    twice, a rank late for a step already judged, a NaN."""
    rng, nrng = random.Random(seed), np.random.default_rng(seed)
    batches = []
    for s in range(steps):
        for r in range(ranks):
            b = simulated_batch("j", r, s, tensors, nrng, fault=(s == 3 and r == seed % ranks))
            if s == 0 and r == 5:  # the same ids as every rank, other names: other columns
                b = dataclasses.replace(b, new_names={i: f"{n}.own" for i, n in b.new_names.items()})
            batches.append(b if s == 0 else _odd(b, r, rng))
    batches += [batches[rng.randrange(len(batches))] for _ in range(3)]  # repeats (a rank's resend)
    head, tail = batches[:ranks], batches[ranks:]
    if seed % 2:  # steps interleaved; else in order, as a node's ranks report together
        rng.shuffle(tail)
    bursts, i = [head], 0
    while i < len(tail):
        n = rng.randint(1, 20)
        bursts.append(tail[i:i + n])
        i += n
    return bursts


def _packed(burst: list, rng: random.Random) -> list:
    """The burst as the shard's front end hands it on: one or more STEPS frames."""
    out, i = [], 0
    while i < len(burst):
        n = rng.randint(1, len(burst) - i)
        parts = [(f"rank:{b.rank}", k, b) for k, b in enumerate(burst[i:i + n])]
        pack = StepPack(protocol.Decoder(job="j").decode(protocol.encode(pack_message("j", "agent", 0, parts))))
        # Whole (a shard's front end), or part by part (parts of a replay already taken).
        if rng.random() < 0.7:
            out.append(pack)
        else:
            out += pack.batches()
        i += n
    return out


def _state(core: CoordinatorCore) -> dict:
    al = core.aligner
    slots = {(g.label, s): {a: getattr(slot, a).copy() for a in SLOT_ARRAYS}
             for g in al.groups.values() for s, slot in g.slots.items()}
    return {"slots": slots, "counters": dict(al.counters),
            "layouts": {k: r.layout is None for k, r in al.ranks.items()}}


def _same(a: dict, b: dict) -> None:
    assert a["counters"] == b["counters"] and a["layouts"] == b["layouts"]
    assert a["slots"].keys() == b["slots"].keys()
    for key, arrays in a["slots"].items():
        for name, arr in arrays.items():
            np.testing.assert_array_equal(arr, b["slots"][key][name], err_msg=f"{key} {name}")


def test_packed_parts_align_and_judge_exactly_as_batches_sent_one_by_one(monkeypatch):
    import rankscope.coordinator.logic.align.aligner as aligner
    import rankscope.coordinator.logic.align.packed_ingest as packed_ingest

    runs, singles, wholes = [], [], []
    real_run, real_write, real_whole = packed_ingest.Run.write, aligner.write_one, aligner.ingest_whole
    monkeypatch.setattr(packed_ingest.Run, "write", lambda run, *a: (runs.append(len(run.rows)), real_run(run, *a)))
    monkeypatch.setattr(aligner, "write_one", lambda *a: (singles.append(1), real_write(*a)))
    monkeypatch.setattr(aligner, "ingest_whole", lambda al, pk, now: wholes.append(ok := real_whole(al, pk, now)) or ok)
    found = []
    for seed in range(8):
        rng = random.Random(100 + seed)
        clocks = FakeClock(), FakeClock()
        cores = [CoordinatorCore({"deadline_s": 5.0}, clock=c) for c in clocks]
        for core in cores:
            for r in range(12):
                core.on_register("j", r, {"world_size": 12})
        verdicts: list[list] = [[], []]
        for burst in _scenario(seed):
            cores[0].on_steps(burst)
            cores[1].on_steps(_packed(burst, rng))
            _same(_state(cores[0]), _state(cores[1]))
            for i, (core, clock) in enumerate(zip(cores, clocks)):
                clock.advance(0.5)
                verdicts[i] += [(v.detector, v.rank, v.step, v.tensor) for v in core.tick()]
        for i, core in enumerate(cores):
            verdicts[i] += [(v.detector, v.rank, v.step, v.tensor) for v in core.drain()]
        assert verdicts[0] == verdicts[1], seed
        found += verdicts[0]
    # The scenarios reached every path: whole packs at once, packs refused as a whole (then
    # runs of several parts), parts one by one; and the planted NaNs were named.
    assert True in wholes and False in wholes and max(runs) > 1 and singles
    assert {(d, s) for d, _, s, _ in found} >= {("nan_origin", 3)}


def test_a_run_of_packed_parts_is_written_in_one_go():
    """The point of packing: R parts with one layout cost one write per column, not R."""
    core = CoordinatorCore({})
    for r in range(64):
        core.on_register("j", r, {"world_size": 64})
    nrng = np.random.default_rng(0)
    step0 = [simulated_batch("j", r, 0, 16, nrng) for r in range(64)]
    core.on_steps(step0)
    calls = []
    import rankscope.coordinator.logic.align.packed_ingest as packed_ingest
    real = packed_ingest.Run.write

    def counted(run, *a):
        calls.append(len(run.rows))
        real(run, *a)

    packed_ingest.Run.write = counted
    try:
        parts = [(f"rank:{r}", 1, simulated_batch("j", r, 1, 16, nrng)) for r in range(64)]
        msg = protocol.Decoder().decode(protocol.encode(pack_message("j", "agent", 0, parts)))
        core.on_steps([StepPack(msg)])
    finally:
        packed_ingest.Run.write = real
    assert calls == [64]
    slot = core.aligner.groups[("j", 0)].slots[1]
    assert slot.reported.all() and slot.present.all()
    np.testing.assert_array_equal(slot.stats[5], parts[5][2].stats)
