"""Re-run an anomalous step in the rank, before its gradients are reduced.

A ``value_and_grad`` function is where a PyNative step's forward and backward happen,
and what it returns is what the gradient reduction and the optimizer take next. So the
wrapper around it (:mod:`rankscope.probe.vitals.sentinel_patches`) hands each call here: the
call runs as it would unwatched, then :class:`AnomalyGate` looks at the loss and the
squared norm of the gradients it returned. Only when they are anomalous is the call made
once more, with the same inputs, the parameters the optimizer has not touched yet, and
the RNG state put back; recording is muted while it runs, and buffers the forward
updates in place (BatchNorm's moving statistics) are put back after it, so the re-run
leaves nothing behind. Healthy steps pay for reading one scalar and one sum per gradient.

A step is not re-run where that would change what the job does: when the function ran a
collective (its peers would not join a second call: a tensor- or pipeline-parallel
forward), or when the job runs collectives in groups of its own that compiled code may
call; the rank says so (outcome ``not_possible``). Nor, quietly, after the first step of
a streak of anomalous steps, past :data:`MAX_RERUNS`, or when a weight the step started
from is already NaN or Inf: an earlier reduction spread a fault to every rank, and
re-running each of them tells nothing.
"""
from __future__ import annotations

import sys
from typing import Any, Callable

import numpy as np

from rankscope.probe.comm import layout_probe
from rankscope.probe.rerun import forward_check, replay
from rankscope.probe.rerun.call_outputs import leaves, measure
from rankscope.probe.rerun.rerun_gate import OVERFLOW, AnomalyGate
from rankscope.probe.tensors.stats import is_tensor, to_numpy, wait_for_device
from rankscope.wire import rerun_facts as facts

#: Re-runs (and "not possible" reports) one process makes at most: a job whose every
#: step is anomalous would otherwise pay a second step each time.
MAX_RERUNS = 16


