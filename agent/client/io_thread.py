"""The client's I/O thread: the only code that touches the socket to the node agent.

Sends queued steps (carrying the names of dropped steps, or the whole table after a
reconnect), registration, heartbeats and gate transitions; applies control to the
StepGate; starts export/collect producers (:mod:`rankscope.client.transfers`) and sends what
they put on the outbox.
"""
from __future__ import annotations

import queue
import threading
import time

import zmq

from rankscope.client import transfers
from rankscope.client.state import ClientState
from rankscope.probe.gate import GateState
from rankscope.wire import protocol
from rankscope.wire.layout import dump_label, rank_to_wire
from rankscope.wire.protocol import Message, encode

#: Shortest gap between two heartbeats sent because the rank's sync point moved.
SYNC_BEAT_S = 0.2


class ClientIO:
    """The I/O thread's half of the client (owns the socket; no locks needed here)."""

    def __init__(self, client: ClientState, sock: zmq.Socket, seq: protocol.SeqCounter) -> None:
        self.c, self.sock, self.seq = client, sock, seq
        self.names: dict[int, str] = {}  # every name sent, for a resend after reconnect
        self.resend_names = False
        self.ever_connected = False
        self.next_beat = 0.0
        self.last_gate: tuple | None = None
        self.pending_out: tuple[str, dict] | None = None
        self.last_beat = 0.0
        self.sync_seen = -1
        self.decoder = protocol.Decoder(job=None)
        self.first_sent: dict | None = None  # said again to an agent that may have restarted

    def send(self, mtype: str, body: dict) -> bool:
        frame = encode(Message(mtype, self.c.job, self.c.src, self.seq(), body))
        try:
            self.sock.send(frame, zmq.NOBLOCK)
            return True
        except zmq.Again:
            return False

    def on_connect(self) -> None:
        if self.ever_connected:
            self.resend_names = True  # the agent may have restarted and lost the table
            with self.c.lock:
                if self.c.first is None and self.first_sent is not None:
                    self.c.first = self.first_sent
        self.ever_connected = True
        if self.c.claim is not None:
            self.c.want_register = True  # a restarted agent must learn who we are again
        self.next_beat = 0.0

    def receive(self) -> None:
        for _ in range(64):
            try:
                frame = self.sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            msg = self.decoder.decode(frame)
            if msg is None:
                continue
            if msg.type == protocol.REGISTERED:
                self.c.assigned = msg.body["assigned_rank"]
                self.c.remapped = msg.body["remapped"]
                if "on_terminate" in msg.body:  # the cluster's choice wins over this rank's config
                    self.c.gate.exit_on_terminate = msg.body["on_terminate"] == "exit"
                self.c.registered.set()
            elif msg.type == protocol.CONTROL:
                self.control(msg)

    def control(self, msg: Message) -> None:
        b, gate = msg.body, self.c.gate
        cmd, args, incident = b["command"], b.get("args") or {}, b.get("incident")
        at = args.get("at")
        at = at if isinstance(at, int) and not isinstance(at, bool) and at >= 0 else None
        if cmd == "pause" or (cmd == "step" and at is not None):
            # With ``at``: the job's consistent cut, the step every rank holds before.
            gate.pause(incident, at=at)
        elif cmd == "resume":
            gate.resume()
        elif cmd == "step":
            n = args.get("n", args.get("steps", 1))
            gate.run_steps(n if isinstance(n, int) and n >= 1 else 1)
        elif cmd == "terminate":
            gate.terminate(incident, str(args.get("reason", "")))
        elif cmd == "export":
            transfer = str(args.get("transfer") or incident or "export")
            threading.Thread(target=transfers.run_export, daemon=True, name="rankscope-export",
                             args=(self.c.outbox, self.c.on_export, incident, transfer,
                                   rank_to_wire(self.c.rank))).start()
        elif cmd == "capture":
            if self.c.captures is not None:
                self.c.captures.arm(args, self.c.rank)
        elif cmd == "collect":
            rank = self.c.rank
            threading.Thread(target=transfers.run_collect, daemon=True, name="rankscope-collect",
                             args=(self.c.outbox, self.c.dump_path, dump_label(rank, self.c.pid),
                                   rank_to_wire(rank), args)).start()
        self.next_beat = 0.0  # report the new state at once

    def pump(self) -> int:
        """Send queued steps, export/collect items and a heartbeat if due; returns how
        many steps and items went out."""
        c = self.c
        n = 0
        if c.first is not None:
            with c.lock:
                first, c.first = c.first, None
            if not self.send(protocol.STATUS, first):
                with c.lock:
                    c.first = c.first or first
                return 0  # no step may overtake it
            self.first_sent = first
            n += 1
        for _ in range(64):
            try:
                batch = c.queue.popleft()  # atomic: the training thread may drop the oldest meanwhile
            except IndexError:
                break
            msg = protocol.step_message(batch, c.src, 0)
            msg.job = c.job
            if c.assigned is not None:
                msg.body["rank"] = c.assigned
            names = msg.body["new_names"]
            self.names.update(names)
            if c.lost_names:
                with c.lock:
                    lost, c.lost_names = c.lost_names, {}
                self.names.update(lost)
                names.update(lost)
            if self.resend_names:
                names.update(self.names)
            msg.seq = self.seq()
            try:
                self.sock.send(encode(msg), zmq.NOBLOCK)
            except zmq.Again:
                # Back to the front for the next attempt, keeping the names we took; the
                # seq is simply skipped.
                c.queue.appendleft(batch)
                with c.lock:
                    c.lost_names.update(names)
                break
            c.sent += 1
            n += 1
            self.resend_names = False
        n += self._pump_outbox()
        self._heartbeat()
        return n

    def _pump_outbox(self) -> int:
        n = 0
        for _ in range(8):
            item = self.pending_out
            if item is None:
                try:
                    item = self.c.outbox.get_nowait()
                except queue.Empty:
                    break
            mtype = protocol.BUNDLE_CHUNK if item[0] == "chunk" else protocol.STATUS
            if not self.send(mtype, item[1]):
                self.pending_out = item
                break
            self.pending_out = None
            n += 1
        return n

    def _started(self) -> int:
        """The step this rank last began (before its first boundary: the one after the
        last it handed over)."""
        started = self.c.gate.started
        return started if started is not None else max(self.c.last_step + 1, 0)

    def _heartbeat(self) -> None:
        c, gate = self.c, self.c.gate
        blocked = gate.waiting_at
        if blocked is not None:
            state, step = "paused", blocked
        elif gate.state is GateState.PAUSED:
            state, step = "pausing", c.last_step
        else:
            state, step = gate.state.value, c.last_step
        now = time.monotonic()
        snapshot = (state, step if blocked is not None else None)
        if snapshot != self.last_gate:
            if self.last_gate is not None and (state in ("paused", "terminated") or self.last_gate[0] == "paused"):
                what = "paused" if state == "paused" else ("resumed" if state in ("running", "stepping") else state)
                self.send(protocol.STATUS, {"what": what, "detail": {"rank": c.rank, "step": step,
                                                                     "started": self._started()}})
            self.last_gate = snapshot
            self.next_beat = 0.0
        tracker = c.sync
        if tracker is not None and tracker.changes != self.sync_seen and now - self.last_beat >= SYNC_BEAT_S:
            # A collective entered or left: say so soon (a hang is judged from it), but
            # never more often than every SYNC_BEAT_S (a fast loop makes many a second).
            self.next_beat = 0.0
        if now < self.next_beat:
            return
        self.next_beat = now + c.heartbeat_s
        self.last_beat = now
        body = {"rank": rank_to_wire(c.rank), "step": step, "state": state, "pid": c.pid,
                "started": self._started()}
        if c.dropped:
            body["dropped"] = c.dropped
        if gate.hold_at is not None:
            body["hold_at"] = gate.hold_at
        if tracker is not None:
            self.sync_seen = tracker.changes
            latest = tracker.latest
            if latest is not None:
                body["sync"] = latest.to_wire()
        self.send(protocol.HEARTBEAT, body)

