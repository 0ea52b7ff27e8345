"""What the node agent does with what its coordinator sends (control, clock echoes, id
answers, the job's config, acks) and when the link to it comes back."""
from __future__ import annotations

import logging
from typing import Any

from rankscope.config.job import checked_job_config
from rankscope.node.assign import confirm_assigned
from rankscope.node.registry import ProcessState, RankEntry
from rankscope.wire import job_config, protocol
from rankscope.wire.protocol import Message

log = logging.getLogger("rankscope.node.core")


class CoordinatorFrames:
    """Mixed into :class:`~.core.NodeCore`, whose state and outbox it uses."""

    registry: Any
    route: Any
    held: Any
    relay: Any
    exports: Any
    bundles: Any
    stacks: Any
    names: Any
    out: Any
    job_config: Any
    _updecoder: Any

    def on_coordinator_frame(self, frame: bytes) -> None:
        msg = self._updecoder.decode(frame)
        if msg is None:
            return
        self.held.heard = True
        if msg.type == protocol.CONTROL:
            self._on_control(frame, msg)
        elif msg.type == protocol.STATUS and msg.body["what"] == "clock":
            # The coordinator measures this host's clock offset: answer with our time now.
            detail = dict(msg.body.get("detail") or {})
            detail["t2"] = self.wall()
            self.out.up_volatile.append(self._msg(protocol.STATUS, msg.job, {"what": "clock", "detail": detail}))
        elif msg.type == protocol.STATUS and msg.body["what"] == "assigned":
            detail = msg.body.get("detail")  # the shard map first: the rank streams once answered
            if not (self.route.learn(detail) and confirm_assigned(self.registry, self.held, msg.job, detail,
                                                                  self._answer)):
                self._updecoder.rejected["bad_assigned"] += 1
        elif msg.type == protocol.STATUS and msg.body["what"] == job_config.WHAT:
            self.job_config = checked_job_config(job_config.config_of(msg.body)) or self.job_config
        elif msg.type == protocol.STATUS and msg.body["what"] == "ack":
            high = (msg.body.get("detail") or {}).get("high")
            if isinstance(high, dict):
                self.out.acks.append(high)

    def _on_control(self, frame: bytes, msg: Message) -> None:
        if msg.body["command"] == "stacks":
            args = msg.body.get("args") or {}
            ranks = args.get("ranks") if isinstance(args.get("ranks"), list) else None
            for job in ({msg.job} if msg.job else {e.job for e in self.registry.live()}):
                self.stacks.ask(job, ranks, why="the coordinator asked")
            return
        self.relay.remember(msg, frame)
        for entry in self.relay.targets(self.registry, msg):
            self._to_rank(entry, frame)
        if msg.body["command"] == "export":
            args = msg.body.get("args") or {}
            transfer = str(args.get("transfer") or msg.body.get("incident") or "export")
            for job in ({msg.job} if msg.job else {e.job for e in self.registry.entries()}):
                self.exports.asked(job, transfer)
            for entry in self.relay.gone(self.registry, msg):
                why = "rank lost before the export" if entry.state is ProcessState.LOST else \
                    "rank had finished before the export"
                self._export_on_behalf(entry, transfer, why)
            jobs = {msg.job} if msg.job else {e.job for e in self.registry.entries()}
            for job in jobs:
                self.publish_map(job)

    def _export_on_behalf(self, entry: RankEntry, transfer: str, reason: str, final: bool = True) -> None:
        self.bundles.write_on_behalf(entry, reason, self.registry.rank_map(entry.job), final=final)
        n = 0
        for body in self.bundles.chunks(entry, transfer):
            self._up_own(protocol.BUNDLE_CHUNK, entry.job, body)
            n += 1
        log.info("sent %d bundle chunks for rank %s (transfer %s)", n, entry.assigned_rank, transfer)

    def on_link_up(self) -> None:
        """A (re)connected coordinator may have lost everything: registrations, the rank map,
        and the name tables the ranks sent long ago (owed with their next STEP)."""
        jobs = set()
        for e in self.registry.live():
            self._forward_register(e)
            if "layout_status" in e.extra:
                self._up_own(protocol.STATUS, e.job, e.extra["layout_status"])
            jobs.add(e.job)
        for job in jobs:
            self.publish_map(job)
        self.names.owe_all()
