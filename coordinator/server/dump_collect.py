"""Cluster-wide dump collection: every rank's local msProbe dump in one tree.

``rankscope collect [--steps a-b] [--ranks ...]`` makes the coordinator send CONTROL
``collect`` (args: ``transfer``, ``steps``, ``ranks``, ``resume``) to every node agent;
each rank streams the files of its ``dump_path`` as BUNDLE_CHUNKs (paths relative to
its dump_path, so ``step{N}/rank{ID}/dump.json``) and ends with a STATUS
``collect_done`` (detail: rank, transfer, files). They land in
``EXPORT_DIR/dumps/step{N}/rank{ID}/...``: one msProbe-layout tree that msProbe's
compare reads across ranks.

Nothing is timed out here: the operator watches the progress ``rankscope collect``
prints and asks again to resume. Chunked and checksummed by the BundleAssembler;
resumable because the transfer id
is derived from the selection: asking again for the same steps/ranks continues the
``.part`` files already on disk (their offsets travel in ``resume``).
"""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from rankscope.rdr.transfer import BundleAssembler


def transfer_id(steps: str | None, ranks: list[int] | None) -> str:
    key = json.dumps({"steps": steps, "ranks": sorted(ranks) if ranks else None}, sort_keys=True)
    return "collect-" + hashlib.sha256(key.encode()).hexdigest()[:12]


def parse_steps(text: str | None) -> str | None:
    """Validate ``a-b`` / ``a,b,c`` / ``a`` step selections; returns it normalised."""
    if text is None or text == "":
        return None
    out = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        try:
            a, b = int(lo), int(hi) if hi else int(lo)
        except ValueError:
            raise ValueError(f"--steps: {text!r} is not like 3, 2-5 or 1,4-6") from None
        if a < 0 or b < a:
            raise ValueError(f"--steps: range {part!r} must be non-negative and ascending")
        out.append(f"{a}-{b}" if b != a else str(a))
    return ",".join(out)


class DumpCollector:
    """Receives one collect transfer and tracks its progress per rank."""

    def __init__(self, dest_root: Path, expected: set[int], steps: str | None = None,
                 ranks: list[int] | None = None) -> None:
        self.dest_root = Path(dest_root)
        self.dest_root.mkdir(parents=True, exist_ok=True)
        self.transfer = transfer_id(steps, ranks)
        self.assembler = BundleAssembler(self.dest_root, per_rank_dirs=False)
        self.expected = set(ranks) if ranks else set(expected)
        self.started = time.time()
        self.files: dict[int, int] = {}
        self.bytes: dict[int, int] = {}
        self.finished: dict[int, dict] = {}
        self.rank_errors: list[str] = []

    def resume_offsets(self) -> dict[str, int]:
        # rank is irrelevant without per-rank dirs: the paths already carry rank{ID}/
        return self.assembler.resume_offsets(0, self.transfer)

    def accept(self, body: dict) -> Path | None:
        if body.get("transfer") != self.transfer:
            return None
        rank = body.get("rank")
        if isinstance(rank, int):
            self.bytes[rank] = self.bytes.get(rank, 0) + len(body.get("data") or b"")
        done = self.assembler.accept(body)
        if done is not None and isinstance(rank, int):
            self.files[rank] = self.files.get(rank, 0) + 1
        return done

    def on_status(self, detail: dict) -> None:
        if detail.get("transfer") == self.transfer and isinstance(detail.get("rank"), int):
            self.finished[detail["rank"]] = dict(detail)
            self.expected.add(detail["rank"])
            if detail.get("error"):  # e.g. the rank has no local dump_path
                self.rank_errors.append(f"rank {detail['rank']}: {detail['error']}")

    def done(self) -> bool:
        return bool(self.expected) and self.expected <= set(self.finished)

    def progress(self) -> dict:
        return {
            "transfer": self.transfer, "dest": str(self.dest_root), "expected_ranks": sorted(self.expected),
            "finished_ranks": sorted(self.finished), "files": sum(self.files.values()),
            "bytes": sum(self.bytes.values()), "per_rank": {str(r): {"files": self.files.get(r, 0),
                                                                     "bytes": self.bytes.get(r, 0)}
                                                            for r in sorted(self.expected | set(self.files))},
            "problems": (self.rank_errors + [str(p) for p in self.assembler.problems])[:50], "done": self.done(),
            "elapsed_s": round(time.time() - self.started, 3),
        }
