"""Soak: a long real training job under ``rankscope launch``, against the same job unwatched.

The 4-rank data-parallel example (``examples/train_dp.py``, msrun, CPU) runs ``--steps``
steps twice: unwatched (the baseline), then under ``rankscope launch`` with no config.
Every ``--sample-s`` seconds each run samples: every rank's RSS, the node agent's and
the coordinator's RSS (watched run), the bytes and files under the export folder, and
the step the ranks have reached (their log lines). After ``--warmup`` of the steps it
prints, for both runs, the slopes per 1,000 steps (a least-squares fit) and the step
rate over the first and the last fifth of the steps, then the targets:

- disk and file count flat once the local dump's window is full;
- rank RSS slope no worse than the unwatched job's + 1 KB a step (1 MB per 1,000 steps);
- step rate at the end >= 0.95x its rate at the start;
- no incident: the job is clean, so every verdict is a false alarm (launch runs with
  ``--on-divergence continue`` so that one does not hold the job paused).

    .venv/bin/python bench/soak.py                       # a few minutes here
    .venv/bin/python bench/soak.py --steps 20000         # the hour-long run of docs/benchmarks.md

The last line is JSON. Figures only: nothing here asserts.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "examples" / "train_dp.py"
_STEP = re.compile(rb"rank \d+/\d+ step (\d+) ")


def _procs() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            out[int(d)] = (ppid, cmd)
        except (OSError, ValueError, IndexError):
            continue
    return out


def _descendants(root: int, procs: dict[int, tuple[int, str]]) -> dict[int, str]:
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        kids.setdefault(ppid, []).append(pid)
    out, todo = {}, [root]
    while todo:
        pid = todo.pop()
        for k in kids.get(pid, ()):
            out[k] = procs[k][1]
            todo.append(k)
    return out


def _is_worker(pid: int) -> bool:
    """msrun starts a scheduler running the script too: only MS_ROLE=MS_WORKER are ranks."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return b"MS_ROLE=MS_WORKER\0" in f.read() + b"\0"
    except OSError:
        return False


def _rss_kb(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _disk(folder: Path) -> tuple[int, int]:
    size = files = 0
    for dirpath, _, names in os.walk(folder):
        for n in names:
            try:
                size += os.lstat(os.path.join(dirpath, n)).st_size
                files += 1
            except OSError:
                pass
    return size, files


def _step_reached(log_dir: Path) -> int:
    """The lowest newest step over the ranks' logs (what every rank has reached)."""
    steps = []
    for log in sorted(log_dir.glob("worker_*.log")):
        try:
            with open(log, "rb") as f:
                f.seek(max(0, os.path.getsize(log) - 65536))
                found = _STEP.findall(f.read())
            steps.append(int(found[-1]) if found else -1)
        except OSError:
            steps.append(-1)
    return min(steps) if steps else -1


def run(steps: int, sample_s: float, watched: bool, work: Path, ranks: int = 4) -> list[dict]:
    out_dir = work / ("watched" if watched else "plain")
    log_dir = out_dir / "logs"
    out_dir.mkdir(parents=True)
    port = 30000 + os.getpid() % 5000 + (7 if watched else 0)
    msrun = ["msrun", f"--worker_num={ranks}", f"--local_worker_num={ranks}", f"--master_port={port}",
             f"--log_dir={log_dir}", "--join=True", str(SCRIPT)]
    # continue: a verdict on this clean job (a false alarm, counted below) must not hold it paused.
    cmd = ([sys.executable, "-m", "rankscope", "launch", "--export-dir", str(out_dir / "export"), "--log",
            str(out_dir / "command.log"), "--on-divergence", "continue", "--"] + msrun) if watched else msrun
    env = dict(os.environ, TRAIN_STEPS=str(steps))
    env.pop("TRAIN_FAULT", None)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    t0 = time.monotonic()
    with open(out_dir / "stdout.txt", "wb") as fh:
        proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT)
    samples = []
    try:
        while proc.poll() is None:
            time.sleep(sample_s)
            procs = _procs()
            mine = _descendants(proc.pid, procs)
            workers = [p for p, c in mine.items() if str(SCRIPT) in c and "msrun" not in c and _is_worker(p)]
            agents = [p for p, c in mine.items() if "rankscope agent" in c]
            coord = [p for p, c in mine.items() if "_CoordinatorActor" in c]
            rss = {p: _rss_kb(p) for p in workers}
            size, files = _disk(out_dir / "export") if watched else (0, 0)
            samples.append({"t": round(time.monotonic() - t0, 2), "step": _step_reached(log_dir),
                            "rank_rss_kb": sorted(v for v in rss.values() if v),
                            "agent_rss_kb": sum(_rss_kb(p) or 0 for p in agents),
                            "coordinator_rss_kb": sum(_rss_kb(p) or 0 for p in coord),
                            "disk_bytes": size, "disk_files": files})
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    return [s for s in samples if s["step"] >= 0]


