"""The report's pictures, drawn with matplotlib and inlined as SVG.

matplotlib (object API, no pyplot: no global figure state, safe on the report thread)
gives axes, ticks, colour bars and legends that a hand-drawn SVG lacked; rendered here,
the page needs no script and no network. Text stays text (``svg.fonttype: none``), so
tick labels are searchable and a test reads them from the DOM. Artists a reader (or a
test) looks for carry ids: ``first-divergence``, ``missing-step``, ``divergence-marker``,
``nonfinite-r{rank}-s{step}``, ``missing-r{rank}-s{step}``.
"""
from __future__ import annotations

import io
import math
from typing import Any

import numpy as np

from rankscope.coordinator.logic.views.recent import NONFINITE_DEVIATION
from rankscope.coordinator.report.fmt import as_float

#: Marks drawn per curve plot; past it the rest are counted in the legend.
MAX_MARKS = 64
#: Ranks drawn per curve plot besides the named one.
MAX_LINES = 31
NAMED_COLOUR, NAN_COLOUR, MISSING_COLOUR = "#c0392b", "#d62728", "#bdbdbd"
#: Other ranks' lines: tab10 without its red, which is the named rank's.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


def figure(width: float, height: float):
    from matplotlib.figure import Figure
    return Figure(figsize=(width, height), dpi=96, layout="constrained")


def to_svg(fig) -> str:
    import matplotlib
    from matplotlib.backends.backend_svg import FigureCanvasSVG
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "font.size": 10}):
        FigureCanvasSVG(fig).print_svg(buf, metadata={"Date": None})
    text = buf.getvalue()
    return text[text.index("<svg"):]  # no XML prolog/doctype inside HTML


def steps_to_show(history: dict, step: Any) -> list[int]:
    """Every step from the first kept one through the verdict's (and any kept after it)."""
    kept = [s for s in history.get("steps") or [] if isinstance(s, int)]
    if not kept:
        return [step] if isinstance(step, int) else []
    last = max(kept[-1], step) if isinstance(step, int) else kept[-1]
    first = min(kept[0], step) if isinstance(step, int) else kept[0]
    return list(range(first, last + 1))


def _matrix(history: dict, key: str, steps: list[int]) -> list[list[Any]]:
    col = {s: j for j, s in enumerate(history.get("steps") or [])}
    rows = history.get(key) or []
    return [[row[col[s]] if s in col and col[s] < len(row) else None for s in steps] for row in rows]


def _int_ticks(ax, axis: str, positions: list[float], labels: list[Any], most: int) -> None:
    stride = max(1, math.ceil(len(positions) / most))
    pos, lab = positions[::stride], [str(x) for x in labels[::stride]]
    (ax.set_xticks if axis == "x" else ax.set_yticks)(pos, lab)


def heatmap_svg(history: dict | None, incident: dict) -> str | None:
    """Rank x step deviation, NaN/Inf dark red, no data grey, the verdict's cell outlined."""
    if not history or not history.get("ranks"):
        return None
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch, Rectangle

    step, first = incident.get("step"), incident.get("first_diverging_rank")
    ranks, steps = list(history["ranks"]), steps_to_show(history, step)
    raw = _matrix(history, "deviation", steps)
    dev = np.array([[np.nan if v is None else float(v) for v in row] for row in raw], float)
    bad = dev >= NONFINITE_DEVIATION
    missing = np.isnan(dev)
    shown = np.ma.masked_where(bad | missing, dev)
    fin = dev[~bad & ~missing]
    vmax = max(1.0, float(fin.max()) if fin.size else 1.0)
    n_r, n_s = len(ranks), len(steps)
    fig = figure(min(14.0, max(7.0, 3.2 + 0.55 * n_s)), min(10.0, max(2.8, 1.4 + 0.34 * n_r)))
    ax = fig.add_subplot()
    ext = (steps[0] - 0.5, steps[-1] + 0.5, n_r - 0.5, -0.5)
    cmap = _cmap("Blues").with_extremes(bad=MISSING_COLOUR)
    im = ax.imshow(shown, cmap=cmap, vmin=0.0, vmax=vmax, aspect="auto", interpolation="nearest", extent=ext)
    ax.imshow(np.ma.masked_where(~bad, np.ones_like(dev)), cmap=ListedColormap([NAN_COLOUR]), aspect="auto",
              interpolation="nearest", extent=ext)
    if n_r * n_s <= 600:
        for i, j in zip(*np.nonzero(bad)):
            ax.text(steps[j], i, "NaN/Inf", ha="center", va="center", color="white", fontsize=7)
    ax.set_xlabel("step")
    ax.set_ylabel("rank")
    _int_ticks(ax, "x", steps, steps, 30)
    _int_ticks(ax, "y", list(range(n_r)), ranks, 32)
    ax.set_title("Deviation from the group median, per rank and step", loc="left")
    bar = fig.colorbar(im, ax=ax, pad=0.01, fraction=0.05)
    bar.set_label("max |log(value / group median)|\n(0 = typical; 0.69 = 2\u00d7 off)")
    handles = [Patch(facecolor=NAN_COLOUR, label="NaN/Inf in the rank's records"),
               Patch(facecolor=MISSING_COLOUR, label="no data (step not reported)"),
               Patch(facecolor="none", edgecolor="black", linewidth=2, label="the verdict: rank, step")]
    if first in ranks and step in steps:
        i, j = ranks.index(first), steps.index(step)
        rect = Rectangle((step - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=2.5, zorder=5)
        rect.set_gid("first-divergence")
        ax.add_patch(rect)
        if missing[i, j]:
            gap = Rectangle((step - 0.42, i - 0.42), 0.84, 0.84, fill=False, edgecolor="#1f4e9c", linewidth=2,
                            linestyle="--", zorder=6)
            gap.set_gid("missing-step")
            ax.add_patch(gap)
            handles.append(Patch(facecolor="none", edgecolor="#1f4e9c", linestyle="--", linewidth=2,
                                 label=f"step {step} never reported by rank {first}"))
    fig.legend(handles=handles, loc="outside lower left", ncol=2, fontsize=8, frameon=False)
    return to_svg(fig)


def _cmap(name: str):
    import matplotlib
    return matplotlib.colormaps[name].copy()


CURVE_LABELS = {"loss": ("local loss (each rank's own batch)", "loss"),
                "grad_norm": ("local gradient norm, before the reduction", "L2 norm of local gradients")}


def curve_svg(history: dict | None, incident: dict, key: str) -> str | None:
    """One metric per rank over every step, a line at the verdict's step, NaN/Inf and
    missing values marked where they are instead of bridged."""
    if not history or not history.get("ranks") or not history.get(key):
        return None
    from matplotlib.lines import Line2D
    from matplotlib.transforms import blended_transform_factory

    step, first = incident.get("step"), incident.get("first_diverging_rank")
    ranks, steps = list(history["ranks"]), steps_to_show(history, step)
    raw = _matrix(history, key, steps)
    vals = np.array([[np.nan if as_float(v) is None else as_float(v) for v in row] for row in raw], float)
    if not np.isfinite(vals).any() and not any(v is not None for row in raw for v in row):
        return None
    title, ylabel = CURVE_LABELS.get(key, (key, key))
    fig = figure(min(14.0, max(7.0, 3.0 + 0.5 * len(steps))), 3.4)
    ax = fig.add_subplot()
    x = np.array(steps, float)
    stride = max(1, math.ceil(len(ranks) / MAX_LINES))
    few = len(ranks) <= len(PALETTE) + 1
    others = sum(1 for i, r in enumerate(ranks) if r != first and not i % stride)
    labelled = False
    colour_of: dict = {}
    for i, rank in enumerate(ranks):
        named = rank == first
        if not named and i % stride:
            continue
        colour = colour_of[rank] = NAMED_COLOUR if named else (PALETTE[i % len(PALETTE)] if few else "#8a9a9a")
        if named or few:
            label = f"rank {rank}" + (" (named)" if named else "")
        else:  # one legend entry for the grey crowd
            label = "_nolegend_" if labelled else f"other ranks ({others} of {len(ranks) - 1} drawn)"
            labelled = True
        line, = ax.plot(x, vals[i], marker="o", markersize=3.5 if named else 2.5, linewidth=2.4 if named else 1.0,
                        color=colour, alpha=1.0 if named else 0.8, zorder=4 if named else 2, label=label)
        line.set_gid(f"curve-r{rank}")
    fin = vals[np.isfinite(vals)]
    if fin.size and fin.min() > 0 and fin.max() / fin.min() > 30:
        ax.set_yscale("log")
    top = blended_transform_factory(ax.transData, ax.transAxes)
    marks = missing_marks = 0
    stacked: dict = {}  # (step, kind) -> marks already there: several ranks at one step stack up
    for i, rank in enumerate(ranks):
        for j, v in enumerate(raw[i]):
            if isinstance(v, str) and marks < MAX_MARKS:  # "nan" / "inf" / "-inf"
                k = stacked[(j, "bad")] = stacked.get((j, "bad"), -1) + 1
                yk = 0.94 - 0.12 * (k % 6)
                m, = ax.plot([steps[j]], [yk], transform=top, marker="X", markersize=11, color=NAN_COLOUR,
                             linestyle="none", clip_on=False, zorder=6)
                m.set_gid(f"nonfinite-r{rank}-s{steps[j]}")
                ax.text(steps[j] + 0.08, yk, f"{'NaN' if v == 'nan' else v.replace('inf', 'Inf')}\nrank {rank}",
                        transform=top, ha="left", va="center", fontsize=8, color=NAN_COLOUR, zorder=6)
                marks += 1
            elif v is None and missing_marks < MAX_MARKS:
                k = stacked[(j, "gap")] = stacked.get((j, "gap"), -1) + 1
                m, = ax.plot([steps[j]], [0.04 + 0.06 * (k % 8)], transform=top, marker="o", markersize=8,
                             markerfacecolor="white", markeredgewidth=1.8, markeredgecolor=colour_of.get(rank, "#555"),
                             linestyle="none", clip_on=False, zorder=6)
                m.set_gid(f"missing-r{rank}-s{steps[j]}")
                missing_marks += 1
    if marks or missing_marks:  # room above and below the data for the marks
        lo, hi = ax.get_ylim()
        if ax.get_yscale() == "log":
            ax.set_ylim(lo / (hi / lo) ** 0.15, hi * (hi / lo) ** 0.3)
        else:
            ax.set_ylim(lo - 0.12 * (hi - lo), hi + 0.3 * (hi - lo))
    handles, _ = ax.get_legend_handles_labels()
    if isinstance(step, int):
        div = ax.axvline(step, color="black", linestyle="--", linewidth=1.3, zorder=3)
        div.set_gid("divergence-marker")
        handles.append(Line2D([], [], color="black", linestyle="--", label=f"divergence (step {step})"))
    if marks:
        handles.append(Line2D([], [], marker="X", color=NAN_COLOUR, linestyle="none", label="NaN/Inf value"))
    if missing_marks:
        handles.append(Line2D([], [], marker="o", markerfacecolor="white", markeredgecolor="#555",
                              linestyle="none", label="not reported (rank's colour)"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_xlim(steps[0] - 0.5, steps[-1] + 0.5)
    _int_ticks(ax, "x", steps, steps, 30)
    ax.grid(True, color="#eee", linewidth=0.6)
    ax.set_title(title, loc="left")
    return to_svg(fig)


def scale_svg(scale: dict, incident: dict) -> str | None:
    """The loss scale over steps (a step function through its changes, log 2 axis), its
    overflow steps marked and the verdict's step drawn: how the scaler got there."""
    changes = [(int(st), float(v)) for st, v in scale.get("scale_changes") or [] if v and v > 0]
    if not changes:
        return None
    overflows = [(int(o["step"]), float(o["scale"])) for o in scale.get("recent_overflows") or []
                 if o.get("scale")]
    step = incident.get("step")
    last = max([changes[-1][0], *(s for s, _ in overflows), *([step] if isinstance(step, int) else [])])
    xs = [s for s, _ in changes] + [last]
    ys = [v for _, v in changes] + [changes[-1][1]]
    fig = figure(9.0, 2.8)
    ax = fig.add_subplot()
    ax.step(xs, ys, where="post", color="#2f6f8f", linewidth=1.6, label="loss scale")
    if overflows:
        ax.plot([s for s, _ in overflows], [v for _, v in overflows], "x", color=NAMED_COLOUR, markersize=7,
                label=f"overflow, update skipped (newest {len(overflows)})")
    if isinstance(step, int):
        ax.axvline(step, color="#555555", linestyle="--", linewidth=1.0)
    ax.set_yscale("log", base=2)
    from matplotlib.ticker import MaxNLocator
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    ax.set_xlabel("step")
    ax.set_ylabel("loss scale")
    ax.set_title("Loss scale (float16)")
    ax.legend(loc="best", fontsize=8)
    return to_svg(fig)
