"""What a rank tells the coordinator after it re-ran an anomalous step (STATUS ``rerun``).

A rank whose own records for a step look wrong before its gradients are reduced runs the
step's forward and backward once more, with the same inputs, parameters and RNG state,
and says what came out (:mod:`rankscope.probe.rerun.rerun`). The detail is::

    {"rank": 2, "step": 5, "outcome": "transient", "trigger": "loss is not finite",
     "bitwise": false, "differs_at": "loss", "used_rerun": true, "why": ""}

- ``outcome``: :data:`REPRODUCED` (the re-run is anomalous too: the inputs lead there),
  :data:`TRANSIENT` (the re-run is healthy: the first execution was corrupted once) or
  :data:`NOT_POSSIBLE` (``why`` says what stopped it).
- ``bitwise``: the re-run's outputs equal the first execution's bit for bit.
- ``differs_at``: the first output that differs ("loss", "grad <parameter>"), or "".
- ``used_rerun``: the step went on with the re-run's result (``cluster.on_transient``
  ``skip``), so its gradient reduction never took the corrupted one.
- ``replay``: the folder of the step's replay record on the rank's node
  (rankscope.files.replay_files), "" when none was kept; ``rankscope rerun`` replays it.

The classification a verdict carries is :func:`classification` of this detail: one
spelling for the terminal, incident.json and the report.
"""
from __future__ import annotations

from typing import Any

from rankscope.wire.errors import ProtocolError, check_map
from rankscope.text.watch_line import GRAPH, JIT

WHAT = "rerun"
REPRODUCED = "reproduced"
TRANSIENT = "transient"
NOT_POSSIBLE = "not_possible"
OUTCOMES = (REPRODUCED, TRANSIENT, NOT_POSSIBLE)
#: What a rank does with a transient anomaly (``cluster.on_transient``): hand on what the
#: step produced (training exactly as unwatched), hand on the re-run's result, or pause.
ON_TRANSIENT = ("continue", "skip", "pause")
MAX_TEXT = 300

_FIELDS: dict[str, type | tuple[type, ...]] = {
    "rank": int, "step": int, "outcome": str, "trigger": str, "bitwise": bool, "differs_at": str,
    "used_rerun": bool, "why": str, "replay": str}
_REQUIRED = ("rank", "step", "outcome", "trigger")


def check_detail(detail: Any) -> dict[str, Any]:
    """The detail as sent, checked field by field (every error names the field)."""
    check_map(detail, "status.rerun", _FIELDS, _REQUIRED)
    for key, val in detail.items():
        if isinstance(val, str) and len(val) > MAX_TEXT:
            raise ProtocolError("bad_field", f"status.rerun.{key} is longer than {MAX_TEXT}")
        if key in ("rank", "step") and val < 0:
            raise ProtocolError("bad_field", f"status.rerun.{key} is negative")
    if detail["outcome"] not in OUTCOMES:
        raise ProtocolError("bad_field", f"status.rerun.outcome {detail['outcome']!r:.40}")
    return detail


def classification(detail: dict[str, Any]) -> str:
    """The one line a verdict adds: what the re-run says about the fault."""
    rank, step, outcome = detail["rank"], detail["step"], detail["outcome"]
    seen = f"rank {rank} saw {detail['trigger']} at step {step}"
    if outcome == REPRODUCED:
        how = "bit for bit" if detail.get("bitwise") else "not bit for bit, but as anomalous"
        return (f"reproduces: {seen}, and a re-run with the same inputs gives it again ({how}): the data or "
                "the code, unless the device is wrong every time (a replay in another process tells which)")
    if outcome == TRANSIENT:
        went = ("; the step went on with the re-run's result, so the gradient reduction never took the "
                "corrupted one, and the job runs on whatever on_divergence says (on_transient skip)"
                if detail.get("used_rerun") else "")
        where = f" (first difference: {detail['differs_at']})" if detail.get("differs_at") else ""
        return (f"transient on rank {rank}: {seen}, and a re-run with the same inputs did not reproduce it"
                f"{where}: suspect the hardware (silent data corruption){went}")
    return f"not re-run: {seen}, but {detail.get('why') or 'the step could not be re-run'}"


