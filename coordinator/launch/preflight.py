"""What ``rankscope launch`` checks before it starts anything.

Starting Ray, the coordinator and the node agent takes tens of seconds; a typo found
after that wastes them, and one found by the ranks is worse: they run unwatched. So
everything a user typed is checked first, and each problem is one :class:`UsageError`
line naming the option, the value and what was expected.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path


class UsageError(Exception):
    """Bad input on the command line: one line for the terminal, exit status 2."""


def check_config(config: Path | None, on_divergence: str | None) -> dict:
    """The job's config (``rankscope.config.job.job_config``), after checking every
    section of the file (the ranks read it: a field they would reject fails here)."""
    from rankscope.config.errors import ConfigError
    from rankscope.config.file import read_config_file
    from rankscope.config.job import job_config
    from rankscope.config.rdr import resolve_rdr
    try:
        job = job_config(config, on_divergence)
    except ConfigError as exc:
        raise UsageError(f"--config {config}: {exc.reason if exc.field == 'config_path' else exc}") from None
    try:
        # The ranks inherit this environment, and read MS_RDR_* where the file is silent.
        resolve_rdr(read_config_file(config).get("rdr") if config is not None else None, os.environ)
    except ConfigError as exc:
        if exc.field.startswith("MS_RDR"):
            raise UsageError(f"environment variable {exc.field}={exc.value!r}: {exc.reason}") from None
        raise UsageError(f"--config {config}: {exc}") from None
    return job


def resolve_command(cmd: list[str], path: str | None) -> list[str]:
    """``cmd`` with its program checked: it exists and is executable, looked up on
    ``path`` (the PATH the command will run with) when it names no folder."""
    if not cmd:
        raise UsageError("no command given: rankscope launch [options] -- CMD ...")
    prog = cmd[0]
    if os.sep in prog:
        p = Path(prog)
        if not p.exists():
            raise UsageError(f"command {prog!r}: no such file")
        if p.is_dir() or not os.access(p, os.X_OK):
            raise UsageError(f"command {prog!r}: not an executable file (try: python {prog})")
        return cmd
    if shutil.which(prog, path=path) is None:
        raise UsageError(f"command {prog!r}: not found on PATH")
    return cmd


def writable_dir(option: str, path: Path) -> Path:
    """``path`` made if missing; UsageError naming ``option`` when it cannot be made or written."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{option} {path}: cannot create it ({exc.strerror or exc})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {path}: not writable")
    return path.resolve()


def writable_file(option: str, path: Path) -> Path:
    """A file launch will append to: its folder is made, and the file can be opened."""
    writable_dir(option, path.parent)
    if path.is_dir():
        raise UsageError(f"{option} {path}: is a folder, expected a file")
    try:
        with open(path, "ab"):
            pass
    except OSError as exc:
        raise UsageError(f"{option} {path}: cannot write it ({exc.strerror or exc})") from None
    return path.resolve()


def non_negative(option: str, value: float) -> float:
    if not value >= 0:  # also refuses nan
        raise UsageError(f"{option} {value}: expected a number of seconds >= 0")
    return value
