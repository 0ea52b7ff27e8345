"""msrun's worker logs, linked into the export folder where an incident's report finds them.

msrun writes ``worker_N.log`` where its ``--log_dir`` says, or in the directory it runs
in; a report looks in the export folder. So launch keeps ``<export>/worker_logs/``, a
folder of its own holding one link per log msrun has written so far (checked at each of
launch's polls). Links to files, never to the log folder itself: msrun's default log
folder is the working directory, which usually holds the export folder, and a link to it
would be a cycle for every ``cp -rL`` or ``tar -h`` of the export folder.
"""
from __future__ import annotations

from pathlib import Path

from rankscope.coordinator.launch import msrun_args

FOLDER = "worker_logs"


class WorkerLogLinks:
    def __init__(self, logs: Path, export_dir: Path) -> None:
        self.logs, self.folder = logs, export_dir / FOLDER
        self.linked: set[str] = set()

    @classmethod
    def for_command(cls, cmd: list[str], cwd: Path, export_dir: Path) -> "WorkerLogLinks | None":
        """None when ``cmd`` is not msrun, or its logs are in the export folder already."""
        logs = msrun_args.log_dir(cmd, cwd)
        if logs is None or logs == export_dir or export_dir in logs.parents:
            return None
        links = cls(logs, export_dir)
        links._clear()
        return links

    def _clear(self) -> None:
        """An earlier run's links into the same export folder go; anything else stays."""
        if self.folder.is_symlink():
            self.folder.unlink()
        if self.folder.is_dir():
            for p in self.folder.iterdir():
                if p.is_symlink():
                    p.unlink()

    def poll(self) -> None:
        """Link the logs msrun has written since the last poll. Never raises: the run goes
        on whatever happens to its logs."""
        try:
            new = [p for p in self.logs.glob("*.log") if p.name not in self.linked and p.is_file()]
            if not new:
                return
            self.folder.mkdir(parents=True, exist_ok=True)
            for p in new:
                target = self.folder / p.name
                if not target.exists() and not target.is_symlink():
                    target.symlink_to(p)
                self.linked.add(p.name)
        except OSError:
            pass
