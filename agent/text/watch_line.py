"""How a rank's watch status (STATUS ``watch``) reads to a person: one spelling, used by
the rank's own log line and by ``rankscope launch``."""
from __future__ import annotations

import os
from typing import Any

#: ``how`` when nothing is seen: the line then reads "not watched: <reason>".
UNWATCHED = "not watched"
#: The modes a rank's steps run in (``mode``).
PYNATIVE = "PyNative"
GRAPH = "GRAPH"
JIT = "PyNative+jit"

#: The watch's tiers (``cluster.watch``, ``rankscope launch --watch``): DEFAULT keeps the
#: probe within ``cluster.budget`` of a step (vital signs every step, fingerprints on
#: rotation); FULL records every tensor's statistics and checksum every step.
DEFAULT_TIER, FULL_TIER = "default", "full"
TIERS = (DEFAULT_TIER, FULL_TIER)
#: The default tier's share of a rank's median step.
DEFAULT_BUDGET = 0.05


def watch_line(rank: Any, mode: str, how: str, reason: str = "", who: str | None = None,
               rerun: str = "", cost: dict | None = None) -> str:
    """``who`` names several ranks at once (``ranks 0-3``) in place of ``rank``; ``rerun``
    says where an anomalous step cannot be re-run; ``cost``: the tier and what it costs."""
    who = who or (f"rank {rank}" if rank is not None else "this process")
    if how == UNWATCHED:
        return f"{who}: not watched: {reason or 'no training step was recognised'}"
    text = f"{who}: {mode} mode, watched through {how}"
    text = f"{text} ({reason})" if reason else text
    text = f"{text}; {rerun}" if rerun else text
    extra = cost_text(cost)
    return f"{text}; {extra}" if extra else text


def plan_of(cost: dict | None) -> tuple | None:
    """What of a rank's watch cost is its plan (tier, K, Cell hooks): a change of it is
    worth saying again; the measured figures change every step and are not."""
    return None if not isinstance(cost, dict) or not cost else (cost.get("tier"), cost.get("every"), cost.get("cells"))


def cost_text(cost: dict | None, measured: bool = True) -> str:
    """The tier and its measured cost in words ("" when the rank did not say); without
    ``measured``, only the plan (what ranks planned alike share)."""
    if not isinstance(cost, dict) or not cost.get("tier"):
        return ""
    if cost["tier"] == FULL_TIER:
        return "full watch: every parameter, optimizer state and gradient in full every step"
    budget = cost.get("budget")
    share = cost.get("share") if measured else None
    # Said as a claim only while the measurement bears it out.
    over = isinstance(share, (int, float)) and isinstance(budget, (int, float)) and share > budget
    text = "default watch" + ("" if not isinstance(budget, (int, float)) else
                              f", budget {_pct(budget)} of a step" if over else f" within {_pct(budget)} of a step")
    every = cost.get("every")
    if isinstance(every, int):  # None until the rank has measured its steps
        text += (f", each weight fingerprinted every {every} steps (a silent weight change is named "
                 f"up to {every - 1} step(s) late)") if every > 1 else ", every weight fingerprinted every step"
    cells, cells_share = cost.get("cells"), cost.get("cells_share")
    cost_of_cells = f" (they cost {_pct(cells_share)} of a step)" if isinstance(cells_share, (int, float)) else ""
    if cells == "off":
        text += f", per-Cell hooks off{cost_of_cells}: an anomalous step is re-run with them to name the Cell"
    elif cells == "on":
        text += f", per-Cell hooks on{cost_of_cells}"
    if not measured:
        return text
    if isinstance(share, (int, float)):
        text += f", measured {'up to ' if cost.get('merged') else ''}{share:.1%} of a step"
        if over:
            text += (" (over the budget: what runs every step, the loss, one read of each gradient and the step's "
                     "records, does not rotate)")
    host = cost.get("host_bytes")
    if isinstance(host, int):
        text += f", {_size(host)} copied to the host a step"
    return text


def merged_cost(costs: list[dict | None]) -> dict | None:
    """One cost for ranks that planned alike: the most any of them measured."""
    got = [c for c in costs if isinstance(c, dict)]
    if not got:
        return None
    out = dict(got[0], merged=len(got) > 1)
    for key in ("share", "host_bytes", "cells_share"):
        vals = [c[key] for c in got if isinstance(c.get(key), (int, float))]
        out[key] = max(vals) if vals else None
    return out


def _pct(x: float) -> str:
    """A share of a step as a person reads it: 5%, 21%, 0.05%."""
    return f"{x * 100:.2g}%"


def _size(n: int) -> str:
    for unit, scale in (("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


#: Set by ``rankscope launch`` to the file its own progress lines go to ("dev:inode"):
#: a rank whose stderr is that same file (a script run directly, not under msrun's log
#: files) leaves its watch line to launch, which prints it from the rank's status.
LAUNCH_OUTPUT_ENV = "RANKSCOPE_LAUNCH_OUTPUT"


def stream_id(stream: Any) -> str:
    """"dev:inode" of an open descriptor or file object; "" when it has none."""
    try:
        st = os.fstat(stream if isinstance(stream, int) else stream.fileno())
    except (AttributeError, OSError, ValueError):
        return ""
    return f"{st.st_dev}:{st.st_ino}"


def launch_prints_it(stream: Any) -> bool:
    """True when ``rankscope launch`` prints to the very file ``stream`` writes to."""
    want = os.environ.get(LAUNCH_OUTPUT_ENV, "")
    return bool(want) and stream_id(stream) == want
