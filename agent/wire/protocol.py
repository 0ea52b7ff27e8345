"""rankscope's wire protocol: message types, encoding, and a validating decoder.

Every frame is one msgpack map (the *envelope*)::

    {"v": PROTOCOL_VERSION, "t": <type>, "job": <job id>, "src": <sender>, "seq": <int>, "b": <body>}

``src`` is the sender's identity (``"rank:3"``, ``"agent:<host>"``, ``"coordinator"``) and
``seq`` a per-sender counter, so a receiver can drop replays (the node agent replays its
spool after a coordinator restart). Bodies are maps checked against :data:`SCHEMAS`.
NumPy arrays travel as ``{"d": dtype, "s": shape, "b": raw bytes}`` and only numeric
dtypes are accepted; the decoder checks that the byte length matches dtype x shape.

No pickle anywhere, and msgpack extension types are refused: a frame can only ever
decode to maps, lists, strings, bytes and numbers. Transport (sockets, CURVE) lives in
``rankscope.wire.transport``; this module does no I/O, so it is tested with plain bytes.
"""
from __future__ import annotations

import collections
import logging
import math
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from rankscope.wire import capture_values, layout_facts, rerun_facts
from rankscope.wire.columns import MAX_KIND, STEP_COLS, STEP_TAIL, check_names, pack_steps, unpack_steps
from rankscope.wire.errors import ProtocolError
from rankscope.wire.records import StepBatch
from rankscope.wire.replay import ReplayFilter, SeqCounter  # noqa: F401 (their home was here)
from rankscope.wire.sync import SyncPoint

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
#: Frame cap. Also set as the socket's ZMQ MAXMSGSIZE so libzmq drops larger frames
#: before they are even buffered.
MAX_FRAME_BYTES = 64 * 1024 * 1024
BUNDLE_CHUNK_BYTES = 1024 * 1024

# Message types.
REGISTER = "register"  # rank -> agent -> coordinator
REGISTERED = "registered"  # agent -> rank: the id it must use
STEP = "step"  # rank -> agent -> coordinator
STEPS = "steps"  # agent -> ingest shard: several ranks' STEPs in one frame (wire.step_pack)
HEARTBEAT = "heartbeat"  # rank -> agent -> coordinator
RANK_LOST = "rank_lost"  # agent -> coordinator
RANK_MAP = "rank_map"  # agent -> coordinator
BUNDLE_CHUNK = "bundle_chunk"  # rank/agent -> coordinator
CONTROL = "control"  # coordinator -> agent -> rank
STATUS = "status"  # any -> any, free-form small report (e.g. control acknowledged)

CONTROL_COMMANDS = frozenset({"pause", "resume", "step", "terminate", "export", "collect", "stacks", "capture"})

_NUMERIC_KINDS = frozenset("biuf")  # bool, signed, unsigned, float; never object/str/void
_INT = (int,)
_NUM = (int, float)

