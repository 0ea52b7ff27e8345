"""Run a training script in a subprocess the way ``rankscope launch`` starts a rank (the
attach hook on PYTHONPATH, no node agent), with the watch on or off."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from repo_paths import REPO


def run_script(tmp_path: Path, script: str, args: list[str], attach: bool) -> subprocess.CompletedProcess:
    """``script`` as train.py in ``tmp_path``; fails the test on a non-zero exit."""
    path = tmp_path / "train.py"
    path.write_text(script)
    env = dict(os.environ)
    env.pop("RANKSCOPE_AGENT", None)
    env.update({"RANKSCOPE_ATTACH": "1" if attach else "0", "RANKSCOPE_DUMP_PATH": str(tmp_path / "dump"),
                "PYTHONPATH": os.pathsep.join([str(REPO / "agent" / "_attach"), str(REPO)]), "GLOG_v": "3"})
    proc = subprocess.run([sys.executable, str(path), *args], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc
