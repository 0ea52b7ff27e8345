"""Write one RDR bundle: ``<root>/rank_<id>/rdr/`` with files named by what they hold.

Every file is written to a temp name, fsynced and renamed, so a reader never sees half
a file. ``manifest.json`` lists every file with its size and sha256; it is written
first as ``complete: false`` and replaced at the end, so a bundle cut short by a full
disk (or a second signal) still says it is incomplete. A write that fails is recorded
in the manifest's ``errors`` (file + reason) and logged; the other files still go out.

Nothing is overwritten: if ``rdr/`` already holds a bundle, the next one goes to
``rdr.1/``, ``rdr.2/`` ... A directory reserved by a process that has since died
(the in-rank recorder reserves its directory at install, so faulthandler can write
fatal-signal stacks into it) is adopted by the next writer on the same host: that is
how the node agent's on-behalf bundle for a segfaulted rank includes those stacks.
"""
from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import socket
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

from rankscope.rdr import diagnostics, steps_file
from rankscope.rdr.flight_recorder import FlightRecorder, Step
from rankscope.files.atomic import atomic_write_bytes
from rankscope.wire.layout import bundle_dir_name

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
OWNER = ".owner.json"
FATAL_STACKS = "fatal_signal_stacks.txt"
FORMAT = "rankscope-rdr/1"
_SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}")