def compiled_why(mode: str) -> str | None:
    """Why a rank whose steps run in ``mode`` cannot re-run one; None when it can try."""
    if mode not in (GRAPH, JIT):
        return None
    return (f"its steps run compiled ({mode}), with the backward and the optimizer in one graph: nothing can be "
            "re-run before the update")


def watch_note(mode: str) -> str:
    """What the watch line of a rank whose whole step runs compiled in ``mode`` says of
    re-runs (none can be made); "" for a mode whose steps can be re-run."""
    why = compiled_why(mode)
    return f"no re-run on an anomaly: {why.removeprefix('its ')}" if why else ""


def compiled(rank: int, step: int, mode: str) -> dict[str, Any] | None:
    """What a verdict says of the re-run of a rank whose steps run compiled (``mode`` as
    its watch status says): a graph holds the backward and the optimizer together, so
    nothing can be re-run before the update. None for a rank that runs eagerly."""
    why = compiled_why(mode)
    if why is None:
        return None
    return {"rank": rank, "step": step, "outcome": NOT_POSSIBLE, "trigger": "the fault", "why": why,
            "line": f"not re-run: rank {rank}'s {why.removeprefix('its ')}"}


def not_triggered(rank: int, step: int) -> dict[str, Any]:
    """What a verdict says of a rank that steps eagerly and re-ran nothing at that step:
    nothing it saw in its own step before the update looked wrong to it. ``assumed``: an
    outcome the rank says later replaces it."""
    why = ("its own step did not look anomalous to it before the update (loss, gradient norm and the forward "
           "values it recorded), or its loop made no value_and_grad call to re-run")
    return {"rank": rank, "step": step, "outcome": NOT_POSSIBLE, "trigger": "nothing", "why": why, "assumed": True,
            "line": f"not re-run: rank {rank}'s {why.removeprefix('its ')}: the finding comes from comparing ranks "
                    "and says nothing of transient or deterministic"}


def with_reference(detail: dict[str, Any], result: dict[str, Any]) -> tuple[str, str]:
    """(class, line) once the step was also replayed in another process (``rankscope
    rerun``): ``deterministic``, ``transient``, ``rank_only`` or ``unknown``."""
    rank, step = detail["rank"], detail["step"]
    if result.get("error") or not isinstance(result.get("float32"), dict):
        return "unknown", f"not replayed: {result.get('error') or 'the replay made no call'}"
    ref = result["float32"]
    again = bool(ref.get("anomalous"))
    how = " (bit for bit)" if ref.get("bitwise") else ""
    f64 = result.get("float64")
    wide = ""
    if isinstance(f64, dict):
        wide = ("; a float64 replay agrees" if bool(f64.get("anomalous")) == again
                else "; in float64 it does not come back: float32 precision is part of it" if again
                else "; in float64 it comes back")
    elif result.get("float64_error"):
        first = str(result["float64_error"]).strip().splitlines()[0][:120]
        wide = f"; no float64 replay (MindSpore refused it: {first})"
    if detail["outcome"] == TRANSIENT:
        if again:
            return "unknown", (f"unclear: rank {rank}'s own re-run of step {step} did not reproduce it, but a replay "
                               f"here does{how}{wide}")
        return "transient", (f"transient on rank {rank}: step {step} reproduces neither on its own re-run nor on a "
                             f"replay here: suspect the hardware (silent data corruption){wide}")
    if again:
        return "deterministic", (f"deterministic: step {step} reproduces on rank {rank}'s re-run and on a replay "
                                 f"here{how}{wide}: the inputs lead there: look at the data or the code")
    return "rank_only", (f"rank {rank} only: step {step} reproduces on rank {rank}, not on a replay here with the "
                         f"same inputs and parameters: suspect the device{wide}")