class Rerunner:
    def __init__(self, rec: Any, send: Callable[[dict], None] | None = None, policy: str = "continue",
                 enabled: bool = True, rank: Callable[[], int] = lambda: 0) -> None:
        self.rec, self.send, self.policy, self.enabled, self.rank = rec, send, policy, enabled, rank
        self.sync: Any = None  # the debugger's SyncTracker: a collective bumps its counter
        self.gate = AnomalyGate()
        self.dump_path: str | None = None  # where a re-run step's replay record goes
        self.replayer: Any = None  # in a process rankscope rerun started: replay.Replayer
        self.reruns = 0
        #: Calls that ran a collective: those could not be re-run (their peers would not join).
        self.collective_calls = 0
        self.outcomes: list[dict] = []  # what was said, newest last (bounded by MAX_RERUNS)
        self._streak = False
        self._cells: dict[int, Any] = {}  # id(function differentiated) -> its Cell
        #: Whether the job runs under a loss scale (the sentinels' LossScales.active).
        self.loss_scaled: Callable[[], bool] = lambda: False
        #: Before a re-run: puts the Cell hooks back and recording on when they were taken
        #: off, returning what undoes it (rankscope.probe.vitals.tiers), or None: re-run muted.
        self.deep: Callable[[], Callable[[], None] | None] | None = None
        #: The Cell a forward record names (CellHooks.cell_of), or None.
        self.cell_of: Callable[[str], Any] | None = None
        #: A gradient's squared norm when something already reads it once a step, else None.
        self.squared_norm: Callable[[Any], float | None] = lambda g: None

    def before(self, site: tuple[Any, Any, list[str]]) -> tuple[Any, int, Any] | None:
        """What the step's call must be re-run from: taken before it runs (a few µs; under
        ``skip``, also a copy of the buffers its forward updates, so a re-run whose result
        the step goes on with starts from the same ones)."""
        if not self.enabled:
            return None
        pre = _buffers(self._models(site)) if self.policy == "skip" else None
        return _rng_state(), getattr(self.sync, "changes", 0), pre

    def _models(self, site: tuple[Any, Any, list[str]]) -> list:
        key = id(site[0])
        if key not in self._cells:
            if len(self._cells) >= 8:
                self._cells.clear()
            self._cells[key] = _model_of(site[0], site[1])
        model = self._cells[key]
        return [model] if model is not None else []

    def after(self, inner: Callable, args: tuple, kwargs: dict, site: tuple[Any, Any, list[str]], out: Any,
              token: tuple[Any, int, Any] | None) -> Any:
        """What the step goes on with: ``out`` (the call as made), or, when it was
        anomalous, did not reproduce and ``cluster.on_transient`` is ``skip``, the re-run's.
        ``site``: the function differentiated, its weights, their names."""
        if token is None:
            return out
        if self.replayer is not None and self.replayer.matches(site[2]):
            self.replayer.run(inner, site[1])  # ends the process
        if getattr(self.sync, "changes", 0) != token[1]:
            self.collective_calls += 1
        try:
            wait_for_device()  # the step's backward, waited for in one place (not the probe's cost)
            loss, gnorm = measure(out, self.squared_norm)
            trigger = self.gate.judge(loss, gnorm)
            forward = "" if trigger else self.rec.forward_nan()
            if forward:  # made in the forward and swallowed before the loss and gradients
                trigger = f"a NaN in its forward ({forward})"
            if trigger == OVERFLOW and self.loss_scaled():
                return out  # under a loss scale: the scaler skips this update, a re-run tells nothing
            if not trigger:
                self._streak = False
                self.gate.learn(loss, gnorm)
                return out
            return self._anomalous(inner, args, kwargs, site, out, token, trigger, forward)
        except Exception as exc:  # noqa: BLE001 - the step's own result stands
            self.rec.error("re-run on anomaly", exc)
            return out

    def _anomalous(self, inner: Callable, args: tuple, kwargs: dict, site: tuple[Any, Any, list[str]], out: Any,
                   token: tuple[Any, int, Any], trigger: str, forward: str = "") -> Any:
        fn, weights, names = site
        rng, changes, pre = token
        streak, self._streak = self._streak, True
        if streak or self.reruns >= MAX_RERUNS:
            return out  # said for the first step of the streak; the cap was said when reached
        if _poisoned(weights):
            return out  # the step started from weights a reduction already spoilt: not this rank's
        self.reruns += 1
        detail = {"rank": int(self.rank()), "step": int(self.rec.step), "trigger": trigger}
        why = self._why_not(changes, rng)
        if why:
            self._tell({**detail, "outcome": facts.NOT_POSSIBLE, "why": why})
            return out
        post = _buffers(self._models(site))  # as the first execution left them
        watch = forward_check.tap(self.cell_of, self._models(site), forward) if forward else None
        watched = watch is not None and watch.placed
        try:
            again = self._again(inner, args, kwargs, rng, pre)
        finally:
            again_nan = watch.close() if watch is not None else False
        if isinstance(again, str):
            _put_back(post)
            self._tell({**detail, "outcome": facts.NOT_POSSIBLE, "why": again})
            return out
        differs = _first_difference(out, again, names)
        loss2, gnorm2 = measure(again)
        if watched:
            # The NaN never reached the outputs: whether it came again is what tells.
            reproduced = again_nan
        else:
            reproduced = not differs or bool(self.gate.judge(loss2, gnorm2))
        use = not reproduced and self.policy == "skip"
        if not use:
            _put_back(post)  # the step goes on as first made: so do its buffers
        detail = {**detail, "outcome": facts.REPRODUCED if reproduced else facts.TRANSIENT,
                  "bitwise": not differs, "differs_at": differs, "used_rerun": use}
        self._tell({**detail, "replay": self._keep(detail, args, kwargs, weights, names, out, rng)})
        return again if use else out

    def _keep(self, detail: dict, args: tuple, kwargs: dict, weights: Any, names: list[str], out: Any,
              rng: Any) -> str:
        """The step's replay record (replay.keep), or "" when none could be written."""
        if not self.dump_path:
            return ""
        try:
            return replay.keep(self.dump_path, detail, args, kwargs, weights, names, replay.first_outputs(out),
                               rng, self.gate)
        except Exception as exc:  # noqa: BLE001 - the verdict stands without it
            self.rec.error("keeping the step for a replay", exc)
            return ""

    def _why_not(self, changes: int, rng: Any) -> str:
        if getattr(self.sync, "changes", 0) != changes:
            return ("the step's gradient function ran a collective, and its peers would not join a second "
                    "call")
        if layout_probe.collectives_in_own_groups():
            return "the job runs collectives in groups of its own, which a second call on one rank would wait on"
        if rng is None:
            return "MindSpore's RNG state could not be read, so the re-run would not draw the same numbers"
        return ""

    def _again(self, inner: Callable, args: tuple, kwargs: dict, rng: Any, pre: Any) -> Any:
        """The call once more from the step's RNG state: muted, or recorded with the Cell
        hooks put back when the default watch had taken them off (``deep``) (and, under ``skip``, its
        buffers as the step began); a string says why it could not be made. The caller
        puts the buffers back as it needs them."""
        import mindspore as ms
        after = _rng_state()
        if pre is not None:
            _put_back(pre)
        undo = None
        if self.deep is not None:
            try:
                undo = self.deep()
            except Exception as exc:  # noqa: BLE001 - re-run muted, as with the hooks on
                self.rec.error("deep capture of a re-run", exc)
        dumping = self.rec.dumping
        if undo is None:
            self.rec.dumping = False
        try:
            ms.set_rng_state(rng)
            return inner(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001
            return f"the re-run raised {type(exc).__name__}: {str(exc)[:120]}"
        finally:
            if undo is not None:
                try:
                    undo()
                except Exception as exc:  # noqa: BLE001
                    self.rec.error("ending the deep capture of a re-run", exc)
            else:
                self.rec.dumping = dumping
            if after is not None:
                ms.set_rng_state(after)

    def _tell(self, detail: dict) -> None:
        facts.check_detail(detail)
        self.outcomes.append(detail)
        line = facts.classification(detail)
        if self.reruns >= MAX_RERUNS:
            line += f" (the last: {MAX_RERUNS} re-runs is this rank's limit)"
        print(f"[rankscope] {line}", file=sys.stderr, flush=True)
        if self.send is not None:
            self.send(detail)


def attach(dbg: Any) -> Rerunner:
    """The debugger's re-runner, fed by its value_and_grad functions, telling its node agent."""
    c = dbg.config.cluster

    def send(detail: dict) -> None:
        client = dbg.client
        if client is not None:
            try:
                client.state.outbox.put_nowait(("status", {"what": facts.WHAT, "detail": detail}))
            except Exception:  # noqa: BLE001 - a full outbox: the log line stands
                pass

    r = Rerunner(dbg.recorder, send=send, policy=c.on_transient, enabled=c.rerun and c.sentinels,
                 rank=lambda: dbg.rank if dbg.rank is not None else 0)
    r.sync = dbg.sync
    r.dump_path = dbg.config.dump_path
    r.replayer = replay.from_env()
    if r.replayer is not None:
        r.enabled = True  # a replay process replays whatever its config says of re-runs
    dbg.sentinels.rerun = r
    r.loss_scaled = lambda: dbg.sentinels.loss_scales.active
    r.cell_of = dbg.cells.cell_of
    # The default tier's gradient rows read each gradient's squared norm once: shared.
    r.squared_norm = lambda g: dbg.sentinels.vital.squared_norm(g) if dbg.sentinels.vital is not None \
        and not dbg.sentinels.vital.device_side else None
    return r


def _rng_state() -> Any:
    try:
        import mindspore as ms
        return ms.get_rng_state()
    except Exception:  # noqa: BLE001
        return None


def _poisoned(weights: Any) -> bool:
    """Whether a weight the step started from is already NaN or Inf (an earlier step's
    reduction spread a fault to every rank: re-running this one tells nothing)."""
    for p in (weights or ()) if not is_tensor(weights) else (weights,):
        arr, _ = to_numpy(p)
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            return True
    return False


def _model_of(fn: Any, weights: Any) -> Any:
    """The Cell a gradient function runs (whose buffers the re-run must put back)."""
    from rankscope.probe.attach.model_finder import find_model
    return find_model(fn, weights)


def _put_back(buffers: list[tuple[Any, Any]]) -> None:
    for p, saved in buffers:
        p.set_data(saved.copy())


def _buffers(models: list) -> list[tuple[Any, Any]]:
    """(parameter, copy) of every parameter no gradient trains: what a forward may update."""
    out, seen = [], set()
    for root in models:
        for p in root.get_parameters():
            if not p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                out.append((p, p.value().copy()))
    return out


def _first_difference(a: Any, b: Any, names: list[str]) -> str:
    """The first output whose bits differ between two calls' results, or ""."""
    for (label, x), (_, y) in zip(leaves(a, names), leaves(b, names)):
        ax, _ = to_numpy(x)
        ay, _ = to_numpy(y)
        if ax.shape != ay.shape or ax.dtype != ay.dtype or ax.tobytes() != ay.tobytes():
            return label
    return ""
