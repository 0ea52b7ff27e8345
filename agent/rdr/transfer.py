"""Bundle files over the wire as BUNDLE_CHUNK bodies (rankscope.wire.protocol), with no shared filesystem.

Sender: :func:`iter_file_chunks` reads each file in ``BUNDLE_CHUNK_BYTES`` pieces and puts
the file's sha256 on its final chunk. Receiver: :class:`BundleAssembler` writes each file
to a hidden ``.part`` file at the chunk's offset, checks size and sha256 on the final
chunk, and only then renames it into place. The ``.part`` file is the resume state: a
receiver that restarts, or a sender cut off mid-file, continues from
:meth:`BundleAssembler.resume_offsets`. A corrupt or short file is never renamed into
place; it is listed in :attr:`BundleAssembler.problems` with the reason.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Iterable, Iterator, Mapping

from rankscope.wire.layout import bundle_dir_name
from rankscope.wire.protocol import BUNDLE_CHUNK_BYTES

log = logging.getLogger(__name__)

_SAFE_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")
MAX_FILE_BYTES = 8 << 30


def _expand(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """Directories become their files (sorted), skipping hidden temp/owner files."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(f for f in p.rglob("*") if f.is_file()
                          and not any(part.startswith(".") for part in f.relative_to(p).parts))
        else:
            out.append(p)
    return out


def iter_file_chunks(paths: Iterable[str | os.PathLike], root: str | os.PathLike, rank: int, transfer_id: str,
                     *, chunk_bytes: int = BUNDLE_CHUNK_BYTES, on_behalf: bool = False,
                     resume: Mapping[str, int] | None = None) -> Iterator[dict]:
    """Yield BUNDLE_CHUNK bodies for every file, path relative to ``root``.

    ``resume`` maps a relative path to the offset the receiver already holds; bytes
    before it are hashed but not sent. A file that cannot be read to its end gets a
    final chunk with ``incomplete=True`` and no sha256, so the receiver keeps what it
    has under an ``.incomplete`` name instead of a silent half file.
    """
    if not _SAFE_ID.fullmatch(transfer_id):
        raise ValueError(f"transfer_id: {transfer_id!r} is not a safe id")
    root_path = Path(root).resolve()
    resume = resume or {}
    for path in _expand(paths):
        try:
            rel = path.resolve().relative_to(root_path).as_posix()
        except ValueError:
            raise ValueError(f"paths: {str(path)!r} is not under root {str(root_path)!r}") from None
        yield from _file_chunks(path, rel, rank, transfer_id, chunk_bytes, on_behalf, int(resume.get(rel, 0)))


def _file_chunks(path: Path, rel: str, rank: int, transfer: str, chunk: int, on_behalf: bool,
                 start: int) -> Iterator[dict]:
    def body(offset: int, data: bytes, size: int, final: bool, **more) -> dict:
        return dict(rank=rank, transfer=transfer, path=rel, offset=offset, data=data, size=size,
                    final=final, on_behalf=on_behalf, **more)

    sha = hashlib.sha256()
    offset = 0
    size = 0
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            start = max(0, min(start, size))
            while offset < start:  # already at the receiver: hash only
                data = f.read(min(chunk, start - offset))
                if not data:
                    raise OSError(f"{path} shrank while being read")
                sha.update(data)
                offset += len(data)
            while True:
                data = f.read(min(chunk, size - offset))
                if offset + len(data) < size and not data:
                    raise OSError(f"{path} shrank while being read")
                sha.update(data)
                final = offset + len(data) >= size
                yield body(offset, data, size, final, **({"sha256": sha.hexdigest()} if final else {}))
                offset += len(data)
                if final:
                    return
    except OSError as exc:
        log.error("RDR transfer: cannot read %s (%s): sending it as incomplete", path, exc)
        yield body(offset, b"", size, True, incomplete=True)


@dataclass
class TransferProblem:
    rank: int | None
    transfer: str | None
    path: str | None
    reason: str

    def __str__(self) -> str:
        return f"rank {self.rank} transfer {self.transfer} file {self.path}: {self.reason}"


def _safe_rel(path: object) -> PurePosixPath | None:
    if not isinstance(path, str) or not path or len(path) > 1024 or "\\" in path or "\0" in path:
        return None
    p = PurePosixPath(path)
    if p.is_absolute() or any(part in ("", ".", "..") or part.startswith(".") for part in p.parts):
        return None
    return p


