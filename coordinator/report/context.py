"""Everything to go on after the verdict: each rank's bundle files and logs (relative
links, so the export folder can be copied elsewhere and still work), the config and
environment that ran, the incident's timeline, and the commands to go on with.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from rankscope.coordinator.report.fmt import epoch, esc, muted, num_cell, seconds, table, when
from rankscope.wire.layout import bundle_dirs, dump_label, step_dir_name

#: Environment variables shown on the page (the full environment.json is linked):
#: what decides how a distributed job runs, never credentials.
ENV_PREFIXES = ("MS_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "DEVICE_", "HCCL_", "OMP_", "ASCEND_", "GLOG_",
                "MASTER_", "TRAIN_", "RANKSCOPE_", "CUDA_VISIBLE", "MINDSPORE_")
_WORKER_LOG = re.compile(r"worker_(\d+)\.log$")
MAX_FILES_LISTED = 40


class Links:
    """File links relative to the incident folder (the page's own folder)."""

    def __init__(self, incident_dir: Path) -> None:
        self.base = incident_dir.resolve()

    def href(self, path: Path) -> str:
        return os.path.relpath(Path(path).resolve(), self.base)

    def __call__(self, path: Path, text: str | None = None) -> str:
        href = self.href(path)
        return f'<a href="{esc(href)}"><code>{esc(text or href)}</code></a>'


def export_dir_of(incident_dir: Path) -> Path:
    return incident_dir.resolve().parent.parent


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def rank_file(incident_dir: Path, rank: Any, name: str) -> Path | None:
    for found in sorted((incident_dir / f"rank_{rank}").rglob(name)):
        return found
    return None


def worker_logs(incident_dir: Path) -> tuple[dict[str, Path], list[Path]]:
    """(rank -> its worker log, other logs) found in the export folder, outside incidents/."""
    root = export_dir_of(incident_dir)
    by_rank: dict[str, Path] = {}
    other: list[Path] = []
    if not root.is_dir():
        return by_rank, other
    for depth in ("*.log", "*/*.log", "*/*/*.log"):
        for p in sorted(root.glob(depth)):
            top = p.relative_to(root).parts[0]
            if top in ("incidents", "local_dump") or not p.is_file():
                continue
            m = _WORKER_LOG.search(p.name)
            if m:
                by_rank.setdefault(m.group(1), p)
            elif len(other) < 20:
                other.append(p)
    return by_rank, other


def files_section(incident: dict, incident_dir: Path, link: Links) -> str:
    """Per rank: state at the pause, bundle files, worker log, dump of the named step."""
    bundles = {str(r): p for r, p in (incident.get("bundles") or {}).items()}
    incomplete = {str(r) for r in incident.get("missing_bundles") or []}
    on_disk = dict(bundle_dirs(incident_dir))
    ranks = incident.get("ranks") or {}
    logs, other = worker_logs(incident_dir)
    step = incident.get("step")
    dump_root = export_dir_of(incident_dir) / "local_dump"
    first = str(incident.get("first_diverging_rank"))
    rows = []
    every = sorted(set(ranks) | set(bundles) | set(on_disk) | incomplete, key=lambda r: (not r.isdigit(), r.zfill(8)))
    for r in every:
        snap = ranks.get(r) or {}
        folder = on_disk.get(r)
        if folder is not None:
            files = sorted(f for f in folder.rglob("*") if f.is_file() and not f.name.startswith("."))
            listed = " ".join(link(f, f.name) for f in files[:MAX_FILES_LISTED])
            if len(files) > MAX_FILES_LISTED:
                listed += f" \u2026 and {len(files) - MAX_FILES_LISTED} more"
            size = sum(f.stat().st_size for f in files)
            status = "incomplete" if r in incomplete else "complete"
            cls = "bundle incomplete" if r in incomplete else "bundle"
            bundle = f"{link(folder, folder.name + '/')} {status}, {len(files)} files, {_bytes(size)}<br>{listed}"
        else:
            cls, bundle = "bundle missing", "missing: nothing arrived"
        log = link(logs[r], logs[r].name) if r in logs else "\u2014"
        dumps = []
        if isinstance(step, int) and r.isdigit():
            for s in (step - 1, step, step + 1):
                d = dump_root / step_dir_name(s) / dump_label(int(r))
                if d.is_dir():
                    dumps.append(link(d, f"step {s}"))
        state = snap.get("state", "\u2014")
        rows.append(f'<tr class="{cls}{" faulty" if r == first else ""}" data-rank="{esc(r)}"><th>rank {esc(r)}</th>'
                    f'<td>{esc(state)}</td>{num_cell(snap.get("step"))}<td>{bundle}</td><td>{log}</td>'
                    f'<td>{" ".join(dumps) or "—"}</td></tr>')
    if not rows:
        return muted("No ranks or bundles were recorded.", "bundles")
    out = table("bundles", ["rank", "state at export", "last step", "bundle (rank_N/)", "worker log",
                            "msProbe dump"], rows)
    if other:
        out += "<p>Other logs: " + ", ".join(link(p, p.name) for p in other) + "</p>"
    return out


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def config_section(incident: dict, incident_dir: Path, link: Links) -> tuple[str, dict | None]:
    """The named rank's probe config (and whether every rank ran the same), the policy,
    versions and the job's distributed environment."""
    first = incident.get("first_diverging_rank")
    ranks = sorted({r for r, _ in bundle_dirs(incident_dir)}, key=lambda r: r.zfill(8))
    src = str(first) if str(first) in ranks else (ranks[0] if ranks else None)
    if src is None:
        return muted("No rank bundle arrived, so the config and environment are not known.", "config"), None
    cfg_path = rank_file(incident_dir, src, "config.json")
    cfg = read_json(cfg_path) if cfg_path else None
    texts = {r: (p.read_text() if (p := rank_file(incident_dir, r, "config.json")) else None) for r in ranks}
    differ = sorted(r for r, t in texts.items() if t is not None and cfg_path and t != cfg_path.read_text())
    rows = [f"<tr><th>on divergence</th><td>{esc(incident.get('policy'))}</td></tr>",
            f"<tr><th>job / group</th><td><code>{esc(incident.get('job'))}</code> / "
            f"<code>{esc(incident.get('group'))}</code></td></tr>"]
    if isinstance(cfg, dict):
        for key in ("task", "level", "step", "rank", "dump_path", "summary_mode", "scope", "list"):
            if key in cfg:
                rows.append(f"<tr><th>{esc(key)}</th><td><code>{esc(json.dumps(cfg[key]))}</code></td></tr>")
        for key in ("cluster", "rdr"):
            if cfg.get(key):
                rows.append(f"<tr><th>{esc(key)}</th><td><code>{esc(json.dumps(cfg[key])[:600])}</code></td></tr>")
        same = "every rank ran the same config" if not differ else f"rank(s) {', '.join(differ)} ran a different config"
        rows.append(f"<tr><th>probe config</th><td>{link(cfg_path)} (rank {esc(src)}; {same})</td></tr>")
    versions = read_json(p) if (p := rank_file(incident_dir, src, "versions.json")) else None
    if isinstance(versions, dict):
        pk = versions.get("packages") or {}
        rows.append(f"<tr><th>versions</th><td>Python {esc(str(versions.get('python', '')).split(' ')[0])} on "
                    f"{esc(versions.get('platform'))}; " + ", ".join(f"{esc(k)} {esc(v)}" for k, v in pk.items())
                    + f" ({link(p, 'versions.json')})</td></tr>")
    env_path = rank_file(incident_dir, src, "environment.json")
    env = read_json(env_path) if env_path else None
    if isinstance(env, dict):
        var = env.get("variables", env)
        keep = {k: v for k, v in sorted(var.items()) if isinstance(k, str) and k.startswith(ENV_PREFIXES)}
        shown = "".join(f"<li><code>{esc(k)}={esc(v)}</code></li>" for k, v in keep.items())
        rows.append(f"<tr><th>environment</th><td><ul class=\"env\">{shown or '<li>—</li>'}</ul>"
                    f"(distributed-run variables of rank {esc(src)}; all of them: {link(env_path, 'environment.json')})"
                    "</td></tr>")
    if not isinstance(cfg, dict) and not isinstance(env, dict):
        rows.append("<tr><th>probe config, environment</th><td class=muted>not in the bundles (a bundle the node "
                    "agent writes for a rank that died holds its flight recorder, not its config)</td></tr>")
    return f'<table id="config"><tbody>{"".join(rows)}</tbody></table>', cfg if isinstance(cfg, dict) else None


def timeline_section(incident: dict) -> str:
    events = [("verdict", "detected", incident.get("detected_at"))]
    events += [(e.get("event"), e.get("state"), e.get("at")) for e in incident.get("timeline") or []
               if isinstance(e, dict)]
    t0 = epoch(incident.get("detected_at"))
    rows = []
    for event, state, at in events:
        t = epoch(at)
        rel = seconds(t - t0) if t is not None and t0 is not None else None
        rows.append(f'<tr data-state="{esc(state)}"><td>{esc(str(event).replace("_", " "))}</td>'
                    f'<td><strong>{esc(state)}</strong></td><td>{esc(when(at))}</td>'
                    f'<td class="num">{esc("+" + rel if rel else "—")}</td></tr>')
    return table("timeline", ["event", "state", "time", "after detection"], rows)


def commands_section(incident: dict, incident_dir: Path) -> str:
    d, export = incident_dir.resolve(), export_dir_of(incident_dir)
    job, state, step = incident.get("job") or "JOB", incident.get("state"), incident.get("step")
    iid = incident.get("incident_id", d.name)
    lines = []
    if state == "written" and incident.get("policy") == "pause":
        lines += [("the job is paused here; go on", f"rankscope resume --job {job}"),
                  ("run one more step, then pause again", f"rankscope step 1 --job {job}"),
                  ("stop it", f"rankscope terminate --job {job}")]
    elif state in ("terminated", "resumed", "continued"):
        lines.append((f"the job was {state}: resume/step no longer apply", f"rankscope status --job {job}"))
    if isinstance(step, int):
        lo = max(0, step - 1)
        lines.append(("gather every rank's msProbe dump around the step into one tree (job still running)",
                      f"rankscope collect --job {job} --steps {lo}-{step + 1}"))
    lines += [("re-render this page (offline, from incident.json + history.json)", f"rankscope report {d}"),
              ("list every incident of this export folder", f"rankscope incidents {export}"),
              ("show this one in the terminal / open it", f"rankscope incidents {export} {iid} --open")]
    items = "".join(f"<li>{esc(why)}:<pre>{esc(cmd)}</pre></li>" for why, cmd in lines)
    return f'<ul id="commands">{items}</ul>'

