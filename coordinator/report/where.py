"""Where the named tensor sits: its module path (msProbe's construct.json) and the code
that ran it (stack.json), read from the dump of the named step on the named rank.

The dump is looked for in the rank's bundle first (offline, the bundle is the rank's dump
folder itself), then in the export folder's local
dump (``local_dump/step{N}/rank{R}/``, what ``rankscope launch`` writes), then where the
rank's config said it dumped. A step without a dump (a rank that died in it) falls back
to the nearest earlier step: the model's structure does not change between steps.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from rankscope.coordinator.report.fmt import esc, muted
from rankscope.wire.layout import bundle_dirs, dump_label, step_dir_name

#: Earlier steps tried when the named step has no dump.
LOOK_BACK = 4
_CELL = re.compile(r"^(?P<node>(?:Cell|Module)\.(?P<path>.+)\.(?P<cls>[A-Za-z_]\w*)\.(?P<dir>forward|backward|parameters_grad)"
                   r"\.(?P<n>\d+))(?:\.|$)")
_SENTINEL = re.compile(r"^Sentinel\.[a-z_0-9]+\.(?:moment\d\.)?(?P<param>.+)$")
_FRAME = re.compile(r'^File "?(?P<file>[^,"]+)"?, line (?P<line>\d+), in (?P<func>[^,]+),?\s*\n?\s*(?P<code>.*)$', re.S)


def find_dump(incident_dir: Path, rank: Any, step: Any, bundle_config: dict | None = None,
              bundle: Any = None) -> Path | None:
    """The folder holding construct.json/stack.json for (rank, step), or None. ``bundle``:
    the rank's bundle path, which offline (``rankscope analyze``) is its dump folder itself."""
    if not isinstance(step, int) or rank is None:
        return None
    if isinstance(bundle, str) and any((Path(bundle) / f).is_file() for f in ("construct.json", "stack.json")):
        return Path(bundle)
    roots = [incident_dir / f"rank_{rank}", incident_dir.parent.parent / "local_dump"]
    dump_path = (bundle_config or {}).get("dump_path")
    if isinstance(dump_path, str) and dump_path:
        roots.append(Path(dump_path))
    label = dump_label(int(rank)) if str(rank).isdigit() else str(rank)
    for s in range(step, max(-1, step - LOOK_BACK - 1), -1):
        for root in roots:
            for cand in (root / step_dir_name(s) / label, *_nested(root, s, label)):
                if (cand / "construct.json").is_file() or (cand / "stack.json").is_file():
                    return cand
    return None


def _nested(root: Path, step: int, label: str) -> list[Path]:
    # A bundle may carry its dump one or two folders down (e.g. rdr/dump/step4/rank2).
    if not root.is_dir() or root.name == "local_dump":
        return []
    return [p for p in root.glob(f"*/{step_dir_name(step)}/{label}")] + \
        [p for p in root.glob(f"*/*/{step_dir_name(step)}/{label}")]


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def cell_of(tensor: str, known: list[str]) -> str | None:
    """The dump node a tensor record belongs to (``Cell.fc1.Dense.forward.0``)."""
    m = _CELL.match(tensor)
    if m:
        return m.group("node")
    s = _SENTINEL.match(tensor)
    if s:  # Sentinel.grad_local.fc1.weight -> the cell that owns fc1.weight
        module = s.group("param").rsplit(".", 1)[0]
        grad = tensor.startswith(("Sentinel.grad", "Sentinel.opt_state"))
        for prefix in ("parameters_grad", "forward") if grad else ("forward", "parameters_grad"):
            hit = next((k for k in known if k.startswith(f"Cell.{module}.") and f".{prefix}." in k), None)
            if hit:
                return hit
    best = max((k for k in known if tensor.startswith(k + ".")), key=len, default=None)
    return best


def module_chain(node: str, construct: dict) -> list[str]:
    """node, its parent, ... up to the top (construct.json maps node -> parent)."""
    chain, seen = [node], {node}
    while True:
        parent = construct.get(chain[-1])
        if not isinstance(parent, str) or parent in seen or len(chain) > 64:
            return chain
        chain.append(parent)
        seen.add(parent)


def describe_node(node: str) -> str:
    """``Cell.layers.0.attn.Dense.forward.0`` -> ``layers.0.attn (Dense), forward call 0``."""
    m = _CELL.match(node)
    if not m:
        return node
    return f"{m.group('path')} ({m.group('cls')}), {m.group('dir').replace('_', ' ')} call {m.group('n')}"


def frames_for(node: str, stack: dict) -> list[str]:
    """The stack recorded for the node (msProbe L0: {id: [[node, ...], [frame, ...]]})."""
    m = _CELL.match(node)
    forward = None if m is None else node.replace(f".{m.group('dir')}.", ".forward.", 1)
    for names in (node, forward):
        for entry in stack.values():
            if isinstance(entry, list) and len(entry) == 2 and names in (entry[0] or []):
                return [str(f) for f in entry[1]]
    return []


def user_frame(frame: str) -> bool:
    m = _FRAME.match(frame)
    path = m.group("file") if m else frame
    return not any(part in path for part in ("site-packages", "/agent/probe/", "/lib/python3"))


