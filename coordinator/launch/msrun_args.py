"""msrun's own command line, as far as ``rankscope launch`` must understand it.

msrun returns as soon as it has spawned its workers unless it is given ``--join=True``
(its default is False): the workers then train on in the background, after the
command launch waits on has ended. Launch would take the job for over, stop its
coordinator and agent and remove the job's config while the workers still start up,
so they run unwatched or fail to attach, and its verdict would be about nothing. So an
msrun line is run with ``--join=True``, and launch says so.
"""
from __future__ import annotations

import os

_MODULE = "mindspore.parallel.cluster.run"
JOIN_NOTE = ("msrun returns before its workers end unless it is given --join=True (its default is False): "
             "running it with --join=True, so the job is watched to its end")


def _options_start(cmd: list[str]) -> int | None:
    """Index of msrun's first option in ``cmd``, or None when ``cmd`` is not an msrun line."""
    if not cmd:
        return None
    if os.path.basename(cmd[0]) == "msrun":
        return 1
    if os.path.basename(cmd[0]).startswith("python") and cmd[1:3] == ["-m", _MODULE]:
        return 3
    return None


def joined(cmd: list[str]) -> tuple[list[str], str | None]:
    """``cmd`` with msrun told to wait for its workers, and a line saying so when that
    changed it; any other command unchanged."""
    i = _options_start(cmd)
    if i is None:
        return cmd, None
    out = list(cmd[:i])
    value: str | None = None
    while i < len(cmd) and cmd[i].startswith("-"):
        arg = cmd[i]
        # Every msrun option takes a value: as --opt=value or as the next word.
        name, eq, inline = arg.partition("=")
        nxt = None if eq or i + 1 >= len(cmd) else cmd[i + 1]
        if name == "--join":
            value = inline if eq else nxt
        else:
            out.append(arg)
            if nxt is not None:
                out.append(nxt)
        i += 1 if eq or nxt is None else 2
    if value in ("True", "1") or i >= len(cmd) or cmd[i] in ("-h", "--help"):
        return cmd, None  # joined already, or no training script (a help line)
    return [*out, "--join=True", *cmd[i:]], JOIN_NOTE
