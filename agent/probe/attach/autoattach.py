"""Zero-code attach: probe a training script that never imports ``agent``.

``install()`` runs at interpreter start-up in every process under ``rankscope launch``
(agent/_attach/sitecustomize.py, env RANKSCOPE_ATTACH=1). It must cost nothing in
processes that never train (msrun's launcher), so it only adds a meta-path finder that
waits for ``mindspore`` to be imported. Then an :class:`AutoSession` creates a
PrecisionDebugger (RANKSCOPE_CONFIG, RANKSCOPE_DUMP_PATH; default L0 statistics +
sentinels) and finds what user code would have passed:

- the model: the Cell a ``value_and_grad`` function differentiates (the function itself,
  or the smallest Cell in its closure/globals holding all the weights), or the network
  given to ``Model``;
- step boundaries: the end of each optimizer call, or the Model.train callback;
- or, in a process that never trains (an inference server's worker), the root Cell its
  decode loop calls, one step per request batch (:mod:`rankscope.probe.attach.serving`).

A script that creates its own PrecisionDebugger takes over (:func:`yield_to_user`): the
session detaches and hands over its node-agent connection, so nothing is hooked twice.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import threading
from typing import Any

from rankscope.probe.attach import handover, serving
from rankscope.probe.graph import compile_guard
from rankscope.probe.attach.model_finder import _unwrap_network, find_model

_lock = threading.Lock()
_session: "AutoSession | None" = None
_finder: "_MindSporeFinder | None" = None


def install() -> None:
    """Arrange for the probe to attach when (and only if) MindSpore is imported."""
    global _finder
    if os.environ.get("MS_ROLE") == "MS_SCHED":
        # msrun's scheduler runs the training script only to host the cluster's meeting
        # point (it says RANK_ID=0 too): probing it would claim rank 0 beside the real one.
        return
    handover.register(yield_to_user)
    if "mindspore" in sys.modules:
        _on_mindspore()
        return
    with _lock:
        if _finder is None:
            _finder = _MindSporeFinder()
            sys.meta_path.insert(0, _finder)


def uninstall() -> None:
    """Remove the import hook and detach a running session (tests)."""
    global _finder, _session
    with _lock:
        if _finder is not None and _finder in sys.meta_path:
            sys.meta_path.remove(_finder)
        _finder = None
        session, _session = _session, None
    handover.register(None)
    if session is not None:
        session.close()


def session() -> "AutoSession | None":
    return _session


def yield_to_user(user_debugger: Any) -> tuple[Any, int | None, str] | None:
    """The script made its own PrecisionDebugger: stop auto-probing and hand over the
    node-agent client (already registered) so the rank registers once."""
    global _session
    with _lock:
        s, _session = _session, None
    if s is None:
        return None
    dbg = s.debugger
    client = dbg.client
    dbg.graph.report.silent = True
    if client is not None and client in dbg.sinks:
        dbg.sinks.remove(client)  # the user's debugger owns it now; close() must not close it
    s.close()
    return client, dbg.rank, dbg._label  # noqa: SLF001


class _MindSporeFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps mindspore's loader so the session starts right after
    ``import mindspore`` finishes."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != "mindspore":
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        orig_exec = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            orig_exec(module)
            try:
                if self in sys.meta_path:
                    sys.meta_path.remove(self)
            except ValueError:
                pass
            _on_mindspore()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _on_mindspore() -> None:
    global _session
    with _lock:
        if _session is not None:
            return
        try:
            _session = AutoSession()
        except Exception as exc:  # noqa: BLE001 - attaching must never stop the program
            report_attach_failure(exc)
            _session = None


def report_attach_failure(exc: BaseException) -> None:
    """Say it in this process's output and tell launch, which warns on the terminal."""
    from rankscope.probe.identity import resolve_rank
    from rankscope.wire.attach_report import one_line, write_failure
    reason = one_line(exc)
    print(f"[rankscope] auto-attach failed, running unprobed: {reason}", file=sys.stderr, flush=True)
    try:
        rank, _ = resolve_rank(None)
    except Exception:  # noqa: BLE001 - the report matters more than the rank id
        rank = None
    write_failure(rank, reason)