class RdrWriteError(OSError):
    """The bundle could not be written at all (not even its manifest)."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _adoptable(d: Path) -> bool:
    if (d / MANIFEST).exists():
        return False
    try:
        owner = json.loads((d / OWNER).read_text())
    except (OSError, ValueError):
        return False
    return owner.get("host") == socket.gethostname() and not _pid_alive(int(owner.get("pid", -1)))


def reserve_bundle_dir(root: str | os.PathLike, rank: int | str) -> Path:
    """Create (or adopt a dead owner's) bundle directory for ``rank`` and own it."""
    rank_dir = Path(root) / bundle_dir_name(rank)
    try:
        rank_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RdrWriteError(exc.errno, f"RDR: cannot create {rank_dir}: {exc.strerror}") from exc
    for n in range(10_000):
        d = rank_dir / ("rdr" if n == 0 else f"rdr.{n}")
        try:
            d.mkdir()
        except FileExistsError:
            if not _adoptable(d):
                continue
        except OSError as exc:
            raise RdrWriteError(exc.errno, f"RDR: cannot create {d}: {exc.strerror}") from exc
        try:
            (d / OWNER).write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
        except OSError as exc:
            raise RdrWriteError(exc.errno, f"RDR: cannot write in {d}: {exc.strerror}") from exc
        return d
    raise RdrWriteError(errno.EEXIST, f"RDR: no free bundle directory under {rank_dir}")


def atomic_write(path: Path, data: bytes) -> None:
    # fsync: a bundle is written because the process is dying; it must reach the disk.
    atomic_write_bytes(path, data, fsync=True)


class _Writer:
    """Collects per-file results; one failed file never stops the others."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.files: dict[str, dict] = {}
        self.errors: list[dict] = []

    def put(self, name: str, data: bytes | str) -> None:
        raw = data.encode() if isinstance(data, str) else data
        target = self.dir / name
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(target, raw)
        except OSError as exc:
            self.fail(name, exc)
            return
        self.files[name] = {"size": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}

    def put_json(self, name: str, doc: Any) -> None:
        try:
            text = json.dumps(doc, indent=1, default=str)
        except (TypeError, ValueError) as exc:
            self.errors.append({"file": name, "error": f"not JSON-serialisable: {exc}"})
            return
        self.put(name, text)

    def copy(self, src: Path, name: str) -> None:
        try:
            data = src.read_bytes()
        except OSError as exc:
            self.fail(name, exc)
            return
        self.put(name, data)

    def fail(self, name: str, exc: OSError) -> None:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            reason += " (disk full or file size limit: bundle is incomplete)"
        self.errors.append({"file": name, "error": reason, "errno": exc.errno})
        log.error("RDR: could not write %s: %s", self.dir / name, reason)

    def manifest(self, meta: dict, complete: bool) -> bytes:
        doc = dict(meta, complete=complete, errors=self.errors,
                   files=[dict(path=k, **v) for k, v in sorted(self.files.items())])
        return json.dumps(doc, indent=1).encode()


def write_bundle(root: str | os.PathLike, rank_label_or_id: int | str, *, reason: str,
                 steps: FlightRecorder | Iterable[Step] | None = (), exception: BaseException | str | None = None,
                 config: Any = None, seeds: Mapping | None = None, extra: Mapping[str, Any] | None = None,
                 on_behalf: bool = False, names: Mapping[int, str] | None = None,
                 directory: str | os.PathLike | None = None, env: Mapping[str, str] | None = None,
                 texts: Mapping[str, str] | None = None) -> Path:
    """Write a bundle and return its directory; see the module docstring for the layout.

    ``steps``: a FlightRecorder (its name table is used) or StepOutputs/StepBatches with
    ``names`` (id -> name). ``extra``: more JSON documents, each written as
    ``<key>.json`` (e.g. ``{"rank_lost": {...}, "rank_map": [...]}``). ``on_behalf``: the
    node agent writing for a dead rank, so this process's stacks, environment and memory
    are not the rank's and are left out. ``directory``: a directory already reserved with
    :func:`reserve_bundle_dir`. ``texts``: more text files by name (an on-behalf bundle's
    stacks captured from the rank). Raises RdrWriteError only if not even the manifest could
    be written; otherwise check ``manifest.json``'s ``complete``.
    """
    d = Path(directory) if directory is not None else reserve_bundle_dir(root, rank_label_or_id)
    w = _Writer(d)
    meta = {"format": FORMAT, "rank": str(rank_label_or_id), "reason": reason, "on_behalf": on_behalf,
            "pid": os.getpid(), "host": socket.gethostname(), "written_at": time.time()}
    try:
        atomic_write(d / MANIFEST, w.manifest(dict(meta, state="writing"), complete=False))
    except OSError as exc:
        raise RdrWriteError(exc.errno, f"RDR: cannot write {d / MANIFEST}: {exc.strerror}") from exc

    _write_contents(w, reason=reason, steps=steps, exception=exception, config=config, seeds=seeds,
                    extra=extra, on_behalf=on_behalf, names=names, env=env)
    for name, text in (texts or {}).items():
        if _SAFE_NAME.fullmatch(name) and name != MANIFEST:
            w.put(name, text)
    _adopt_existing(w)
    try:
        atomic_write(d / MANIFEST, w.manifest(meta, complete=not w.errors))
    except OSError as exc:
        w.fail(MANIFEST, exc)
        raise RdrWriteError(exc.errno, f"RDR: bundle {d} is incomplete; its final manifest could not be "
                                       f"written ({exc.strerror}); the 'writing' manifest stays") from exc
    try:
        (d / OWNER).unlink()
    except OSError:
        pass
    if w.errors:
        log.error("RDR: bundle %s is INCOMPLETE: %d file(s) failed: %s", d, len(w.errors),
                  ", ".join(e["file"] for e in w.errors))
    return d


def _write_contents(w: _Writer, *, reason, steps, exception, config, seeds, extra, on_behalf, names, env) -> None:
    if isinstance(steps, FlightRecorder):
        steps = steps.steps()
    batches = steps_file.as_batches(steps or ())
    all_names: dict[int, str] = {}
    for b in batches:
        all_names.update(b.new_names)
    all_names.update(getattr(steps, "names", None) or {})  # a FlightRecorder snapshot knows them all
    k = getattr(steps, "k", None)
    if names:
        all_names.update(names)
    w.put("flight_recorder_steps.msgpack", steps_file.encode_steps(batches, all_names))
    w.put("flight_recorder_steps.json", steps_file.summary_json(batches, all_names, k))
    exc_text = diagnostics.format_exception(exception)
    if exc_text is not None:
        w.put("exception.txt", exc_text)
    if not on_behalf:
        w.put("thread_stacks.txt", diagnostics.thread_stacks())
        w.put_json("environment.json", diagnostics.environment(env))
        w.put_json("memory.json", diagnostics.memory())
        for src, name in diagnostics.graph_files(env):
            w.copy(src, name)
    w.put_json("versions.json", diagnostics.versions())
    if config is not None:
        w.put_json("config.json", config.to_dict() if hasattr(config, "to_dict") else config)
    if seeds is not None:
        w.put_json("seeds.json", dict(seeds))
    elif not on_behalf:
        w.put_json("seeds.json", diagnostics.observed_seeds(env))
    for key, doc in (extra or {}).items():
        if not _SAFE_NAME.fullmatch(key) or key in ("manifest",):
            w.errors.append({"file": f"{key}.json", "error": "extra key is not a safe file name"})
            continue
        w.put_json(f"{key}.json", doc)


def _adopt_existing(w: _Writer) -> None:
    """Files already in the directory (faulthandler's output) join the manifest."""
    for path in sorted(w.dir.rglob("*")):
        rel = path.relative_to(w.dir).as_posix()
        if not path.is_file() or rel in w.files or rel == MANIFEST or path.name.startswith("."):
            continue
        if path.name == FATAL_STACKS and path.stat().st_size == 0:
            path.unlink()  # no fatal signal happened; an empty file would only mislead
            continue
        data = path.read_bytes()
        w.files[rel] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def verify_bundle(directory: str | os.PathLike) -> list[str]:
    """Problems found (empty list = complete and every sha256 matches)."""
    d = Path(directory)
    try:
        man = json.loads((d / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        return [f"{MANIFEST}: unreadable ({exc})"]
    problems = [] if man.get("complete") else ["manifest says incomplete"]
    problems += [f"{e.get('file')}: {e.get('error')}" for e in man.get("errors", [])]
    for entry in man.get("files", []):
        try:
            data = (d / entry["path"]).read_bytes()
        except OSError as exc:
            problems.append(f"{entry['path']}: missing ({exc.strerror})")
            continue
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            problems.append(f"{entry['path']}: sha256 mismatch")
    return problems
