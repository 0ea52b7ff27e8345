"""A job stopped from outside is not a rank that failed first.

A scheduler's time limit or preemption (Slurm sends SIGTERM to every task), a server
shutting its workers down at its own exit, Ctrl-C forwarded by a launcher: every rank
dies by a stop signal at once and none of them caused it. Judged as a crash, the lowest
rank would be "the first to fail" and the others its followers: blame for a victim.
So when every member still running dies by a stop signal within ``STOP_TOGETHER_S`` of
the others, and none was left behind at a collective its peers reached (that one is a
cause whoever stopped the job), it is a stop: no verdict, and the coverage says where
the job was stopped. SIGKILL is not a stop signal: alone it is the OOM killer or a
deliberate kill of one rank, and after another rank's death it is a launcher's teardown;
both are judged as failures.

Pure logic: rank records and deaths in, a description out.
"""
from __future__ import annotations

import signal
from typing import Any, Iterable

from rankscope.coordinator.logic.align.aligner import LIVE_STATES, RankRecord, RankState

STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
#: How close together the stop signals of one stop land (a server terminating its workers
#: one after another, an agent noticing each death on its next look).
STOP_TOGETHER_S = 1.0


def is_stop(deaths: Iterable[tuple[int, int | None, float]], members: Iterable[RankRecord]) -> bool:
    """``deaths``: (rank, signal, died_at) of one episode. True when they are every live
    member's death, each by a stop signal, all within :data:`STOP_TOGETHER_S`."""
    deaths = list(deaths)
    if not deaths or any(sig not in STOP_SIGNALS for _, sig, _ in deaths):
        return False
    times = [at for _, _, at in deaths]
    if max(times) - min(times) > STOP_TOGETHER_S:
        return False
    dead = {rank for rank, _, _ in deaths}
    # A member that never said a word (only expected from the world size) is no survivor.
    return not any(m.rank not in dead and m.state in LIVE_STATES and m.info.get("pid") is not None
                   for m in members)


def stop_of(records: Iterable[RankRecord]) -> dict[str, Any] | None:
    """Where a job was stopped from outside, from its ranks' records: the ranks, the
    signal, the newest step any of them handed over; None when it was not stopped so."""
    records = list(records)
    lost = [r for r in records if r.state is RankState.LOST and r.death]
    deaths = [(r.rank, r.death.get("signal"), float(r.death.get("died_at") or 0.0)) for r in lost]
    if not is_stop(deaths, records):
        return None
    sig = {s for _, s, _ in deaths}
    return {"ranks": sorted(r.rank for r in lost),
            "signal": signal.Signals(sig.pop()).name if len(sig) == 1 else "stop signals",
            "after_step": max(r.last_step for r in lost)}