def _frame_html(frame: str, mine: bool) -> str:
    m = _FRAME.match(frame)
    if not m:
        return f'<li class="{"user" if mine else ""}"><code>{esc(frame)}</code></li>'
    return (f'<li class="{"user" if mine else ""}"><code>{esc(m.group("file"))}:{esc(m.group("line"))}</code> in '
            f'<code>{esc(m.group("func").strip())}</code><br>'
            f'<code class="src">{esc(m.group("code").strip())}</code></li>')


def where_section(incident: dict, incident_dir: Path, bundle_config: dict | None, link) -> str:
    """HTML: module path + code for the named tensor; ``link(path)`` renders a file link."""
    tensor, rank, step = incident.get("tensor"), incident.get("first_diverging_rank"), incident.get("step")
    if not tensor:
        return stacks_section(incident, incident_dir, link)
    folder = find_dump(incident_dir, rank, step, bundle_config, (incident.get("bundles") or {}).get(str(rank)))
    if folder is None:
        return muted(f"No construct.json or stack.json found for rank {rank} near step {step} (statistics-only "
                     "capture, or the dump is on the rank's host and was not collected: "
                     "rankscope collect gathers it).", "where")
    construct = _load(folder / "construct.json") or {}
    stack = _load(folder / "stack.json") or {}
    known = list(construct) or [n for e in stack.values() if isinstance(e, list) and e for n in (e[0] or [])]
    node = cell_of(tensor, known)
    parts = [f'<div id="where"><p>Read from {link(folder / "construct.json")} and {link(folder / "stack.json")}'
             + (f" (step {esc(folder.parent.name[4:])}: the nearest step with a dump)"
                if folder.parent.name != step_dir_name(step) else "") + ".</p>"]
    if node is None:
        parts.append(muted(f"{tensor} is not a module's record (no matching node in construct.json)."))
        return "".join(parts) + "</div>"
    chain = module_chain(node, construct)
    items = "".join(f"<li><code>{esc(n)}</code> \u2014 {esc(describe_node(n))}</li>" for n in chain)
    parts.append(f'<p>Module path (innermost first):</p><ol id="module-path">{items}'
                 f'<li class="muted">the model passed to the optimizer (top level)</li></ol>')
    frames = frames_for(node, stack)
    if frames:
        mine = [f for f in frames if user_frame(f)]
        shown = "".join(_frame_html(f, True) for f in mine) or "<li class=muted>only library frames</li>"
        every = "".join(_frame_html(f, user_frame(f)) for f in frames)
        parts.append(f'<p>Code (your frames, innermost first):</p><ol id="code-frames">{shown}</ol>'
                     f"<details><summary>full stack ({len(frames)} frames)</summary><ol>{every}</ol></details>")
    else:
        parts.append(muted("stack.json has no entry for this module."))
    return "".join(parts) + "</div>"


_STACK_LINE = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>.+)$')


def main_thread_frames(text: str) -> list[str]:
    """The user frames of the thread that was running Python when the stacks were taken
    (faulthandler's "Current thread", else the last thread listed), innermost first."""
    blocks = [b for b in re.split(r"\n\s*\n", text) if "File " in b]
    block = next((b for b in blocks if "Current thread" in b or "MainThread" in b), blocks[-1] if blocks else "")
    out = []
    for line in block.splitlines():
        m = _STACK_LINE.match(line)
        if m and user_frame(m.group("file")):
            out.append(f"{m.group('file')}:{m.group('line')} in {m.group('func').strip()}")
    return out


def stacks_section(incident: dict, incident_dir: Path, link) -> str:
    """No tensor (a crash or hang): where each rank's main thread stood, from the stacks
    every rank wrote when the incident opened; a rank killed outright wrote none."""
    rows = []
    first = str(incident.get("first_diverging_rank"))
    for rank, rank_dir in sorted(bundle_dirs(incident_dir), key=lambda t: t[0].zfill(12)):
        found = sorted(rank_dir.rglob("thread_stacks.txt"))
        if not found:
            rows.append(f'<li data-rank="{esc(rank)}"><strong>rank {esc(rank)}</strong>: no stacks (the process '
                        "was gone before it could write them)</li>")
            continue
        frames = main_thread_frames(found[0].read_text(encoding="utf-8", errors="replace"))
        shown = "".join(f"<li class=user><code>{esc(f)}</code></li>" for f in frames[:6]) \
            or "<li>library frames only</li>"
        named = " (named)" if rank == first else ""
        rows.append(f'<li data-rank="{esc(rank)}"><strong>rank {esc(rank)}</strong>{named}:'
                    f" {link(found[0], 'thread_stacks.txt')}<ol>{shown}</ol></li>")
    if not rows:
        return muted("No tensor named and no thread stacks arrived: see the failure table.", "where")
    why = ("The bundles were exported on an operator's request: no tensor is named." if incident.get("detector") == "manual"
           else "No tensor is named for a crash or hang.")
    return (f'<div id="where"><p>{why} Where each rank\'s main thread stood '
            "when the incident opened (your frames, innermost first):</p>"
            f'<ul id="rank-stacks">{"".join(rows)}</ul></div>')
