"""The local dump sink: msProbe's on-disk layout, so msProbe's own compare reads it.

Layout (seeds/001 "Dump Result File", dynamic graph)::

    dump_path/step{N}/rank{ID}/            (or proc{pid} while the rank is unknown)
        dump.json         {"task", "level", "framework", "dump_data_dir", "data": entries}
        stack.json        {"0": [[entry names...], stack], ...}  (msProbe groups names by stack)
        construct.json    {entry name: parent name or null}
        dump_error_info.log   only when something failed
        dump_tensor_data/*.npy   tensor mode; names over 255 chars mapped via mapping.csv

Every file appears whole or not at all (temp file in the same directory + rename),
because a rank can die at any moment and a torn dump.json is worse than none.
"""
from __future__ import annotations

import datetime as _dt
import io
import json
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from rankscope.dump.files import (  # noqa: F401
    atomic_write_bytes,
    atomic_write_json,
    dumps_json,
    group_stacks,
    mapped_file_name,
    merge_dir,
    rename_data_names,
    rmdir_quiet,
    write_mapping,
)
from rankscope.dump.behind import WriteBehind
from rankscope.dump.retention import DumpRetention
from rankscope.wire.layout import step_dir_name
from rankscope.wire.records import StepOutput

#: Longest file name most file systems accept (msProbe's FILE_NAME_LENGTH).
MAX_FILE_NAME = 255
TENSOR_DIR = "dump_tensor_data"
MAPPING_CSV = "mapping.csv"
ERROR_LOG = "dump_error_info.log"
#: Messages written to one step's error log before the rest are only counted.
ERROR_LOG_LIMIT = 100
#: How many (step, rank) dumps a writer remembers for merging repeated emits.
_KEEP_STEPS = 4