# field -> (accepted python types, required). ``None`` in the types tuple allows nil.
_Schema = dict[str, tuple[tuple[type, ...], bool]]
SCHEMAS: dict[str, _Schema] = {
    REGISTER: {
        "host": ((str,), True), "pid": (_INT, True), "claimed_rank": ((int, type(None)), True),
        "world_size": ((int, type(None)), False), "dp_index": ((int, type(None)), False),
        "dp_size": ((int, type(None)), False),
        "device_id": ((int, type(None)), False), "local_rank": ((int, type(None)), False),
        "versions": ((dict,), False), "label": ((str,), False), "stacks_file": ((str,), False),
        # True: the rank will say what it sees of the job's parallel layout (STATUS layout)
        # before its first step, and that step waits for it.
        "layout": ((bool,), False),
        # Set by the node agent when it forwards a registration: the id after remapping.
        "assigned_rank": ((int, type(None)), False),
    },
    REGISTERED: {"assigned_rank": (_INT, True), "claimed_rank": ((int, type(None)), True),
                 "remapped": ((bool,), True),
                 # The coordinator's cluster-wide choice, relayed when it made one.
                 "on_terminate": ((str,), False)},
    STEP: {
        "rank": (_INT, True), "step": (_INT, True), "token": (_INT, False),
        "wall_time": (_NUM, False), "new_names": ((dict,), True), "cols": ((dict,), True),
    },
    # parts: per rank's STEP (one row each) its src, seq, rank, step, token, row count, wall
    # time and new names (PART_FIELDS); cols: the parts' columns one after the other; each
    # packed in one bytes field (wire.columns, which checks the body whole).
    STEPS: {"k": (_INT, True), "n": (_INT, True), "head": ((bytes,), True), "cols": ((bytes,), True),
            "src": ((list,), True), "names": ((list,), True)},
    HEARTBEAT: {"rank": (_INT, True), "step": (_INT, True), "state": ((str,), True),
                "pid": (_INT, False), "sync": ((dict, type(None)), False), "dropped": (_INT, False),
                # started: the step the rank last began; hold_at: the step it was told to
                # pause before (the job's consistent cut), when it has one.
                "started": (_INT, False), "hold_at": (_INT, False)},
    # died_at: the agent's wall clock when it saw the death; signal: the fatal signal when
    # the process was killed by one; exception: what the rank said it died of; sync: its
    # last sync point (wire.sync) as the agent heard it.
    RANK_LOST: {"rank": (_INT, True), "pid": (_INT, True), "last_step": (_INT, True),
                "exit_status": ((int, type(None)), True), "reason": ((str,), True),
                "died_at": (_NUM, False), "signal": ((int, type(None)), False),
                "exception": ((str,), False), "sync": ((dict, type(None)), False),
                # position: {"step", "token"} the rank last began (wire.position), when known.
                "position": ((dict,), False)},
    RANK_MAP: {"entries": ((list,), True)},
    BUNDLE_CHUNK: {
        "rank": (_INT, True), "transfer": ((str,), True), "path": ((str,), True),
        "offset": (_INT, True), "data": ((bytes,), True), "size": (_INT, True),
        "final": ((bool,), True), "sha256": ((str, type(None)), False),
        "incomplete": ((bool,), False), "on_behalf": ((bool,), False),
    },
    CONTROL: {"command": ((str,), True), "args": ((dict,), False),
              "incident": ((str, type(None)), False), "target": ((int, type(None)), False)},
    STATUS: {"what": ((str,), True), "detail": ((dict,), False)},
}

#: STATUS ``watch``: how a rank is watched, said once per rank (probe.watch).
WATCH_DETAIL: _Schema = {"rank": ((int, type(None)), True), "mode": ((str,), True),
                         "how": ((str,), True), "reason": ((str,), True), "rerun": ((str,), False),
                         # what the watch costs (probe.vitals.vital): said again when its plan changes
                         "cost": ((dict,), False)}
#: ``cost``: the tier, the budget (share of a step), K (weights fingerprinted every K
#: steps), the measured share, bytes copied or moved to the host and bytes read a step,
#: and whether the per-Cell hooks were kept ("on"/"off", None while measured) with their
#: measured share of a step.
WATCH_COST: _Schema = {"tier": ((str,), True), "budget": ((float, int), False), "every": ((int, type(None)), False),
                       "share": ((float, int, type(None)), False), "host_bytes": (_INT, False),
                       "read_bytes": (_INT, False), "cells": ((str, type(None)), False),
                       "cells_share": ((float, int, type(None)), False)}
WATCH_TEXT_MAX = 300
#: STATUS ``dump``: what of a rank's local dump stays on disk (dump.retention), said when
#: it first removes a step and when the rank closes.
DUMP_DETAIL: _Schema = {"rank": ((int,), True), "kept_from": ((int,), True), "kept_to": ((int,), True),
                        "kept": ((int,), True), "removed": ((int,), True), "removed_through": ((int,), True),
                        "bytes": ((int,), True), "files": ((int,), True), "why": ((str,), True)}


@dataclass
class Message:
    type: str
    job: str
    src: str
    seq: int
    body: dict[str, Any] = field(default_factory=dict)


