"""PrecisionDebugger: msProbe's in-rank API, backed by rankscope's hooks and sinks.

Drop-in for ``msprobe.mindspore.PrecisionDebugger`` (seeds/001): same constructor and
methods. Every step's records leave through :meth:`step` as one StepOutput handed to
every sink (the local DumpWriter, the node-agent client when one is configured, the
in-rank flight recorder), then the StepGate decides whether training may go on.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any

from rankscope.config.job import rank_config
from rankscope.config.msprobe import ranks_not_in_job
from rankscope.config.schema import KERNEL_LEVEL
from rankscope.dump.folder_claim import UNKNOWN_HOLDER, claim_rank_label, release_rank_label
from rankscope.dump.retention import DumpRetention, RetentionPolicy
from rankscope.dump.writer import DumpWriter
from rankscope.probe.vitals.probe_clock import CLOCK
from rankscope.probe import agent_link
from rankscope.probe.comm import layout_probe
from rankscope.probe.rerun import rerun
from rankscope.probe.tensors.capture import Captures
from rankscope.probe.comm.collectives import CollectiveHooks
from rankscope.probe.gate import RankscopeTerminated, StepGate
from rankscope.probe.graph.graph_watch import GraphWatch, graph_mode
from rankscope.probe.attach.handover import take_over
from rankscope.probe.hooks.api import ApiHooks
from rankscope.probe.hooks.cell import CellHooks
from rankscope.probe.hooks.recorder import Recorder
from rankscope.probe.identity import resolve_rank
from rankscope.probe.comm.layout_probe import LayoutProbe
from rankscope.probe.rank_env import device_side, make_flight_recorder, world_size
from rankscope.probe.vitals.sentinels import Sentinels
from rankscope.probe.comm.sync_tracker import SyncTracker
from rankscope.probe.token_range import TokenCounter, TokenRangeHooks, check_token_range
from rankscope.probe.vitals.tiers import Tier
from rankscope.probe.watch import GRADS_UNSEEN
from rankscope.wire.attach_report import one_line, say_once, write_failure
from rankscope.wire.layout import dump_label, position_file, rank_to_wire
from rankscope.wire.position import NO_TOKEN, PositionWriter
from rankscope.wire.records import StepOutput

log = logging.getLogger("rankscope.probe")


class PrecisionDebugger:
    """msProbe's ``PrecisionDebugger(config_path=None, task=None, dump_path=None, level=None, step=None)``."""

    #: The debugger the Model.train callback and autoattach talk to by default.
    current: "PrecisionDebugger | None" = None

    def __init__(self, config_path: str | None = None, task: str | None = None,
                 dump_path: str | None = None, level: str | None = None,
                 step: list | None = None, *, _auto: bool = False) -> None:
        try:
            self.config, note = rank_config(config_path, task=task, dump_path=dump_path, level=level, step=step)
        except Exception as exc:
            # Raised into the script, as msProbe does; launch is told why this rank will never attach.
            write_failure(resolve_rank(None)[0], f"PrecisionDebugger: {one_line(exc)}", raised=True)
            raise
        if note:
            say_once(note)
        cfg = self.config
        self.auto = _auto
        self.gate = StepGate(exit_on_terminate=cfg.cluster.on_terminate == "exit")
        self.gate.who = lambda: None if self.rank is None else f"rank {self.rank}"
        self.writer = DumpWriter(cfg.dump_path, cfg.task, cfg.level, cfg.summary_mode)
        c = cfg.cluster
        self.writer.retention = DumpRetention(RetentionPolicy(c.dump_keep_steps, c.dump_max_mb, c.dump_max_files),
                                              keep_all=bool(cfg.step))
        self.rank: int | None = None
        self.rank_source = "none"
        self._label = dump_label(None)
        self.job = cfg.cluster.job or os.environ.get("RANKSCOPE_JOB") or "local"
        self.recorder = Recorder(task=cfg.task, summary_mode=cfg.summary_mode, data_mode=cfg.data_mode,
                                 scope=cfg.scope, api_list=cfg.list, write_tensor=self.writer.write_tensor,
                                 log_error=self.writer.log_error, rank_label=lambda: self._label)
        self.captures = self.recorder.capture = Captures(lambda: self.rank, lambda: cfg.dump_path)
        self.cells = CellHooks(self.recorder)
        self.apis = ApiHooks(self.recorder)
        self.sentinels = Sentinels(self.recorder)
        self.sync = SyncTracker()
        self.sentinels.sync = self.sync
        rerun.attach(self)
        self.collectives = CollectiveHooks(self.recorder, self.sync)
        self.layout = LayoutProbe()
        self.recorder.params_now = lambda: not any(True for _ in self.sentinels.optimizers)
        self.recorder.device_side = device_side()
        self.recorder.on_step_start = self.sentinels.snapshot
        self.sinks: list[Any] = [self.writer]
        self.flight_recorder = make_flight_recorder(cfg.cluster.flight_recorder_steps)
        if self.flight_recorder is not None:
            self.sinks.append(self.flight_recorder)
        self.client: Any = None
        self.current_step = 0
        self._identified = False
        self._started = False  # between start() and stop()
        self._token: TokenCounter | None = None
        self._token_hooks: TokenRangeHooks | None = None
        self._position: Any = None  # PositionWriter once tokens are counted
        self._save_count: dict[str, int] = {}
        self.emit_errors = 0
        self.dump_said = False  # the local dump's retention said its first removal
        self.dump_final_said = False
        self.closed = False
        self._started_in_step = False
        if not _auto:
            handover = take_over(self)
            if handover:
                self.client, self.rank, self._label = handover
                if self.client is not None:
                    self.client.state.sync = self.sync
                self._identified = self.client is not None
                if self.client is not None:
                    self.sinks.append(self.client)
        self.rdr = self._install_rdr()
        # Now, not at start(): the value_and_grad patch must be in place before the
        # script builds its grad function, or the loss is never seen. Attached even with
        # sentinels off: the optimizer hook is where queued parameter reads happen.
        self.sentinels.record = cfg.cluster.sentinels
        self._guard("attaching sentinels", self._attach_sentinels)
        self.graph = GraphWatch(self)
        self.tier = Tier(self)
        if cfg.level == KERNEL_LEVEL:  # no hooks: eager code has no kernel record to read
            self.graph.report.eager_unseen = (f"level {KERNEL_LEVEL} records the kernels of compiled code "
                                              "only; eager steps get no Cell/API data")
        self._guard("watching compiled steps", self.graph.attach)
        PrecisionDebugger.current = self

    # ------------------------------------------------------------------ API
    def start(self, model: Any = None, token_range: list | tuple | None = None,
              rank_id: int | None = None) -> None:
        """Begin (or resume) collection; attaches hooks to ``model`` the first time it is seen."""
        tr = check_token_range(token_range)
        if tr is not None and model is None:
            raise ValueError("token_range requires model: pass the inference root model to start()")
        if not self._identified or rank_id is not None:
            self._identify(rank_id)
        cfg = self.config
        if not self.sentinels.enabled:
            self._guard("attaching sentinels", self._attach_sentinels)
        # token hooks first: the root's pre-hook that opens a token must run before the
        # L0 root hook that decides whether this forward's grad hooks are batched
        if tr is not None:
            if self._token_hooks is None:
                root = model[0] if isinstance(model, (list, tuple)) else model
                self._token = TokenCounter(tr[0], tr[1], self._on_token)
                self._token_hooks = TokenRangeHooks(root, self._token)
            else:  # msProbe counts tokens from 0 again at every start()
                self._token.reset(tr[0], tr[1])
        # GRAPH mode never runs a Cell's hooks in Python: its kernels are watched instead.
        if model is not None and cfg.level in ("L0", "mix") and not graph_mode():
            self._guard("attaching cell hooks", lambda: self.cells.attach(model))
        if cfg.level in ("L1", "mix") and not graph_mode():  # wrappers would be compiled
            self._guard("wrapping APIs", lambda: self.apis.attach(model))
        self._started = self._started_in_step = True
        self._update_dumping()
        self._guard("step-start snapshot", self.sentinels.snapshot)

    def stop(self) -> None:
        """Stop collecting hook data (sentinels keep recording until step())."""
        self._started = False
        self._update_dumping()

    def step(self) -> None:
        """End the step: emit its records to every sink, advance, then honour the StepGate."""
        with CLOCK:  # the step's end is the probe's time; a pause at the gate is not
            done = self.current_step
            if self._started_in_step and self.config.level in ("L0", "mix") and not self.cells.attached \
                    and not self.auto and not graph_mode():
                say_once(f"level {self.config.level} dumps the Cells of the model given to start(model); start() "
                         "got none, so this dump has no Cell data: pass the network, as msProbe requires")
            self._started_in_step = False
            self._guard("kernel rows", self.graph.collect)
            self.captures.link(self.client)
            self._flush(done)
            self.captures.end_step()  # after the flush, which reads the rows still queued
            self.current_step += 1
            self.recorder.step = self.current_step
            self._write_position(self.current_step, NO_TOKEN)
            self._save_count.clear()
            self.cells.new_step()
            self.apis.new_step()
            self.collectives.new_step()
            self.sentinels.new_step()
            self._guard("the watch's tier", self.tier.step_ended)
            self.sync.new_step(self.current_step)
            if self.sentinels.unreduced_steps and not self.graph.report.grads_unseen and (world_size() or 1) > 1:
                self.graph.report.grads_unseen = GRADS_UNSEEN
            self._guard("watch report", self.graph.step_ended)
            self._update_dumping()
        self.gate.at_step_boundary(done)
        self.captures.begin_step(self.current_step)  # what was asked for while it stood at the boundary

    def set_init_step(self, step: int) -> None:
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step = {step!r}: expected an integer >= 0")
        self.current_step = step
        self.recorder.step = step
        self._update_dumping()

    def save(self, variable: Any, name: str, save_backward: bool = True) -> None:
        """Single-point save (msProbe's debug level, written to debug.json):
        ``{name}.{n}.debug`` for the value, ``{name}_grad.{n}.debug`` for its gradient."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"name = {name!r}: expected a non-empty string")
        if self.config.level != "debug" or not self.config.step_selected(self.current_step) \
                or not self.config.rank_selected(self.rank):
            return  # msProbe ignores save() outside the debug level
        try:
            n = self._save_count.get(name, 0)
            self._save_count[name] = n + 1
            self.recorder.save_point(name, n, variable, save_backward)
        except Exception as exc:  # noqa: BLE001
            self.recorder.error(f"save {name}", exc)

    def register_custom_api(self, module: Any, api: str, api_prefix: str) -> None:
        if self.config.level == KERNEL_LEVEL:
            raise ValueError(f"register_custom_api wraps a Python API (levels L1, mix); level "
                             f"{KERNEL_LEVEL} records kernels of compiled code only")
        if not self.apis.wrap(module, api, api_prefix):
            raise ValueError(f"api = {api!r}: {module!r} has no callable of that name")
        self.apis.active = True

    def restore_custom_api(self, module: Any, api: str) -> None:
        self.apis.restore(module, api)

    def close(self) -> None:
        """Detach every hook and patch (model outputs are then exactly as unprobed)."""
        if self.closed:
            return
        self.closed = True
        self._started = False
        self.recorder.dumping = False
        self.cells.detach()
        self.apis.detach()
        self.collectives.detach()
        self.tier.say_final()
        self.sentinels.detach()
        self._guard("closing the graph watch", self.graph.close)
        if self._token_hooks is not None:
            self._token_hooks.remove()
        if self._position is not None:
            self._position.close()  # its stores stop: the sync tracker's too
        self._guard("saying what the local dump keeps", lambda: agent_link.say_dump(self, final=True))
        for sink in self.sinks:
            try:
                sink.close()
            except Exception:  # noqa: BLE001
                pass
        if self._label.startswith("rank"):
            try:
                release_rank_label(self.config.dump_path, self._label)
            except OSError:
                pass
        # The SIGUSR2 stack handler stays for the rest of the process: its node agent may
        # still ask for stacks while the job tears down, and SIGUSR2's default would kill it.
        if PrecisionDebugger.current is self:
            PrecisionDebugger.current = None

    detach = close

    # ------------------------------------------------------------------ internals
    @property
    def hook_errors(self) -> int:
        return self.recorder.errors

    def _attach_sentinels(self) -> None:
        self.sentinels.attach()
        layout_probe.install()
        if self.sentinels.record:  # collectives are sentinels: off with them
            self.collectives.attach()

    def _guard(self, what: str, fn: Any) -> None:
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - attach problems never stop training
            self.recorder.error(what, exc)
            log.warning("rankscope: %s failed: %r", what, exc)

    def _install_rdr(self) -> Any:
        """The crash recorder when ``rdr`` (config or MS_RDR_* env) enables it; one per
        process (a user debugger after autoattach reuses the first)."""
        try:
            from rankscope.config.rdr import resolve_rdr
            from rankscope.rdr.crash_hooks import install_rdr
        except ImportError:
            return None
        resolve_rdr(self.config.rdr)  # a bad section raises ConfigError at construction
        try:
            return install_rdr(self.config.rdr, flight_recorder=self.flight_recorder,
                               config=self.config.to_dict())
        except Exception as exc:  # noqa: BLE001
            self.recorder.error("installing the RDR recorder", exc)
            return None

    def _write_position(self, step: int, token: int) -> None:
        # For the node agent after a crash (made at connect): the step (token) this rank began
        # and its newest sync point, which its unsent records or last heartbeat may not say.
        if self._position is None and self.client is not None:
            self._position = PositionWriter(position_file(self.job, os.getpid()))
            self.sync.file = self._position
        if self._position is not None:
            self._position.write(step, token)

    def _on_token(self, index: int, in_range: bool) -> None:
        # A step's batch carries its *first* in-range token: the coordinator adds a
        # record's call index (``...forward.<n>``) to it to name the exact token.
        if in_range and self.recorder.token < 0:
            self.recorder.token = index
        self._write_position(self.current_step, index)
        self._update_dumping()

    def _update_dumping(self) -> None:
        cfg = self.config
        on = (self._started and cfg.level != "debug" and cfg.step_selected(self.current_step)
              and cfg.rank_selected(self.rank))
        if on and self._token is not None:
            on = self._token.in_range
        self.recorder.dumping = on

    def _identify(self, rank_id: int | None) -> None:
        self._identified = True
        rank, self.rank_source = resolve_rank(rank_id)
        self.rank = rank  # what we claim to the node agent; the folder waits for its answer
        endpoint = self.config.cluster.agent or os.environ.get("RANKSCOPE_AGENT")
        if endpoint and self.client is None:
            self._guard("connecting to the node agent", lambda: agent_link.connect(self, endpoint))
            self._guard("the position file", lambda: self._write_position(self.current_step, NO_TOKEN))
        self._set_rank(self.rank)
        note = ranks_not_in_job(self.config.rank, world_size())
        if note:
            say_once(note)

    def _set_rank(self, rank: int | None) -> None:
        old = self._label
        self.rank = rank
        self._label = self._claim_label(rank)
        if old != self._label and old.startswith("rank"):
            release_rank_label(self.config.dump_path, old)
        if rank is not None and getattr(self, "rdr", None) is not None:
            try:
                self.rdr.set_rank(rank)
            except Exception as exc:  # noqa: BLE001
                self.recorder.error("moving the RDR bundle to the rank", exc)
        if old != self._label:
            try:
                self.writer.rename_rank_folder(old, self._label)
            except Exception as exc:  # noqa: BLE001
                self.recorder.error("renaming the proc folder", exc)

    def _claim_label(self, rank: int | None) -> str:
        try:
            label, holder = claim_rank_label(self.config.dump_path, rank)
        except OSError as exc:
            self.recorder.error("claiming the rank folder", exc)
            return dump_label(rank)
        if holder is not None:
            log.warning("rankscope: %s is taken by %s under %s; dumping as %s", dump_label(rank),
                        "another process" if holder == UNKNOWN_HOLDER else f"pid {holder}", self.config.dump_path, label)
        return label

    def _flush(self, step: int) -> None:
        r = self.recorder
        assigned = getattr(self.client, "assigned", None)
        if assigned is not None and assigned != self.rank:  # the agent answered late
            self._set_rank(assigned)
        if self.rank is None and self.rank_source == "none" and self._identified:
            rank, source = resolve_rank(None)  # init() may have happened since start()
            if rank is not None:
                self.rank_source = source
                self._set_rank(rank)
        try:
            entries, stacks, construct = r.take()
            batch = r.builder.build(self.job, rank_to_wire(self.rank), step,
                                    token=r.token, wall_time=time.time())
            r.token = -1
            out = StepOutput(batch=batch, rank_label=self._label, entries=entries, stacks=stacks,
                             construct=construct,
                             dump_selected=self.config.step_selected(step) and self.config.rank_selected(self.rank)
                             and bool(entries))
        except Exception as exc:  # noqa: BLE001
            r.error(f"building step {step}", exc)
            return
        self._guard("saying the layout", lambda: agent_link.say_layout(self))
        for sink in self.sinks:
            try:
                sink.emit(out)
            except RankscopeTerminated:
                raise
            except Exception as exc:  # noqa: BLE001
                self.emit_errors += 1
                r.error(f"sink {type(sink).__name__}", exc)
        self._guard("saying what the local dump keeps", lambda: agent_link.say_dump(self))
