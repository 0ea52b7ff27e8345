"""Saying, once per rank, how the rank is watched -- or that it is not, and why.

A compiled step cannot carry hooks, so what rankscope sees depends on the mode each
step ran in. The first step end (or the end of the run, if no step was ever seen) says
it in one line: on the rank's stderr (its log under msrun), and as a STATUS
``{"what": "watch", "detail": {"rank", "mode", "how", "reason"}}`` to the node agent,
which the coordinator keeps per rank for ``rankscope launch`` and incident.json.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable

from rankscope.wire import rerun_facts
from rankscope.text.watch_line import (
    GRAPH,
    JIT,
    PYNATIVE,
    UNWATCHED,
    cost_text,
    launch_prints_it,
    plan_of,
    watch_line,
)


@dataclass
class Watch:
    mode: str
    how: str
    reason: str = ""
    #: Where an anomalous step cannot be re-run (the optimizer compiled with the backward).
    rerun: str = ""
    #: The tier and what it costs (rankscope.probe.vitals.vital.VitalSigns.cost), when known.
    cost: dict | None = None

    def line(self, rank: Any) -> str:
        return watch_line(rank, self.mode, self.how, self.reason, rerun=self.rerun, cost=self.cost)

    def detail(self, rank: Any) -> dict:
        d = {"rank": rank, "mode": self.mode, "how": self.how, "reason": self.reason, "rerun": self.rerun}
        if self.cost:
            d["cost"] = dict(self.cost)
        return d


#: Why nothing inside a PIJit call is seen: rankscope keeps out of the frames PIJit
#: captures (any Python of its own there changes the graph PIJit builds), and PIJit's
#: graph runs are not kernel-dumped.
PIJIT_UNSEEN = "nothing inside jit(capture_mode=\"bytecode\") calls is seen: rankscope stays out of them"


#: Why a rank's own gradient fault can go unseen: gradients reduced by the script itself
#: (ops.AllReduce, a custom Cell) are recorded as the optimizer gets them, after the
#: reduction made them the same on every replica. The backward's own gradients are still
#: seen by the Cell hooks; what the script does to them on the way (clipping, scaling,
#: its reduction) is not.
GRADS_UNSEEN = ("no nn.DistributedGradReducer: the optimizer's gradients are recorded after the script's "
                "own reduction, and what the script does to a rank's gradients before it is not seen")


class WatchReporter:
    """Decides the rank's watch line from what the probe saw, and says it once."""

    def __init__(self) -> None:
        self.said: Watch | None = None
        self.graph_steps = 0
        self.jit_steps = 0  # PyNative steps made by an @ms.jit function
        self.eager_steps = 0
        self.jit_compiles = 0
        self.pijit_calls = 0  # calls of jit(capture_mode="bytecode") functions
        self.kernel_dump: str | None = None  # how the kernel dump is set, or None
        self.kernel_problem = ""  # why the kernel dump is not available
        self.eager_unseen = ""  # why eager steps get no hooks (the level), or ""
        self.silent = False  # handed over to the script's own debugger, which will say it
        self.serving: str | None = None  # class of the forward-only model found, if any
        self.grads_unseen = ""  # GRADS_UNSEEN when a multi-rank step reduced without a reducer
        #: The watch's tier and cost now (set by the debugger), said with the line and
        #: again whenever its plan (K) changes.
        self.cost_of: Callable[[], dict | None] = lambda: None
        self._plan_said: tuple | None = None

    def current(self) -> Watch:
        if self.jit_steps:
            note = rerun_facts.watch_note(JIT)
            if self.kernel_dump:
                return Watch(JIT, f"the kernel dump ({self.kernel_dump}) for its @ms.jit step and step sentinels",
                             rerun=note)
            return Watch(JIT, "step sentinels only (parameters, loss)", self.kernel_problem or "kernel dump off",
                         rerun=note)
        if self.graph_steps:
            note = rerun_facts.watch_note(GRAPH)
            if self.kernel_dump:
                return Watch(GRAPH, f"the kernel dump ({self.kernel_dump}) and step sentinels", rerun=note)
            why = self.kernel_problem or "kernel dump off"
            return Watch(GRAPH, "step sentinels only (parameters, loss)", why, rerun=note)
        if self.eager_steps:
            if self.jit_compiles:
                how = "hooks" + (" + the kernel dump for its jit parts" if self.kernel_dump
                                 else "; its jit parts are not watched")
                return Watch(JIT, how, "" if self.kernel_dump else self.kernel_problem)
            if self.pijit_calls:
                return Watch(JIT, "hooks outside its jit(capture_mode=\"bytecode\") functions", PIJIT_UNSEEN)
            if self.eager_unseen:
                return Watch(PYNATIVE, "step sentinels only (parameters, loss)", self.eager_unseen)
            if self.serving:
                return Watch(PYNATIVE, f"hooks on serving model {self.serving} (forward-only, "
                             "one step per request batch)")
            return Watch(PYNATIVE, "hooks", self.grads_unseen)
        if self.jit_compiles:
            return Watch(JIT, UNWATCHED, "the optimizer runs inside an @ms.jit function, so no step "
                         "boundary is visible from Python; the run went on untouched")
        if self.serving:
            return Watch(GRAPH, UNWATCHED, f"serving model {self.serving} runs compiled (GRAPH mode): "
                         "forward-only compiled serving is not watched")
        return Watch("unknown", UNWATCHED, "no training step was recognised (no optimizer was called "
                     "from Python and no compiled Cell containing one ran) and no serving model was "
                     "called forward from Python")

    def say(self, rank: Any, client: Any = None, final: bool = False) -> Watch | None:
        """Say the line now if not said yet (``final``: also when nothing was seen)."""
        if self.silent or self.said is not None or \
                (not final and not (self.graph_steps or self.eager_steps or self.jit_steps)):
            return None
        w = self.said = self.current()
        w.cost = self._cost()
        self._plan_said = plan_of(w.cost)
        return self._send(w, rank, client)

    def say_cost(self, rank: Any, client: Any = None, final: bool = False) -> Watch | None:
        """Tell the node agent the watch's cost again when its plan changed (K), and
        ``final``ly its last measured cost. The rank's own log has its watch line once;
        a run with no node agent gets the measured cost in one more line at its end."""
        w = self.said
        if w is None or self.silent or w.how == UNWATCHED:
            return None
        cost = self._cost()
        if plan_of(cost) == self._plan_said and not final:
            return None
        w.cost, self._plan_said = cost, plan_of(cost)
        sent = self._send(w, rank, client, quiet=True)
        if final and client is None and isinstance((cost or {}).get("share"), (int, float)):
            who = f"rank {rank}" if rank is not None else "this process"
            print(f"[rankscope] {who}'s watch cost: {cost_text(cost)}", file=sys.stderr, flush=True)
        return sent

    def _cost(self) -> dict | None:
        try:
            return self.cost_of()
        except Exception:  # noqa: BLE001 - the line stands without its cost
            return None

    def _send(self, w: Watch, rank: Any, client: Any, quiet: bool = False) -> Watch:
        sent = False
        if client is not None:
            try:
                client.state.outbox.put_nowait(("status", {"what": "watch", "detail": w.detail(rank)}))
                sent = True
            except Exception:  # noqa: BLE001 - a full outbox: the log line stands
                pass
        if not quiet and not (sent and launch_prints_it(sys.stderr)):  # launch would print the same line
            print(f"[rankscope] {w.line(rank)}", file=sys.stderr, flush=True)
        return w