def encode(msg: Message) -> bytes:
    """Serialise a message; bodies may hold numpy arrays (encoded as typed bytes)."""
    body = pack_steps(msg.body) if msg.type == STEPS else msg.body
    env = {"v": PROTOCOL_VERSION, "t": msg.type, "job": msg.job, "src": msg.src,
           "seq": msg.seq, "b": body}
    return msgpack.packb(env, default=_pack_default, use_bin_type=True)


def _pack_default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        arr = np.ascontiguousarray(obj)
        return {"d": arr.dtype.str, "s": list(arr.shape), "b": arr.tobytes()}
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot encode {type(obj).__name__} on the wire")


_ACCEPTED_DTYPES: dict[str, np.dtype] = {}


def decode_array(obj: Any, what: str) -> np.ndarray:
    """Rebuild an array, refusing non-numeric dtypes and byte counts that do not fit."""
    if not isinstance(obj, dict) or set(obj) != {"d", "s", "b"}:
        raise ProtocolError("bad_array", f"{what}: not an array object")
    dstr, shape, raw = obj["d"], obj["s"], obj["b"]
    if not isinstance(dstr, str) or not isinstance(shape, list) or not isinstance(raw, bytes):
        raise ProtocolError("bad_array", f"{what}: wrong field types")
    dtype = _ACCEPTED_DTYPES.get(dstr)
    if dtype is None:
        if len(dstr) > 16:  # every numeric dtype string is short; "(10**9,)f8" is not
            raise ProtocolError("bad_dtype", f"{what}: {dstr[:20]!r}...")
        try:
            dtype = np.dtype(dstr)
        except Exception as exc:  # TypeError mostly, ValueError for some sub-array forms
            raise ProtocolError("bad_dtype", f"{what}: {dstr!r}") from exc
        if dtype.kind not in _NUMERIC_KINDS or dtype.hasobject or dtype.fields is not None:
            raise ProtocolError("bad_dtype", f"{what}: non-numeric dtype {dstr!r}")
        # Parsing a dtype string costs more than the rest of the array check; only a
        # handful of accepted ones ever occur, so remember them (bounded: a peer cannot grow it).
        if len(_ACCEPTED_DTYPES) < 64:
            _ACCEPTED_DTYPES[dstr] = dtype
    if len(shape) > 8 or not all(isinstance(d, int) and 0 <= d for d in shape):
        raise ProtocolError("bad_shape", f"{what}: {shape!r}")
    expected = dtype.itemsize * math.prod(shape)
    if expected != len(raw):
        raise ProtocolError("bad_shape", f"{what}: {len(raw)} bytes for {dstr}{shape} (want {expected})")
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