def _slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of y over x (None with fewer than 3 points)."""
    n = len(xs)
    if n < 3:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    den = sum((x - mx) ** 2 for x in xs)
    return None if den == 0 else sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den


def _rate(samples: list[dict]) -> float | None:
    if len(samples) < 2 or samples[-1]["t"] == samples[0]["t"]:
        return None
    return (samples[-1]["step"] - samples[0]["step"]) / (samples[-1]["t"] - samples[0]["t"])


def summarize(samples: list[dict], steps: int, warmup: float, window_full: int | None, ranks: int = 4) -> dict:
    # While every rank runs: the first and the last seconds (starting up, ending one by
    # one, msrun's teardown) are not the steady state the slopes describe.
    after = [s for s in samples if s["step"] >= warmup * steps and len(s["rank_rss_kb"]) == ranks
             and s["step"] < steps - 1]
    xs = [s["step"] / 1000 for s in after]
    out: dict = {"samples": len(samples), "steps_reached": samples[-1]["step"] if samples else -1}

    def per_k(key: str, pick) -> float | None:  # noqa: ANN001
        slope = _slope(xs, [pick(s) for s in after])
        return None if slope is None else round(slope, 2)

    out["rank_rss_kb_per_1k_steps"] = per_k("rank", lambda s: sum(s["rank_rss_kb"]) / len(s["rank_rss_kb"]))
    out["rank_rss_kb_end"] = after[-1]["rank_rss_kb"] if after else None
    for key in ("agent_rss_kb", "coordinator_rss_kb"):
        out[f"{key}_per_1k_steps"] = per_k(key, lambda s, k=key: s[k])
        out[f"{key}_end"] = after[-1][key] if after else None
    full = [s for s in after if window_full is None or s["step"] >= window_full]
    fx = [s["step"] / 1000 for s in full]
    for key in ("disk_bytes", "disk_files"):
        slope = _slope(fx, [s[key] for s in full])
        out[f"{key}_per_1k_steps"] = None if slope is None else round(slope, 1)
        out[f"{key}_end"] = full[-1][key] if full else None
    fifth = max(2, len(after) // 5)
    start, end = _rate(after[:fifth]), _rate(after[-fifth:])
    out["steps_per_s_start"] = None if start is None else round(start, 2)
    out["steps_per_s_end"] = None if end is None else round(end, 2)
    out["end_over_start"] = round(end / start, 3) if start and end else None
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=2500)
    ap.add_argument("--sample-s", type=float, default=3.0)
    ap.add_argument("--warmup", type=float, default=0.2, help="share of the steps left out of the fits")
    ap.add_argument("--skip-baseline", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the run folders (printed)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rankscope-soak-"))
    result: dict = {"steps": args.steps, "work": str(work)}
    # The local dump's rolling window (100 steps by default) is full after it.
    window = 100
    for watched in ([False] if not args.skip_baseline else []) + [True]:
        name = "watched" if watched else "unwatched"
        t0 = time.time()
        samples = run(args.steps, args.sample_s, watched, work)
        s = summarize(samples, args.steps, args.warmup, window if watched else None)
        s["wall_s"] = round(time.time() - t0, 1)
        if watched:
            found = sorted((work / name / "export" / "incidents").glob("*/incident.json"))
            s["incidents"] = [p.parent.name for p in found]
            s["replica_splits_healed"] = healed_splits(work / name / "export" / "coverage.json")
            result["incident_files"] = found
        result[name] = s
        print(f"{name:9s} {s['steps_reached'] + 1} steps in {s['wall_s']} s: rank RSS "
              f"{s['rank_rss_kb_per_1k_steps']} KB / 1k steps; steps/s {s['steps_per_s_start']} -> "
              f"{s['steps_per_s_end']} (x{s['end_over_start']})" + (
                  f"; agent RSS {s['agent_rss_kb_per_1k_steps']} KB / 1k steps (end {s['agent_rss_kb_end']} KB); "
                  f"coordinator RSS {s['coordinator_rss_kb_per_1k_steps']} KB / 1k steps (end "
                  f"{s['coordinator_rss_kb_end']} KB); export folder {s['disk_bytes_per_1k_steps']} B and "
                  f"{s['disk_files_per_1k_steps']} files / 1k steps after the window filled (end "
                  f"{(s['disk_bytes_end'] or 0) / 2**20:.1f} MB, {s['disk_files_end']} files)" if watched else ""),
              flush=True)
    w, p = result.get("watched") or {}, result.get("unwatched") or {}
    if w and p and w.get("rank_rss_kb_per_1k_steps") is not None and p.get("rank_rss_kb_per_1k_steps") is not None:
        extra = w["rank_rss_kb_per_1k_steps"] - p["rank_rss_kb_per_1k_steps"]
        print(f"targets: rank RSS slope over the unwatched job's {extra:+.1f} KB / 1k steps (target <= +1000); "
              f"step rate end/start x{w['end_over_start']} (target >= 0.95; unwatched x{p['end_over_start']}); "
              f"files after the window {w['disk_files_per_1k_steps']} / 1k steps (target flat); "
              f"incidents on this clean job {len(w.get('incidents', []))} (target 0){': ' if w.get('incidents') else ''}"
              + ", ".join(w.get("incidents", [])))
    if w.get("replica_splits_healed"):
        print(f"last-bit optimizer-state splits that agreed again a step later (no finding): "
              f"{json.dumps(w['replica_splits_healed'])}", flush=True)
    found = result.pop("incident_files", [])
    for path in found:
        print(f"  {path.parent.name}: {incident_line(path)}", flush=True)
    print(json.dumps(result))
    if not args.keep:
        import shutil
        if w.get("incidents"):
            # A clean job's incident is a bug to chase: its folders stay, the rest goes.
            for child in work.iterdir():
                if child.name != "watched":
                    shutil.rmtree(child, ignore_errors=True)
            print(f"incident folders kept under {found[0].parent.parent}", flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)


def healed_splits(coverage: Path) -> dict | None:
    """What coverage.json says of replica splits that healed by the next step, if any."""
    try:
        jobs = json.loads(coverage.read_text()).get("jobs", {})
    except (OSError, ValueError):
        return None
    return next((j["replica_splits_healed"] for j in jobs.values() if "replica_splits_healed" in j), None)


def incident_line(path: Path) -> str:
    """What an incident on the clean job named, with the evidence to chase it."""
    try:
        inc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return f"unreadable: {exc}"
    evidence = json.dumps(inc.get("evidence"), default=str)
    return (f"{inc.get('detector')} rank {inc.get('first_diverging_rank')} step {inc.get('step')} "
            f"{inc.get('tensor')}; evidence {evidence[:1500]}")


if __name__ == "__main__":
    main()