class AutoSession:
    """One auto-created debugger and the patches that feed it a model and step ends."""

    def __init__(self) -> None:
        from rankscope.probe.debugger import PrecisionDebugger
        env = os.environ
        config_path = env.get("RANKSCOPE_CONFIG") or None
        level = None if config_path else "L0"
        self.debugger = PrecisionDebugger(config_path, dump_path=env.get("RANKSCOPE_DUMP_PATH") or None,
                                          level=level, _auto=True)
        self.models: list[int] = []
        self.model_train = False  # Model.train drives steps through the callback
        self.train_cells = 0  # TrainOneStepCells seen: their call is the step
        self._patches: list[tuple[Any, str, Any]] = []
        dbg = self.debugger
        dbg.sentinels.on_grad_fn = self._on_grad_fn
        dbg.sentinels.on_optimizer_done = self._on_optimizer_done
        dbg.graph.on_step = self._graph_step_done
        # The debugger attached its sentinel patches (value_and_grad, Optimizer/Reducer
        # constructors) already, so the objects the script creates next are seen.
        self._patch_model()
        self._patch_train_cell()
        self.serving: serving.ServingDriver | None = None
        self.finder = serving.ServingFinder(self._serving_wanted, self._serving_found)
        try:
            self.finder.install()
        except Exception as exc:  # noqa: BLE001 - training is still watched
            dbg.recorder.error("watching for a serving model", exc)

    # ------------------------------------------------------------------ serving
    def _trains(self) -> bool:
        dbg = self.debugger
        return bool(self.models or self.model_train or self.train_cells or dbg.sentinels.grad_fns_seen
                    or any(True for _ in dbg.sentinels.optimizers))

    def _serving_wanted(self) -> bool:
        return self.serving is None and not self._trains() and not self.debugger.closed

    def _serving_found(self, cell: Any, args: tuple, kwargs: dict) -> None:
        from rankscope.probe.graph.graph_watch import graph_mode
        name = type(cell).__name__
        dbg = self.debugger
        dbg.graph.report.serving = name
        if graph_mode():
            serving.say(f"worker (pid {os.getpid()}): serving model {name} found, but it runs compiled (GRAPH mode): not watched")
            return
        self.serving = serving.ServingDriver(dbg, cell, dbg.config.cluster.token_range)
        serving.say(serving.found_line(name))

    def _leave_serving(self) -> None:
        """A grad function or optimizer appeared: this process trains after all."""
        self.finder.uninstall()
        if self.serving is not None and not self.serving.retired:
            self.serving.retire()
            self.debugger.graph.report.serving = None
            serving.say(serving.retired_line(type(self.serving.root).__name__))

    # ------------------------------------------------------------------ model
    def _on_grad_fn(self, fn: Any, weights: Any) -> None:
        self._leave_serving()
        model = find_model(fn, weights)
        if model is not None:
            self.use_model(model)

    def use_model(self, model: Any) -> None:
        self._leave_serving()
        if id(model) in self.models:
            return
        self.models.append(id(model))
        self.debugger.start(model)

    def _on_optimizer_done(self) -> None:
        if self.serving is not None and not self.serving.retired:
            self._leave_serving()
        if self.model_train or self.train_cells:
            return  # the callback / the TrainOneStepCell's own end marks the step
        dbg = self.debugger
        if not dbg._identified:  # noqa: SLF001 - no model found yet: sentinels still need a rank
            dbg.start()
        dbg.step()

    def _graph_step_done(self, cell: Any) -> None:
        """A compiled training step returned (GRAPH mode): it is the step, unless
        Model.train's callback ends steps."""
        if self.model_train:
            return
        dbg = self.debugger
        if not dbg._identified:  # noqa: SLF001 - no model found: sentinels still need a rank
            dbg.start()
        dbg.step()

    def _patch_model(self) -> None:
        try:
            from mindspore.train import Model
        except Exception:  # noqa: BLE001
            return
        orig_train = Model.train
        session = self

        def train(model_self, epoch, train_dataset, callbacks=None, *args, **kwargs):  # noqa: ANN001
            try:
                from rankscope.probe.callback import MsprobeStep
                session.model_train = True
                net = getattr(model_self, "_network", None)
                inner = getattr(model_self, "_backbone", None) or _unwrap_network(net)
                if inner is not None:
                    session.use_model(inner)
                cbs = list(callbacks) if isinstance(callbacks, (list, tuple)) else \
                    ([callbacks] if callbacks is not None else [])
                if not any(type(cb).__name__ == "MsprobeStep" for cb in cbs):
                    cbs.append(MsprobeStep(session.debugger))
                callbacks = cbs
            except Exception as exc:  # noqa: BLE001
                session.debugger.recorder.error("auto-attach Model.train", exc)
            return orig_train(model_self, epoch, train_dataset, callbacks, *args, **kwargs)

        train.__wrapped__ = orig_train  # type: ignore[attr-defined]
        self._patches.append((Model, "train", orig_train))
        Model.train = train

    def _patch_train_cell(self) -> None:
        """A loop calling ``nn.TrainOneStepCell`` directly: its network is the model, its
        output the loss, and the end of its call the end of the step (the optimizer runs
        inside it, before the loss is returned)."""
        try:
            from mindspore import nn
        except Exception:  # noqa: BLE001
            return
        cls = nn.TrainOneStepCell
        orig_init = cls.__init__
        session = self

        def __init__(cell, network, optimizer, *args, **kwargs):  # noqa: N807, ANN001
            orig_init(cell, network, optimizer, *args, **kwargs)
            try:
                session.train_cells += 1
                compile_guard.register(cell, session._train_cell_done)
                session.use_model(_unwrap_network(network))
            except Exception as exc:  # noqa: BLE001
                session.debugger.recorder.error("auto-attach TrainOneStepCell", exc)

        __init__.__wrapped__ = orig_init  # type: ignore[attr-defined]
        self._patches.append((cls, "__init__", orig_init))
        cls.__init__ = __init__

    def _train_cell_done(self, cell: Any, args: tuple, output: Any) -> None:
        dbg = self.debugger
        try:
            loss = output[0] if isinstance(output, (tuple, list)) else output
            dbg.sentinels.record_loss(loss)
        except Exception as exc:  # noqa: BLE001
            dbg.recorder.error("TrainOneStepCell loss", exc)
        if not self.model_train:  # under Model.train the callback ends the step
            dbg.step()
        return None

    def close(self) -> None:
        self.finder.uninstall()
        if self.serving is not None:
            self.serving.retire()
        for owner, attr, orig in reversed(self._patches):
            setattr(owner, attr, orig)
        self._patches.clear()
        dbg = self.debugger
        try:
            rec = dbg.recorder
            if len(rec.builder) or rec._pending or rec.entries:  # noqa: SLF001
                dbg.step()  # flush the partial last step
        except Exception:  # noqa: BLE001
            pass
        dbg.close()
