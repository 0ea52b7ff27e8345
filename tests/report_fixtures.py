"""Incident folders for the report tests, made by the real coordinator logic in-process.

Real statistics of a 4-rank msrun MindSpore job (tests/data/msrun_dp4_nan_rank2_step3,
steps 0-4) are replayed through CoordinatorCore and the ActionPerformer that writes
incident.json, history.json and report.html in the service; one fault kind per folder,
injected into the recorded columns as the demo's faults change them:

- ``nan``: as recorded (a NaN in rank 2's batch at step 3);
- ``outlier``: rank 1's local gradients x50 at step 2 (the demo's scale_grad);
- ``replica``: rank 3's fc2 weight nudged at step 2 (perturb_weight: checksum and Norm differ);
- ``lost``: rank 2 killed by SIGKILL in step 2, the others taken down 0.25 s later.

The rank bundles and worker logs are small stand-ins (the pages link to them); the
msProbe construct.json / stack.json are a real run's.
"""
from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import numpy as np
from logic_helpers import FakeClock
from repo_paths import DATA

from rankscope.coordinator.logic.core import CoordinatorCore
from rankscope.coordinator.server.actions import ActionPerformer
from rankscope.rdr.steps_file import load_steps
from rankscope.wire.records import Kind

RECORDED = DATA / "msrun_dp4_nan_rank2_step3"
KINDS = ("nan", "outlier", "replica", "lost")
#: (detector, rank, step) each fault must be named as.
EXPECTED = {"nan": ("nan_origin", 2, 3), "outlier": ("outlier", 1, 2), "replica": ("replica", 3, 2),
            "lost": ("progress", 2, 2)}
WALL0 = 1_795_400_000.0


def _recorded() -> list[tuple[list, dict]]:
    return [load_steps((RECORDED / f"rank_{r}.msgpack").read_bytes()) for r in range(4)]


def _fault(kind: str, step: int, rank: int, b, names: dict[int, str]) -> None:
    if kind == "outlier" and step == 2 and rank == 1:
        local = b.kinds == int(Kind.GRAD_LOCAL)
        b.stats[local] *= 50.0
    if kind == "replica" and step == 2 and rank == 3:
        col = [i for i, n in enumerate(b.name_ids) if names[int(n)] == "Sentinel.param.fc2.weight"][0]
        b.stats[col, 3] *= 1.0 + 1e-6
        b.stats[col, 2] += 1e-3
        b.crc32[col] ^= 0x5A5A


def _stand_ins(export: Path, incident: Path, ranks: int) -> None:
    dump = export / "local_dump"
    for r in range(ranks):
        rdr = incident / f"rank_{r}" / "rdr"
        rdr.mkdir(parents=True, exist_ok=True)
        (rdr / "config.json").write_text(json.dumps({"task": "statistics", "level": "L0",
                                                     "dump_path": str(dump), "step": [], "rank": []}))
        (rdr / "versions.json").write_text(json.dumps({"python": "3.11.7 (main)", "platform": "Linux-x86_64",
                                                       "packages": {"mindspore": "2.10.0"}}))
        (rdr / "environment.json").write_text(json.dumps({"variables": {
            "MS_WORKER_NUM": "4", "MS_NODE_ID": str(r), "RANK_ID": str(r), "SECRET_TOKEN": "do-not-show"}}))
        (rdr / "manifest.json").write_text(json.dumps({"complete": True, "files": [
            {"path": p} for p in ("config.json", "versions.json", "environment.json")]}))
        logs = export / "msrun_logs"
        logs.mkdir(exist_ok=True)
        (logs / f"worker_{r}.log").write_text(f"worker {r} log\n")
    for s in range(5):
        d = dump / f"step{s}" / "rank2"
        d.mkdir(parents=True, exist_ok=True)
        for f in ("construct.json", "stack.json"):
            shutil.copy(RECORDED / "dump" / f, d / f)


def make_incident(kind: str, export: Path) -> Path:
    """Run the recorded job with ``kind`` injected; return the written incident folder."""
    clock, wall = FakeClock(100.0), FakeClock(WALL0)
    core = CoordinatorCore({"on_divergence": "terminate", "export_timeout_s": 5.0, "pause_timeout_s": 2.0},
                           clock=clock, export_dir=export, wall_clock=wall)
    perf = ActionPerformer(core, export, send_control=lambda *a, **k: 1)
    recorded = _recorded()
    job = recorded[0][0][0].job
    for r in range(4):
        core.on_register(job, r, {"world_size": 4, "pid": 1000 + r})

    def tick(dt: float = 0.2) -> None:
        clock.advance(dt)
        wall.advance(dt)
        core.tick()
        perf.run()

    last = 2 if kind in ("outlier", "replica", "lost") else 4
    for step in range(last + 1):
        for r, (batches, names) in enumerate(recorded):
            if kind == "lost" and step == last and r == 2:
                continue  # killed in this step, before its records were sent
            [b] = [b for b in batches if b.step == step]
            if step == 0:
                b.new_names = dict(names)
            _fault(kind, step, r, b, names)
            core.on_step(b)
        tick()
        for r in range(4):
            if not (kind == "lost" and step == last and r == 2):
                core.on_heartbeat(job, r, step, "running")
    if kind == "lost":
        t0 = wall.t
        core.on_rank_lost(job, 2, last - 1, -9, "exited", died_at=t0, signal=int(signal.SIGKILL))
        for r in (0, 1, 3):
            core.on_rank_lost(job, r, last, -9, "exited", died_at=t0 + 0.25, signal=int(signal.SIGKILL))
        tick(1.0)
    [inc] = core.incidents()
    incident = export / "incidents" / inc["incident_id"]
    _stand_ins(export, incident, 4)
    for r in range(4):
        core.on_bundle(inc["incident_id"], r, str(incident / f"rank_{r}"))
    for _ in range(60):  # paused/exported by the policy's timeouts (no ranks answer here)
        tick(1.0)
        if (incident / "incident.json").is_file() and (incident / "report.html").is_file():
            break
    perf.flush()
    perf.close()
    assert (incident / "report.html").is_file(), f"{kind}: no report was written"
    return incident


def incident_json(d: Path) -> dict:
    return json.loads((d / "incident.json").read_text())


def finite(values) -> list[float]:
    return [float(v) for v in values if isinstance(v, (int, float)) and np.isfinite(v)]
