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
from pathlib import Path

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


def _options(cmd: list[str], i: int) -> tuple[list[tuple[str, str | None, list[str]]], int]:
    """msrun's options from ``cmd[i]`` on: (name, value, the words it took), and the index
    of the first word after them (the training script)."""
    out = []
    while i < len(cmd) and cmd[i].startswith("-"):
        arg = cmd[i]
        # Every msrun option takes a value: as --opt=value or as the next word.
        name, eq, inline = arg.partition("=")
        nxt = None if eq or i + 1 >= len(cmd) else cmd[i + 1]
        out.append((name, inline if eq else nxt, [arg] if eq or nxt is None else [arg, nxt]))
        i += 1 if eq or nxt is None else 2
    return out, i


def joined(cmd: list[str]) -> tuple[list[str], str | None]:
    """``cmd`` with msrun told to wait for its workers, and a line saying so when that
    changed it; any other command unchanged."""
    i = _options_start(cmd)
    if i is None:
        return cmd, None
    opts, i = _options(cmd, i)
    value = next((v for name, v, _ in opts if name == "--join"), None)
    if value in ("True", "1") or i >= len(cmd) or cmd[i] in ("-h", "--help"):
        return cmd, None  # joined already, or no training script (a help line)
    kept = [w for name, _, words in opts if name != "--join" for w in words]
    return [*cmd[:_options_start(cmd)], *kept, "--join=True", *cmd[i:]], JOIN_NOTE


def log_dir(cmd: list[str], cwd: Path) -> Path | None:
    """Where msrun writes its workers' logs: its ``--log_dir``, else the directory it runs
    in; None for any other command."""
    i = _options_start(cmd)
    if i is None:
        return None
    value = next((v for name, v, _ in _options(cmd, i)[0] if name == "--log_dir"), None)
    return (cwd / value).resolve() if value else cwd.resolve()
