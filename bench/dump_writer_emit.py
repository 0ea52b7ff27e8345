"""Cost of DumpWriter.emit on the training thread vs msProbe's way of writing dump.json.

Baseline, measured in the same run on the same entries: what msProbe's DataWriter
does at a step end (``json.dump(..., indent=1)`` of dump.json, stack.json and
construct.json, plain writes). The probe's writer adds atomic temp+rename and
msProbe's stack grouping but encodes with one reused C encoder. Rounds alternate so
machine noise hits both alike; the figure is the ratio of medians.

    .venv/bin/python bench/dump_writer_emit.py [--entries 12,300,3000] [--steps 20] [--rounds 5]

The last line is JSON: {"entries": {"12": {"emit_ms": .., "msprobe_style_ms": .., "ratio": ..}, ...}}.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

from rankscope.dump.writer import DumpWriter, group_stacks
from rankscope.wire.records import StepBatch, StepOutput

LEAF = {"type": "mindspore.Tensor", "dtype": "Float32", "shape": [64, 256], "Max": 1.2345678,
        "Min": -1.2345, "Mean": 0.001234, "Norm": 12.345678, "nan_count": 0, "inf_count": 0}


def make_entries(n: int) -> dict:
    return {f"Cell.layer{i}.Dense.forward.0": {"input_args": [dict(LEAF)], "input_kwargs": {},
                                               "output": [dict(LEAF)],
                                               "parameters": {"weight": dict(LEAF), "bias": dict(LEAF)}}
            for i in range(n)}


def msprobe_style(root: str, step: int, entries: dict, stacks: dict, construct: dict) -> None:
    rdir = os.path.join(root, f"step{step}", "rank0")
    os.makedirs(rdir, exist_ok=True)
    doc = {"task": "statistics", "level": "L0", "framework": "mindspore", "dump_data_dir": None, "data": entries}
    for name, obj in (("dump.json", doc), ("stack.json", group_stacks(stacks)), ("construct.json", construct)):
        with open(os.path.join(rdir, name), "w") as fh:
            json.dump(obj, fh, indent=1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", default="12,300,3000")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args(argv)
    report = {}
    for n in (int(x) for x in a.entries.split(",")):
        entries = make_entries(n)
        stacks = {k: ["File \"train.py\", line 3, in step", "y = net(x)"] for k in entries}
        construct = {k: None for k in entries}
        ours, theirs = [], []
        with tempfile.TemporaryDirectory() as tmp:
            writer = DumpWriter(os.path.join(tmp, "ours"), "statistics", "L0")
            step = 0
            for _ in range(a.rounds):
                t = time.perf_counter()
                for _ in range(a.steps):
                    writer.emit(StepOutput(StepBatch.empty("bench", 0, step), "rank0", entries=entries,
                                           stacks=stacks, construct=construct))
                    step += 1
                ours.append((time.perf_counter() - t) / a.steps * 1e3)
                t = time.perf_counter()
                for s in range(a.steps):
                    msprobe_style(os.path.join(tmp, "theirs"), step + s, entries, stacks, construct)
                theirs.append((time.perf_counter() - t) / a.steps * 1e3)
            assert writer.errors == 0
        emit_ms, base_ms = statistics.median(ours), statistics.median(theirs)
        report[str(n)] = {"emit_ms": round(emit_ms, 3), "msprobe_style_ms": round(base_ms, 3),
                          "ratio": round(emit_ms / base_ms, 3)}
        print(f"{n:>5} entries: emit {emit_ms:8.3f} ms   msProbe-style {base_ms:8.3f} ms   "
              f"ratio {emit_ms / base_ms:.2f}")
    print(json.dumps({"entries": report}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
