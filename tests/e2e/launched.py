"""What the single-node e2e tests read of a ``rankscope launch`` run that went wrong: its
exit status and output, then the tail of every worker's msrun log."""
from __future__ import annotations

import subprocess
from pathlib import Path


def explain(proc: subprocess.CompletedProcess, out: Path, lines: int = 15) -> str:
    logs = ""
    for log in sorted((out / "msrun_logs").glob("worker_*.log"))[:4]:
        logs += f"\n--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    return f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-2000:]}{logs}"