class Decoder:
    """Validates frames; keeps per-reason rejection counts instead of raising into callers.

    ``job=None`` accepts any job (the coordinator serving several jobs); otherwise a
    frame for another job is rejected.
    """

    def __init__(self, job: str | None = None, max_frame: int = MAX_FRAME_BYTES) -> None:
        self.job = job
        self.max_frame = max_frame
        self.rejected: collections.Counter[str] = collections.Counter()
        self.accepted = 0

    def decode(self, frame: bytes) -> Message | None:
        """Return the message, or None after counting and logging why it was refused."""
        try:
            msg = self.decode_or_raise(frame)
        except ProtocolError as exc:
            self._reject(exc)
            return None
        except Exception as exc:  # a check we did not foresee must still not crash the reader
            self._reject(ProtocolError("malformed", f"{type(exc).__name__}: {str(exc)[:80]}"))
            return None
        self.accepted += 1
        return msg

    def _reject(self, exc: ProtocolError) -> None:
        self.rejected[exc.reason] += 1
        # Rate-limit: a fuzzer or a stray client must not flood the log.
        if self.rejected[exc.reason] <= 5 or self.rejected[exc.reason] % 1000 == 0:
            log.warning("rejected frame (%s, total %d)", exc, self.rejected[exc.reason])

    def decode_or_raise(self, frame: bytes) -> Message:
        if not isinstance(frame, (bytes, bytearray, memoryview)):
            raise ProtocolError("not_bytes")
        if len(frame) > self.max_frame:
            raise ProtocolError("oversized", f"{len(frame)} > {self.max_frame} bytes")
        lim = self.max_frame
        try:
            env = msgpack.unpackb(
                frame, raw=False, strict_map_key=False, use_list=True,
                max_bin_len=lim, max_str_len=min(lim, 1 << 20), max_array_len=1 << 20,
                max_map_len=1 << 20, max_ext_len=0, ext_hook=_refuse_ext,
            )
        except ProtocolError:
            raise
        except Exception as exc:  # msgpack raises many types on garbage
            raise ProtocolError("malformed", type(exc).__name__) from None
        if not isinstance(env, dict):
            raise ProtocolError("malformed", "envelope is not a map")
        if env.get("v") != PROTOCOL_VERSION:
            raise ProtocolError("bad_version", repr(env.get("v")))
        mtype, job, src, seq, body = (env.get(k) for k in ("t", "job", "src", "seq", "b"))
        if mtype not in SCHEMAS:
            raise ProtocolError("unknown_type", repr(mtype)[:40])
        if not isinstance(job, str) or not isinstance(src, str):
            raise ProtocolError("bad_envelope", "job/src must be strings")
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
            raise ProtocolError("bad_envelope", "seq must be a non-negative int")
        if self.job is not None and job != self.job:
            raise ProtocolError("wrong_job", f"{job!r} != {self.job!r}")
        if not isinstance(body, dict):
            raise ProtocolError("bad_body", "body is not a map")
        _check_body(mtype, body)
        if mtype == STEP:
            _check_cols(body["cols"], "step")
            check_names(body["new_names"], "step")
        elif mtype == STEPS:
            unpack_steps(body)
        elif mtype == CONTROL and body["command"] not in CONTROL_COMMANDS:
            raise ProtocolError("bad_field", f"control.command {body['command']!r}")
        elif mtype == STATUS and body["what"] == "watch":
            _check_watch(body.get("detail"))
        elif mtype == STATUS and body["what"] == "dump":
            _check_dump(body.get("detail"))
        elif mtype == STATUS and body["what"] == layout_facts.WHAT:
            layout_facts.check_detail(body.get("detail"))
        elif mtype == STATUS and body["what"] == rerun_facts.WHAT:
            rerun_facts.check_detail(body.get("detail"))
        elif mtype == STATUS and body["what"] == capture_values.WHAT:
            capture_values.check_detail(body.get("detail"))
        elif mtype in (HEARTBEAT, RANK_LOST) and body.get("sync") is not None \
                and SyncPoint.from_wire(body["sync"]) is None:
            raise ProtocolError("bad_field", f"{mtype}.sync is not a sync point")
        return Message(mtype, job, src, seq, body)


def _refuse_ext(code: int, data: bytes) -> Any:
    raise ProtocolError("ext_type", f"msgpack extension type {code} is not allowed")


def _check_body(mtype: str, body: dict) -> None:
    _check_body_against(mtype, SCHEMAS[mtype], body)


def _check_body_against(mtype: str, schema: _Schema, body: dict) -> None:
    for key in body:
        if key not in schema:
            raise ProtocolError("bad_field", f"{mtype}.{key!s:.40} is not a known field")
    for key, (types, required) in schema.items():
        if key not in body:
            if required:
                raise ProtocolError("missing_field", f"{mtype}.{key}")
            continue
        val = body[key]
        # bool is an int subclass; only accept it where bool is named.
        if isinstance(val, bool) and bool not in types:
            raise ProtocolError("bad_field", f"{mtype}.{key} is a bool")
        if not isinstance(val, types):
            raise ProtocolError("bad_field", f"{mtype}.{key} is {type(val).__name__}")


def _check_watch(detail: Any) -> None:
    if not isinstance(detail, dict):
        raise ProtocolError("bad_field", "status.watch needs a detail map")
    _check_body_against("status.watch", WATCH_DETAIL, detail)
    if "cost" in detail:
        _check_body_against("status.watch.cost", WATCH_COST, detail["cost"])
    for key in ("mode", "how", "reason", "rerun"):
        if len(detail.get(key, "")) > WATCH_TEXT_MAX:
            raise ProtocolError("bad_field", f"status.watch.{key} is longer than {WATCH_TEXT_MAX}")


def _check_dump(detail: Any) -> None:
    if not isinstance(detail, dict):
        raise ProtocolError("bad_field", "status.dump needs a detail map")
    _check_body_against("status.dump", DUMP_DETAIL, detail)
    if len(detail["why"]) > WATCH_TEXT_MAX:
        raise ProtocolError("bad_field", f"status.dump.why is longer than {WATCH_TEXT_MAX}")


#: Per column: (name, dtype string, dtype, trailing shape).
_STEP_SPECS = tuple((name, dstr, np.dtype(dstr), STEP_TAIL[name]) for name, (dstr, _) in STEP_COLS.items())
_STEP_NAMES = frozenset(STEP_COLS)
_ARRAY_KEYS = frozenset({"d", "s", "b"})


def _check_cols(cols: dict, what: str) -> int:
    """Check columns in place (each becomes its array); returns the row count."""
    if cols.keys() != _STEP_NAMES:
        raise ProtocolError("bad_field", f"{what}.cols has {sorted(map(str, cols))[:10]}")
    n = -1
    for name, dstr, dtype, tail in _STEP_SPECS:
        obj = cols[name]
        if type(obj) is dict and obj.keys() == _ARRAY_KEYS and obj["d"] == dstr \
                and type(shape := obj["s"]) is list and type(raw := obj["b"]) is bytes:
            # The array a probe sends: checked with comparisons and viewed without a copy,
            # no dtype parse (decode_array's), which was most of a frame's cost.
            if len(shape) != 1 + len(tail) or type(shape[0]) is not int or shape[0] < 0 \
                    or (tail and (type(shape[1]) is not int or shape[1] != tail[0])) \
                    or len(raw) != dtype.itemsize * shape[0] * (tail[0] if tail else 1):
                raise ProtocolError("bad_shape", f"{what}.cols.{name}: {len(raw)} bytes for {dstr}{shape!r:.40}")
            arr = np.frombuffer(raw, dtype=dtype)
            if tail:
                arr = arr.reshape(shape[0], *tail)
        else:
            arr = decode_array(obj, f"{what}.cols.{name}")
            if arr.dtype.str != dstr or arr.shape[1:] != tail or arr.ndim != 1 + len(tail):
                raise ProtocolError("bad_shape", f"{what}.cols.{name}: {arr.dtype.str}{arr.shape}")
        if n < 0:
            n = arr.shape[0]
        elif arr.shape[0] != n:
            raise ProtocolError("bad_shape", f"{what}.cols.{name}: {arr.shape[0]} rows, want {n}")
        cols[name] = arr
    # A kind the detectors do not know would make StepBatch.validate() fail downstream.
    if n and int(cols["kinds"].max()) > MAX_KIND:
        raise ProtocolError("bad_field", f"{what}.cols.kinds: unknown kind {int(cols['kinds'].max())}")
    return n


# --- StepBatch <-> message ---------------------------------------------------------

def step_message(batch: StepBatch, src: str, seq: int) -> Message:
    cols = {name: getattr(batch, name) for name in STEP_COLS}
    body = {"rank": batch.rank, "step": batch.step, "token": batch.token,
            "wall_time": float(batch.wall_time), "new_names": dict(batch.new_names), "cols": cols}
    return Message(STEP, batch.job, src, seq, body)


def step_from_message(msg: Message) -> StepBatch:
    """Build a StepBatch from a *decoded* (validated) step message."""
    b = msg.body
    cols = b["cols"]
    return StepBatch(job=msg.job, rank=b["rank"], step=b["step"], new_names=dict(b["new_names"]),
                     token=b.get("token", -1), wall_time=float(b.get("wall_time", 0.0)),
                     **{name: cols[name] for name in STEP_COLS})


def ack_message(replay: ReplayFilter, seq: int, job: str = "", src: str = "coordinator") -> Message:
    """What a coordinator sends a node agent to confirm delivery: its replay filter's
    high-water marks ("job|src" -> seq). The agent then trims those frames from its spool
    instead of keeping them for its age-based replay window."""
    return Message(STATUS, job, src, seq, {"what": "ack", "detail": {"high": replay.state()}})