class BundleAssembler:
    """Receives BUNDLE_CHUNK bodies into ``dest_root/rank_<rank>/<path>`` (or ``dest_root/<path>``
    with ``per_rank_dirs=False``). ``accept`` returns the final Path when a file is complete
    and verified, else None; it never raises on bad input (see :attr:`problems`)."""

    def __init__(self, dest_root: str | os.PathLike, *, per_rank_dirs: bool = True,
                 max_file_bytes: int = MAX_FILE_BYTES) -> None:
        self.dest_root = Path(dest_root)
        self.per_rank_dirs = per_rank_dirs
        self.max_file_bytes = max_file_bytes
        self.problems: list[TransferProblem] = []
        self.completed: dict[tuple[int, str], list[Path]] = {}
        self._done: set[tuple[int, str, str]] = set()
        # Running sha256 per file while chunks arrive in order, so a multi-GB dump is not
        # read back at the end; any out-of-order chunk drops it and _finish re-reads.
        self._hashing: dict[tuple[int, str, str], tuple["hashlib._Hash", int]] = {}
        self.duplicates = 0

    def _problem(self, body: Mapping, reason: str) -> None:
        p = TransferProblem(body.get("rank"), body.get("transfer"), body.get("path"), reason)
        self.problems.append(p)
        log.warning("RDR transfer: %s", p)

    def _base(self, rank: int) -> Path:
        return self.dest_root / bundle_dir_name(rank) if self.per_rank_dirs else self.dest_root

    @staticmethod
    def _part(dest: Path, transfer: str) -> Path:
        return dest.with_name(f".{dest.name}.{transfer}.part")

    def accept(self, body: Mapping) -> Path | None:
        rank, transfer, rel = body.get("rank"), body.get("transfer"), _safe_rel(body.get("path"))
        offset, data, size, final = (body.get(k) for k in ("offset", "data", "size", "final"))
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
            return self._problem(body, "bad rank")
        if not isinstance(transfer, str) or not _SAFE_ID.fullmatch(transfer):
            return self._problem(body, "bad transfer id")
        if rel is None:
            return self._problem(body, "unsafe or empty path (absolute, '..', hidden or too long)")
        if not isinstance(data, bytes) or not all(isinstance(v, int) and not isinstance(v, bool)
                                                  for v in (offset, size)):
            return self._problem(body, "bad offset/size/data types")
        if not 0 <= size <= self.max_file_bytes or offset < 0 or offset + len(data) > size:
            return self._problem(body, f"chunk [{offset}, {offset + len(data)}) outside file size {size}")
        key = (rank, transfer, str(rel))
        if key in self._done:
            self.duplicates += 1
            return None
        dest = self._base(rank) / rel
        part = self._part(dest, transfer)
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            have = part.stat().st_size if part.exists() else 0
            if offset > have:
                return self._problem(body, f"gap: have {have} bytes, chunk starts at {offset}; resend from {have}")
            fd = os.open(part, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                # pwrite, not append: a replayed chunk rewrites the same bytes in place.
                if data:
                    os.pwrite(fd, data, offset)
                if final:
                    os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            self._hashing.pop(key, None)
            return self._problem(body, f"write failed: {exc.strerror or exc}")
        h, upto = self._hashing.get(key) or (hashlib.sha256(), 0)
        if upto == offset:
            h.update(data)
            self._hashing[key] = (h, offset + len(data))
        else:
            self._hashing.pop(key, None)
        return self._finish(body, key, dest, part) if final else None

    def _finish(self, body: Mapping, key: tuple[int, str, str], dest: Path, part: Path) -> Path | None:
        size = body["size"]
        if body.get("incomplete"):
            self._hashing.pop(key, None)
            kept = _free_name(dest.with_name(dest.name + ".incomplete"))
            os.replace(part, kept)
            self._done.add(key)
            return self._problem(body, f"sender could not read the whole file; partial data kept as {kept.name}")
        have = part.stat().st_size
        if have != size:
            self._hashing.pop(key, None)
            return self._problem(body, f"size mismatch: have {have} of {size} bytes; resend from {min(have, size)}")
        want = body.get("sha256")
        running = self._hashing.pop(key, None)
        if not isinstance(want, str):
            return self._problem(body, "final chunk carries no sha256")
        got = running[0].hexdigest() if running is not None and running[1] == size else _sha256_file(part)
        if got != want:
            part.unlink()  # the bad bytes could be anywhere: start the file over
            return self._problem(body, f"sha256 mismatch (corrupt chunk): got {got[:16]}..., want {want[:16]}...; "
                                       "file discarded, resend it from offset 0")
        if dest.exists() and _sha256_file(dest) == got:
            part.unlink()  # the same file sent twice: keep the first, it is identical
            final = dest
        else:
            final = _free_name(dest)
            os.replace(part, final)
        self._done.add(key)
        self.completed.setdefault(key[:2], []).append(final)
        return final

    def resume_offsets(self, rank: int, transfer: str) -> dict[str, int]:
        """Relative path -> bytes already held, for files of this transfer still in progress."""
        base = self._base(rank)
        out = {}
        suffix = f".{transfer}.part"
        if base.is_dir():
            for part in base.rglob(f".*{suffix}"):
                name = part.name[1:-len(suffix)]
                out[(part.parent / name).relative_to(base).as_posix()] = part.stat().st_size
        return out

    def pending(self) -> list[str]:
        """Files started but not complete, as readable lines (for an export timeout report)."""
        return [f"{p.relative_to(self.dest_root)}: {p.stat().st_size} bytes so far"
                for p in sorted(self.dest_root.rglob("*.part")) if p.is_file()]


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _free_name(dest: Path) -> Path:
    """``dest`` or ``dest.1``, ``dest.2`` ...: nothing received is ever overwritten."""
    n, cand = 0, dest
    while cand.exists():
        n += 1
        cand = dest.with_name(f"{dest.name}.{n}")
    return cand