class DumpWriter:
    """Sink writing each selected step's records in msProbe's layout under ``dump_path``.

    Never raises into training: failures are counted in :attr:`errors` and logged to
    the step's ``dump_error_info.log`` (best effort).
    """

    def __init__(self, dump_path: str | os.PathLike, task: str = "statistics", level: str = "L1",
                 summary_mode: str = "statistics") -> None:
        self.dump_path = Path(os.path.abspath(os.fspath(dump_path)))
        self.task = task
        self.level = level
        self.summary_mode = summary_mode
        self.errors = 0
        self.steps_written = 0
        self._lock = threading.RLock()
        # (step, label) -> what this writer has written there, so a second emit for the
        # same step (stop/start inside one step) adds to the file instead of replacing it.
        self._written: dict[tuple[int, str], dict] = {}
        # (step, label) -> {original tensor file name: mapped name}
        self._mapped: dict[tuple[int, str], dict[str, str]] = {}
        self._alias: dict[str, str] = {}  # old label -> new label after rename_rank_folder
        self._logged: dict[tuple[int, str], int] = {}  # error-log messages per (step, label)
        self.errors_suppressed = 0
        #: What of the dump stays on disk (None: every step written).
        self.retention: DumpRetention | None = None
        self._tensor_bytes: dict[tuple[int, str], list[int]] = {}  # (step, label) -> [bytes, files]
        self._labels: dict[int, str] = {}  # step -> the label it was written under
        self._remover: Any = None
        # The last step can still be written (and its old steps removed) while the probe
        # closes the writer at exit: a removal then happens here, never lost to a closed pool.
        self._remover_lock = threading.Lock()
        self._behind: WriteBehind | None = None

    # ------------------------------------------------------------------ paths
    def rank_dir(self, step: int, rank_label: str) -> Path:
        label = self._alias.get(rank_label, rank_label)
        return self.dump_path / step_dir_name(int(step)) / label

    @property
    def _json_name(self) -> str:
        # msProbe's debug level (PrecisionDebugger.save only) writes debug.json instead.
        return "debug.json" if self.level == "debug" else "dump.json"

    # ------------------------------------------------------------------ Sink
    def write_behind(self) -> None:
        """From now on, steps are written by a thread behind the step (rankscope.dump.behind)."""
        if self._behind is None:
            self._behind = WriteBehind(self._emit_now)

    def flush(self) -> None:
        """Every step emitted so far is on disk when this returns."""
        if self._behind is not None:
            self._behind.drain()

    def emit(self, out: StepOutput) -> None:
        if not out.dump_selected:
            return
        if self._behind is not None:
            self._behind.submit(out)
            return
        self._emit_now(out)

    def _emit_now(self, out: StepOutput) -> None:
        step = int(out.batch.step)
        try:
            with self._lock:
                self._write_step(step, out)
        except Exception as exc:  # noqa: BLE001 - the probe never breaks training
            self._fail(step, out.rank_label, f"writing step {step} failed: {exc!r}")

    def close(self) -> None:
        """Every emitted step is on disk when this returns; removals finish."""
        behind, self._behind = self._behind, None
        if behind is not None:
            behind.close()
        with self._remover_lock:
            remover, self._remover = self._remover, None
        if remover is not None:
            remover.shutdown(wait=True)

    def _write_step(self, step: int, out: StepOutput) -> None:
        label = self._alias.get(out.rank_label, out.rank_label)
        key = (step, label)
        rdir = self.rank_dir(step, label)
        rdir.mkdir(parents=True, exist_ok=True)
        prev = self._written.get(key)
        if prev is None:
            prev = {"data": {}, "stacks": {}, "construct": {}}
            self._written[key] = prev
            # Steps only move forward: remember a few recent ones, not the whole run.
            while len(self._written) > _KEEP_STEPS:
                old = next(iter(self._written))
                self._written.pop(old)
                self._mapped.pop(old, None)
        entries = out.entries
        mapped = self._mapped.get(key)
        if mapped:
            entries = rename_data_names(entries, mapped)
        prev["data"].update(entries)
        prev["stacks"].update(out.stacks)
        prev["construct"].update(out.construct)
        tensor_dir = rdir / TENSOR_DIR
        dump = {
            "task": self.task,
            "level": self.level,
            "framework": "mindspore",
            "dump_data_dir": str(tensor_dir) if self.task == "tensor" else None,
            "data": prev["data"],
        }
        atomic_write_json(rdir / self._json_name, dump)
        atomic_write_json(rdir / "stack.json", group_stacks(prev["stacks"]))
        atomic_write_json(rdir / "construct.json", prev["construct"])
        self.steps_written += 1
        if self.retention is not None:
            self._retain(step, label, rdir)

    def _retain(self, step: int, label: str, rdir: Path) -> None:
        """Account the step's files; remove the steps the retention lets go, off this thread."""
        nbytes, files = self._tensor_bytes.get((step, label), [0, 0])
        for name in (self._json_name, "stack.json", "construct.json", ERROR_LOG):
            try:
                nbytes += (rdir / name).stat().st_size
                files += 1
            except OSError:
                pass
        self._labels[step] = label
        for old in self.retention.wrote(step, nbytes, files):
            self._tensor_bytes.pop((old, self._labels.get(old, label)), None)
            self._remove(self.rank_dir(old, self._labels.pop(old, label)))
        while len(self._tensor_bytes) > 4 * _KEEP_STEPS:
            self._tensor_bytes.pop(next(iter(self._tensor_bytes)))

    def pin_kept(self) -> None:
        """Keep the steps on disk now for the rest of the run (an incident exports)."""
        self.flush()  # the steps around the incident are on disk before anyone collects them
        with self._lock:
            if self.retention is not None:
                self.retention.pin()

    def retention_report(self) -> dict:
        with self._lock:
            return self.retention.report() if self.retention is not None else {}

    def _remove(self, rdir: Path) -> None:
        with self._remover_lock:
            if self._remover is None:
                from concurrent.futures import ThreadPoolExecutor
                self._remover = ThreadPoolExecutor(1, thread_name_prefix="rankscope-dump-retention")
            try:
                self._remover.submit(_remove_step_dir, rdir)
                return
            except RuntimeError:  # the interpreter is shutting down: no new threads
                pass
        _remove_step_dir(rdir)

    # ------------------------------------------------------------------ tensors
    def write_tensor(self, step: int, rank_label: str, data_name: str, array: Any) -> str:
        """Save one tensor as ``dump_tensor_data/<data_name>``; return the file name used.

        The return value is what belongs in the entry's ``data_name``: it differs from
        ``data_name`` only for names over 255 characters, which get a 32-digit name and a
        row in ``mapping.csv`` (emit also rewrites such ``data_name`` values itself).
        Unlike emit this raises on failure: the caller (a hook) logs and counts it.
        """
        if not isinstance(data_name, str) or not data_name or "/" in data_name or data_name in (".", ".."):
            raise ValueError(f"data_name = {data_name!r}: expected a plain file name")
        arr = np.asarray(array)
        if arr.dtype == object:
            raise ValueError(f"data_name = {data_name!r}: object arrays cannot be saved without pickle")
        label = self._alias.get(rank_label, rank_label)
        tdir = self.rank_dir(step, label) / TENSOR_DIR
        with self._lock:
            tdir.mkdir(parents=True, exist_ok=True)
            file_name = data_name
            if len(data_name.encode("utf-8")) > MAX_FILE_NAME:
                file_name = mapped_file_name(data_name)
                self._add_mapping(int(step), label, tdir, file_name, data_name)
        buf = io.BytesIO()
        np.save(buf, arr, allow_pickle=False)
        atomic_write_bytes(tdir / file_name, buf.getvalue())
        with self._lock:
            acc = self._tensor_bytes.setdefault((int(step), label), [0, 0])
            acc[0] += buf.tell()
            acc[1] += 1
        return file_name

    def _add_mapping(self, step: int, label: str, tdir: Path, file_name: str, original: str) -> None:
        table = self._mapped.setdefault((step, label), {})
        if table.get(original) == file_name:
            return
        table[original] = file_name
        write_mapping(tdir / MAPPING_CSV, file_name, original)

    # ------------------------------------------------------------------ errors
    def log_error(self, step: int, rank_label: str, msg: str) -> None:
        """Append a timestamped message to the step's dump_error_info.log; never raises.

        At most :data:`ERROR_LOG_LIMIT` messages per step and folder are written (then
        one line saying how many follow): a hook failing on every call must not turn
        into megabytes of tracebacks per step on the training thread.
        """
        try:
            label = self._alias.get(rank_label, rank_label)
            key = (int(step), label)
            with self._lock:
                n = self._logged.get(key, 0) + 1
                self._logged[key] = n
                if len(self._logged) > 4 * _KEEP_STEPS:
                    self._logged.pop(next(iter(self._logged)))
                if n > ERROR_LOG_LIMIT + 1:
                    self.errors_suppressed += 1
                    return
                if n == ERROR_LOG_LIMIT + 1:
                    msg = (f"more than {ERROR_LOG_LIMIT} errors in this step: further messages "
                           f"suppressed (the probe still counts them)")
                rdir = self.rank_dir(step, label)
                rdir.mkdir(parents=True, exist_ok=True)
                stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S %z")
                with open(rdir / ERROR_LOG, "a", encoding="utf-8") as fh:
                    fh.write(f"[{stamp}] {msg}\n")
        except Exception:  # noqa: BLE001
            pass

    def _fail(self, step: int, rank_label: str, msg: str) -> None:
        self.errors += 1
        if self.errors == 1:
            # The error log is under dump_path too: when that is what cannot be written,
            # this line is all anyone sees.
            from rankscope.wire.attach_report import say_once
            say_once(f"the local dump under {self.dump_path} could not be written ({msg}); training goes on, "
                     "and this rank's dump files may be missing: check dump_path")
        self.log_error(step, rank_label, msg)

    # ------------------------------------------------------------------ rank rename
    def rename_rank_folder(self, old_label: str, new_label: str) -> list[Path]:
        """Move every ``step*/old_label`` to ``step*/new_label`` once the rank is known.

        Never overwrites: when the target exists, entries that do not clash are moved in
        and clashing ones stay in the old folder, noted in the target's error log.
        Later writes under ``old_label`` go to ``new_label``. Returns the folders kept
        because of clashes (empty when everything moved).
        """
        kept: list[Path] = []
        self.flush()  # the folders to move are all on disk
        with self._lock:
            if old_label == new_label:
                return kept
            # Re-point earlier aliases too (proc1 -> rank0, then a remap rank0 -> rank5).
            for old, new in list(self._alias.items()):
                if new == old_label:
                    self._alias[old] = new_label
            self._alias[old_label] = new_label
            self._alias.pop(new_label, None)
            for key in [k for k in self._written if k[1] == old_label]:
                self._written[(key[0], new_label)] = self._written.pop(key)
            for key in [k for k in self._mapped if k[1] == old_label]:
                self._mapped[(key[0], new_label)] = self._mapped.pop(key)
            if not self.dump_path.is_dir():
                return kept
            for step_dir in sorted(self.dump_path.glob("step*")):
                src, dst = step_dir / old_label, step_dir / new_label
                if not src.is_dir():
                    continue
                if not dst.exists():
                    try:
                        # rename(2) silently replaces an *empty* dst, so claim dst with
                        # mkdir first; then replacing our own empty dir is safe, and if
                        # anything appeared in it meanwhile rename fails and we merge.
                        dst.mkdir()
                        os.rename(src, dst)
                        self._repoint_tensor_dir(dst)
                        continue
                    except OSError:
                        pass
                clashes = merge_dir(src, dst)
                self._repoint_tensor_dir(dst)
                if clashes:
                    kept.append(src)
                    self._note(dst, f"{src} kept: {len(clashes)} file(s) already present in {dst.name}: "
                               + ", ".join(sorted(clashes)[:10]))
                else:
                    rmdir_quiet(src)
        return kept

    def _repoint_tensor_dir(self, rdir: Path) -> None:
        """A moved dump.json still names the old folder in dump_data_dir: point it here."""
        path = rdir / self._json_name
        try:
            dump = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(dump, dict) and dump.get("dump_data_dir"):
                dump["dump_data_dir"] = str(rdir / TENSOR_DIR)
                atomic_write_json(path, dump)
        except (OSError, ValueError):
            pass  # no dump.json here (only tensors moved so far), or not ours

    def _note(self, rdir: Path, msg: str) -> None:
        try:
            stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S %z")
            with open(rdir / ERROR_LOG, "a", encoding="utf-8") as fh:
                fh.write(f"[{stamp}] {msg}\n")
        except OSError:
            pass


def _remove_step_dir(rdir: Path) -> None:
    """A rank's folder of one step, then the step folder if no rank is left in it."""
    import shutil
    shutil.rmtree(rdir, ignore_errors=True)
    rmdir_quiet(rdir.parent)
