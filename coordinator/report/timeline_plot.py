"""The failure timeline of a crash or hang: when each rank reached its last collective
and when it died, on the coordinator's clock, beside the incident's own states
(detected, paused, exported, written, terminated). Seconds are counted from the first
failure, so the followers' delays read straight off the axis.
"""
from __future__ import annotations

from typing import Any

from rankscope.coordinator.report.fmt import as_float, epoch
from rankscope.coordinator.report.plots import NAMED_COLOUR, figure, to_svg
from rankscope.wire.sync import point_name


def failure_timeline_svg(incident: dict) -> str | None:
    ev, ranks = incident.get("evidence") or {}, incident.get("ranks") or {}
    if incident.get("detector") != "progress":
        return None
    t0 = as_float(ev.get("failed_at"))
    deaths = {r: as_float(s.get("died_at")) for r, s in ranks.items() if isinstance(s, dict)}
    syncs = {r: as_float((s.get("sync") or {}).get("at")) for r, s in ranks.items() if isinstance(s, dict)}
    if t0 is None:
        known = [t for t in [*deaths.values(), *syncs.values()] if t is not None]
        if not known:
            return None
        t0 = min(known)
    first = str(incident.get("first_diverging_rank"))
    order = sorted(ranks, key=lambda r: (r != first, int(r) if str(r).isdigit() else 0))
    fig = figure(10.0, max(2.6, 1.5 + 0.42 * len(order)))
    ax = fig.add_subplot()
    y = {r: i for i, r in enumerate(order)}
    for r in order:
        snap = ranks[r]
        s_at, d_at = syncs.get(r), deaths.get(r)
        if s_at is not None:
            sync = snap.get("sync") or {}
            m, = ax.plot([s_at - t0], [y[r]], marker="|", markersize=16, markeredgewidth=2.5, color="#1f4e9c",
                         linestyle="none")
            m.set_gid(f"sync-r{r}")
            ax.annotate(point_name(sync.get("what"), sync.get("seq"), sync.get("step"), sync.get("phase")),
                        (s_at - t0, y[r]), xytext=(0, 9), textcoords="offset points", ha="center", fontsize=7,
                        color="#1f4e9c")
        if d_at is not None:
            cause = r == first
            m, = ax.plot([d_at - t0], [y[r]], marker="X", markersize=12 if cause else 9,
                         color=NAMED_COLOUR if cause else "#555", linestyle="none", zorder=5)
            m.set_gid(f"death-r{r}")
            ax.annotate(_how(snap, ev if cause else {}), (d_at - t0, y[r]), xytext=(0, -14),
                        textcoords="offset points", ha="center", fontsize=7,
                        color=NAMED_COLOUR if cause else "#555")
        if s_at is not None and d_at is not None:
            ax.plot([s_at - t0, d_at - t0], [y[r], y[r]], color="#ccc", linewidth=1, zorder=1)
    events = [("detected", as_float(incident.get("detected_at_epoch")))]
    events += [(e.get("state"), epoch(e.get("at"))) for e in incident.get("timeline") or [] if isinstance(e, dict)]
    for k, (label, at) in enumerate(e for e in events if e[1] is not None):
        line = ax.axvline(at - t0, color="#2e7d32", linestyle=":", linewidth=1.2)
        line.set_gid(f"incident-{label}")
        ax.text(at - t0, 1.0 + 0.07 * (k % 3), str(label), transform=ax.get_xaxis_transform(), fontsize=7,
                color="#2e7d32", ha="center", va="bottom")
    ax.axvline(0, color=NAMED_COLOUR, linewidth=1, alpha=0.5)
    ax.set_yticks(range(len(order)), [f"rank {r}" + (" (first)" if r == first else "") for r in order])
    ax.set_ylim(len(order) - 0.4, -0.8)
    ax.set_xlabel(f"seconds after rank {first} failed (coordinator clock)")
    ax.grid(True, axis="x", color="#eee")
    lo, hi = ax.get_xlim()
    ax.set_xlim(lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo))
    ax.set_title("Failure timeline: | last collective reached, \u00d7 process ended, dotted: incident states",
                 loc="left", fontsize=9, pad=26)
    return to_svg(fig)


def _how(snap: dict, ev: dict) -> str:
    if ev.get("manner"):
        return str(ev["manner"])
    sig: Any = snap.get("signal")
    if sig:
        import signal as _signal
        try:
            return f"killed by {_signal.Signals(int(sig)).name}"
        except ValueError:
            return f"signal {sig}"
    if snap.get("exit_status") is not None:
        return f"exit status {snap['exit_status']}"
    return str(snap.get("reason") or snap.get("state") or "")
