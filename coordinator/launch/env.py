"""The environment ``rankscope launch`` gives the command it runs.

Every Python process the command starts (msrun's workers included) inherits it: the
attach directory first on PYTHONPATH runs ``agent/_attach/sitecustomize.py`` at
interpreter start, and the ``RANKSCOPE_*`` variables tell the probe where its node
agent is, which job it belongs to and where to write its local dump.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import rankscope
from rankscope.wire import attach_report
from rankscope.wire.job_config import CONFIG_ENV, DUMP_PATH_ENV
from rankscope.text.watch_line import LAUNCH_OUTPUT_ENV

#: Holds the sitecustomize.py every launched Python process runs at start-up.
ATTACH_DIR = Path(rankscope.__file__).resolve().parent / "_attach"


@dataclass(frozen=True)
class AttachSettings:
    job: str
    agent_endpoint: str
    dump_path: Path
    config_path: Path | None = None
    on_terminate: str = "raise"
    #: Where a rank that fails to attach leaves its note (rankscope.wire.attach_report).
    attach_reports: Path | None = None
    #: stream_id of the file launch prints its progress to ("": it prints nothing).
    launch_output: str = ""


def child_env(settings: AttachSettings, base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    # msrun starts workers as `python` from PATH: make that this interpreter, so the
    # workers see the same installed packages as the launcher.
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bindir, env.get("PATH", "")]).rstrip(os.pathsep)
    paths = [str(ATTACH_DIR), *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env["RANKSCOPE_ATTACH"] = "1"
    env["RANKSCOPE_JOB"] = settings.job
    env["RANKSCOPE_AGENT"] = settings.agent_endpoint
    env[DUMP_PATH_ENV] = str(settings.dump_path)
    env["RANKSCOPE_ON_TERMINATE"] = settings.on_terminate
    if settings.attach_reports is not None:
        env[attach_report.ENV_VAR] = str(settings.attach_reports)
    else:
        env.pop(attach_report.ENV_VAR, None)
    if settings.launch_output:
        env[LAUNCH_OUTPUT_ENV] = settings.launch_output
    else:
        env.pop(LAUNCH_OUTPUT_ENV, None)
    if settings.config_path is not None:
        env[CONFIG_ENV] = str(settings.config_path)
    else:
        env.pop(CONFIG_ENV, None)
    return env
