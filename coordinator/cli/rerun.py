"""``rankscope rerun INCIDENT [-- COMMAND]``: replay the named rank's anomalous step in a
fresh process and say whether the fault is the data or the code (it comes back), that
rank's device (it does not), or a one-off (its own re-run did not reproduce it either).

The rank kept a replay record of the step when it re-ran it (the incident's
``evidence.rerun.replay``; ``--replay DIR`` for a record copied from another node). The
replay runs the job's own script, one process (``msrun`` with one worker when msrun is
on PATH, as the script may call ``init()``): rankscope attaches to it, and at the
script's first call of a gradient function over the same parameters makes the recorded
call instead, in float32 and in float64 where MindSpore can, then ends the process.
COMMAND overrides how the script is started (default: the rank's own command line).

Writes ``rerun.json`` into the incident folder and prints the classification.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rankscope.coordinator.launch.env import ATTACH_DIR
from rankscope.files import replay_files
from rankscope.wire import rerun_facts
from rankscope.wire.job_config import CONFIG_ENV, DUMP_PATH_ENV
from rankscope.wire.layout import incident_rank_dir
from rankscope.wire.ports import free_port


def main(argv: list[str]) -> int:
    command: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1:]
    ap = argparse.ArgumentParser(prog="rankscope rerun", description=__doc__.split("\n\n")[0].replace("``", ""))
    ap.add_argument("incident", type=Path, help="an incident folder (holding incident.json)")
    ap.add_argument("--replay", type=Path, help="the replay record's folder, when not where the rank wrote it")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds the replay may take (default 600)")
    args = ap.parse_args(argv)
    try:
        detail, record = _record(args.incident, args.replay)
        meta, _, _ = replay_files.load(record)
    except ValueError as exc:
        print(f"rankscope rerun: {exc}", file=sys.stderr)
        return 2
    kind, line = settle(args.incident, detail, record, meta, command, args.timeout)
    print(line)
    return 0 if kind != "unknown" else 1


#: How long the end of a launch waits for its replay.
AFTER_RUN_TIMEOUT_S = 300.0


def replay_after_run(incidents: list[dict], say: Any) -> str:
    """At the end of ``rankscope launch``: the first incident whose rank re-ran its step,
    got the fault again and kept a record is replayed in another process, which settles
    the data or the code (it comes back) against that rank's device (it does not). The
    class and line go to ``rerun.json`` in the incident folder; returns the line."""
    for inc in incidents:
        rr = (inc.get("evidence") or {}).get("rerun")
        where = inc.get("dir")
        if isinstance(rr, dict) and rr.get("outcome") == rerun_facts.REPRODUCED and rr.get("replay") and where:
            say(f"replaying rank {rr['rank']}'s step {rr['step']} in another process (--no-replay to skip)")
            try:
                meta, _, _ = replay_files.load(rr["replay"])
            except ValueError as exc:
                return f"not replayed: {exc}"
            return settle(Path(where), rr, Path(rr["replay"]), meta, [], AFTER_RUN_TIMEOUT_S)[1]
    return ""


def settle(incident: Path, detail: dict, record: Path, meta: dict, command: list[str],
           timeout: float) -> tuple[str, str]:
    """Replay, classify, write ``rerun.json``: (class, line)."""
    with tempfile.TemporaryDirectory(prefix="rankscope-rerun-") as tmp:
        result = _replay(record, meta, command, Path(tmp), timeout)
    kind, line = rerun_facts.with_reference(detail, result)
    (incident / "rerun.json").write_text(json.dumps({"class": kind, "line": line, "result": result,
                                                     "rank_rerun": detail}, indent=1))
    return kind, line


def _record(incident: Path, given: Path | None) -> tuple[dict, Path]:
    path = incident / "incident.json"
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise ValueError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    rr = (doc.get("evidence") or {}).get("rerun")
    who = f"rank {doc.get('first_diverging_rank')} at step {doc.get('step')}"
    if not isinstance(rr, dict) or rr.get("outcome") not in (rerun_facts.REPRODUCED, rerun_facts.TRANSIENT):
        why = rr.get("line") if isinstance(rr, dict) else "its records looked normal before its reduction"
        raise ValueError(f"{incident}: {who} did not re-run that step ({why}), so there is nothing to replay")
    record = given or (Path(rr["replay"]) if rr.get("replay") else None)
    if record is not None and given is None and not (record / "meta.json").is_file():
        # Not on this machine: the copy the rank's exported bundle carries.
        rank, step = doc.get("first_diverging_rank"), doc.get("step")
        copy = replay_files.find_in_bundle(incident_rank_dir(incident, int(rank)), int(step)) \
            if isinstance(rank, int) and isinstance(step, int) else None
        record = copy or record
    if record is None:
        raise ValueError(f"{incident}: {who} re-ran the step but kept no replay record of it (an argument that "
                         "is neither a tensor nor a plain value, or bfloat16 data)")
    return rr, record


def _replay(record: Path, meta: dict, command: list[str], tmp: Path, timeout: float) -> dict:
    out = tmp / "result.json"
    cwd = meta.get("cwd") if os.path.isdir(str(meta.get("cwd"))) else None
    if not command:
        script = [a for a in meta.get("argv") or [] if a]
        if not script:
            return {"error": "the record does not say how the rank was started: give the command after --"}
        command = [sys.executable, *script]
        if shutil.which("msrun", path=_path()):
            command = ["msrun", "--worker_num=1", "--local_worker_num=1", f"--master_port={free_port()}",
                       f"--log_dir={tmp / 'logs'}", "--join=True", *script]
    env = {k: v for k, v in os.environ.items() if k not in ("RANKSCOPE_AGENT", CONFIG_ENV)}
    env.update({"PATH": _path(), "RANKSCOPE_ATTACH": "1", "RANKSCOPE_JOB": "rerun", replay_files.ENV: str(record),
                replay_files.OUT_ENV: str(out), DUMP_PATH_ENV: str(tmp / "dump"),
                "PYTHONPATH": os.pathsep.join([str(ATTACH_DIR), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))])})
    try:
        proc, stdout, stderr = _run_until_result(command, cwd, env, out, timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"the replay took longer than {timeout:.0f} s"}
    except OSError as exc:
        return {"error": f"{command[0]}: {exc.strerror or exc}"}
    got = _result(out)
    if got is not None:
        return got
    logs = "\n".join(p.read_text(errors="replace")[-1500:] for p in sorted((tmp / "logs").glob("*.log")))
    tail = (stdout + stderr + logs).strip().splitlines()[-8:]
    return {"error": (f"the replay ended (exit {proc.returncode}) without making the call: the script never called "
                      f"a gradient function over {len(meta['params'])} parameters named like "
                      f"{meta['params'][:3]}; its last lines: " + " | ".join(tail))[:1500]}


#: Seconds a replay's launcher may take to end by itself once the result is written.
RESULT_GRACE_S = 3.0


def _run_until_result(command: list[str], cwd: str | None, env: dict, out: Path, timeout: float
                      ) -> tuple[subprocess.Popen, str, str]:
    """Run the replay in a process group of its own until it ends, or until its result is
    written and it has had :data:`RESULT_GRACE_S` to end: the replayed rank ends itself
    with ``os._exit`` once the result is written, and msrun's scheduler then waits out a
    heartbeat timeout (~35 s) before it exits; nothing is left to wait for by then."""
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + timeout
    written_at = None
    while True:
        try:
            stdout, stderr = proc.communicate(timeout=0.5)
            return proc, stdout, stderr
        except subprocess.TimeoutExpired:
            now = time.monotonic()
            if written_at is None and _result(out) is not None:
                written_at = now
            if written_at is not None and now - written_at > RESULT_GRACE_S:
                _stop_group(proc)
                stdout, stderr = proc.communicate()
                return proc, stdout, stderr
            if now > deadline:
                _stop_group(proc)
                proc.communicate()
                raise


def _stop_group(proc: subprocess.Popen) -> None:
    """The replay's own process group (started here, in a session of its own): TERM, then KILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue


def _result(out: Path) -> dict | None:
    """The replay's result once written whole (the rank writes it with one write)."""
    try:
        got = json.loads(out.read_text())
    except (OSError, ValueError):
        return None
    return got if isinstance(got, dict) else None


def _path() -> str:
    """PATH with this interpreter's folder first: msrun starts its workers as ``python``."""
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
