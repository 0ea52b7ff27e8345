"""Process hooks that write an RDR bundle when a rank ends (seeds/000 modes 1 and 2).

Mode 1 (abnormal end): an uncaught exception (main thread via ``sys.excepthook``, other
threads via ``threading.excepthook``), SIGTERM, SIGABRT. Fatal signals (SIGSEGV, SIGFPE,
SIGBUS, SIGILL, and an abort() from C) leave no Python to run, so faulthandler writes every
thread's stack straight into ``fatal_signal_stacks.txt`` inside a bundle directory
reserved at install; the node agent's on-behalf bundle later adopts that directory.
Mode 2 also writes at a normal exit (``atexit``). Every previous handler is chained, so
MindSpore's, msrun's or the user's own hooks still run after ours.
"""
from __future__ import annotations

import atexit
import faulthandler
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Mapping

from rankscope.config.rdr import RdrSettings
from rankscope.rdr.bundle import FATAL_STACKS, OWNER, reserve_bundle_dir, write_bundle
from rankscope.rdr.flight_recorder import FlightRecorder
from rankscope.wire.layout import dump_label

log = logging.getLogger(__name__)

_SIGNALS = (signal.SIGTERM, signal.SIGABRT)


class RdrRecorder:
    """Writes one bundle per end of process, plus one per crashed thread (which re-arms).

    ``context`` is called at dump time for late facts (e.g. ``{"rank_map": ...}``), its
    keys written as ``<key>.json``. ``rank`` defaults to ``RANK_ID`` (0 when unset, as
    MindSpore's RDR did on a single card); :meth:`set_rank` moves the reservation once the
    node agent has assigned the real id.
    """

    def __init__(self, settings: RdrSettings, rank: int | str | None = None, *,
                 flight_recorder: FlightRecorder | None = None, config: Any = None,
                 seeds: Mapping | None = None, context: Callable[[], Mapping[str, Any]] | None = None) -> None:
        self.settings = settings
        self.rank = rank if rank is not None else os.environ.get("RANK_ID") or os.environ.get("RANK") or dump_label(None)
        self.flight_recorder = flight_recorder
        self.config = config
        self.seeds = seeds
        self.context = context
        self.bundles: list[Path] = []
        self._lock = threading.RLock()
        self._installed = False
        self._pid = os.getpid()
        self._reserved: Path | None = None
        self._fatal_file = None
        self._prev_excepthook = None
        self._prev_thread_hook = None
        self._prev_signals: dict[int, Any] = {}
        self._root_existed = True
        self._dumping = False
        self._ended_abnormally = False  # set by the exception/signal hooks: no "normal end" follows

    # --- install / uninstall -----------------------------------------------------------
    def install(self) -> "RdrRecorder":
        """Hook the process; a no-op when RDR is disabled. Call from the main thread to
        get the signal handlers (elsewhere they are skipped with a warning)."""
        if not self.settings.enable or self._installed:
            return self
        self._root_existed = os.path.isdir(self.settings.path)
        self._installed = True
        self._prev_excepthook, sys.excepthook = sys.excepthook, self._excepthook
        self._prev_thread_hook, threading.excepthook = threading.excepthook, self._thread_hook
        if threading.current_thread() is threading.main_thread():
            for sig in _SIGNALS:
                self._prev_signals[sig] = signal.signal(sig, self._on_signal)
        else:
            log.warning("RDR: installed off the main thread; SIGTERM/SIGABRT are not hooked")
        # After signal.signal: faulthandler saves the current SIGABRT handler and chains to it.
        self._arm()
        atexit.register(self._at_exit)
        return self

    def uninstall(self) -> None:
        if not self._installed:
            return
        self._installed = False
        self._disarm(release=True)
        # Put back only what is still ours: a hook installed after us chains to ours and
        # must not be thrown away.
        if sys.excepthook == self._excepthook:
            sys.excepthook = self._prev_excepthook
        if threading.excepthook == self._thread_hook:
            threading.excepthook = self._prev_thread_hook
        for sig, prev in self._prev_signals.items():
            if signal.getsignal(sig) == self._on_signal:
                signal.signal(sig, prev if prev is not None else signal.SIG_DFL)
        self._prev_signals.clear()
        atexit.unregister(self._at_exit)

    def set_rank(self, rank: int | str) -> None:
        with self._lock:
            if str(rank) == str(self.rank):
                return
            self.rank = rank
            if self._installed and self._reserved is not None:
                self._disarm(release=True)
                self._arm()

    def _arm(self) -> None:
        """Reserve the next bundle directory and point faulthandler into it."""
        try:
            self._reserved = reserve_bundle_dir(self.settings.path, self.rank)
            self._fatal_file = open(self._reserved / FATAL_STACKS, "w")
            faulthandler.enable(self._fatal_file, all_threads=True)
        except OSError as exc:
            log.error("RDR: cannot prepare the bundle directory under %s: %s", self.settings.path, exc)

    def _disarm(self, release: bool) -> None:
        """Stop faulthandler; with ``release``, remove the reservation if nothing used it."""
        if self._fatal_file is not None:
            faulthandler.disable()
            self._fatal_file.close()
            self._fatal_file = None
        d, self._reserved = self._reserved, None
        if release and d is not None and d.is_dir():
            fatal = d / FATAL_STACKS
            if fatal.exists() and fatal.stat().st_size > 0:
                return  # a fatal signal was caught and survived: keep the evidence
            for name in (FATAL_STACKS, OWNER):
                try:
                    (d / name).unlink()
                except OSError:
                    pass
            _rmdir_quiet(d)
            _rmdir_quiet(d.parent)
            if not self._root_existed:
                _rmdir_quiet(Path(self.settings.path))

    # --- writing -----------------------------------------------------------------------
    def dump(self, reason: str, exception: BaseException | str | None = None, *, rearm: bool = False) -> Path | None:
        """Write a bundle now; never raises (this runs while the process is dying)."""
        if os.getpid() != self._pid:
            return None  # a forked child inherited our hooks; its bundle is not ours to write
        with self._lock:
            nested = self._dumping  # e.g. SIGTERM landing while a thread-crash bundle is written
            self._dumping = True
            try:
                directory = None if nested else self._reserved
                if directory is not None and self._fatal_file is not None:
                    self._fatal_file.flush()
                extra = dict(self.context()) if self.context is not None else None
                path = write_bundle(self.settings.path, self.rank, reason=reason,
                                    steps=self.flight_recorder if self.flight_recorder is not None else (),
                                    exception=exception, config=self.config, seeds=self.seeds, extra=extra,
                                    directory=directory)
            except Exception as exc:  # noqa: BLE001 - report, never mask the original failure
                print(f"rankscope RDR: could not write the bundle ({reason}): {exc}", file=sys.stderr)
                return None
            finally:
                self._dumping = nested
                if not nested:
                    self._disarm(release=False)
            self.bundles.append(path)
            print(f"rankscope RDR: bundle written to {path} ({reason})", file=sys.stderr)
            if rearm and self._installed:
                self._arm()
            return path

    def _excepthook(self, etype, value, tb) -> None:
        self._ended_abnormally = True
        if value is not None and value.__traceback__ is None:
            value = value.with_traceback(tb)
        self.dump(f"uncaught exception: {etype.__name__}", value)
        self._prev_excepthook(etype, value, tb)

    def _thread_hook(self, args) -> None:
        if not issubclass(args.exc_type, SystemExit):
            name = args.thread.name if args.thread is not None else "?"
            self.dump(f"uncaught exception in thread {name}: {args.exc_type.__name__}",
                      args.exc_value, rearm=True)
        self._prev_thread_hook(args)

    def _on_signal(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        self._ended_abnormally = True
        self.dump(f"signal {name}", f"received {name} (pid {os.getpid()})\n")
        prev = self._prev_signals.get(signum)
        if callable(prev):
            prev(signum, frame)
        elif prev == signal.SIG_IGN:
            return
        else:
            # Default action: die by the same signal, so the parent sees the true status.
            faulthandler.disable()
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def _at_exit(self) -> None:
        with self._lock:
            fatal = self._reserved / FATAL_STACKS if self._reserved is not None else None
            if self._fatal_file is not None:
                self._fatal_file.flush()
            survived_fatal = fatal is not None and fatal.exists() and fatal.stat().st_size > 0
            if self.settings.mode == 2 and not self._ended_abnormally:
                self.dump("normal exit (mode 2)")
            elif survived_fatal:
                self.dump("exit after a fatal signal was reported")
            else:
                self._disarm(release=True)


def _rmdir_quiet(d: Path) -> None:
    try:
        d.rmdir()
    except OSError:
        pass


_active: RdrRecorder | None = None


def install_rdr(section: Mapping[str, Any] | None, rank: int | str | None = None, **kwargs: Any) -> RdrRecorder | None:
    """Resolve settings (config over env) and install; None when RDR is off.

    One recorder per process: a second call (the user's PrecisionDebugger after
    autoattach, say) returns the first, filling in what it lacked, so a crash writes
    one bundle, not two.
    """
    from rankscope.config.rdr import resolve_rdr

    global _active
    settings = resolve_rdr(section)
    if not settings.enable:
        return None
    if _active is not None and _active._installed and _active._pid == os.getpid():
        for key in ("flight_recorder", "config", "seeds", "context"):
            if getattr(_active, key) is None and kwargs.get(key) is not None:
                setattr(_active, key, kwargs[key])
        if rank is not None:
            _active.set_rank(rank)
        return _active
    _active = RdrRecorder(settings, rank, **kwargs).install()
    return _active
