"""Atomic file replacement: a reader sees the old file or the new one, never half of one.

Every file rankscope writes that someone else reads (dumps, bundles, rank maps,
incidents, keys) goes through here, so a crash or a full disk mid-write cannot
leave a truncated file behind under the real name.
"""
from __future__ import annotations

import hashlib
import os
import threading


def atomic_write_bytes(path: str | os.PathLike, data: bytes, *, fsync: bool = False) -> None:
    """Write ``data`` to a temp file beside ``path``, then rename it over ``path``.

    ``fsync=True`` also forces the bytes to disk before the rename, for files that must
    survive a machine crash (bundles, incident state), at the cost of a disk flush.
    """
    path = os.fspath(path)
    head, name = os.path.split(path)
    if len(name.encode("utf-8")) > 200:  # the temp name must fit in 255 bytes too
        name = hashlib.sha1(name.encode("utf-8")).hexdigest()
    # pid + thread id: concurrent writers of one path never share a temp file.
    tmp = os.path.join(head, f".{name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
