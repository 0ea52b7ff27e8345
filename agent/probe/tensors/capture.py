"""A tensor's values, captured at the next step on request (rankscope.wire.capture_values).

The client's I/O thread queues each CONTROL ``capture`` this rank is named in
(:meth:`Captures.arm`); the training thread takes them when a step begins and offers every
tensor it reads that step by its record name (the recorder's queued rows, the default
tier's fingerprints and gradient norms). The first offer of a requested name is saved
whole next to the local dump and sent (its first values) on the client's outbox; a name
not offered in the step is answered with an error naming the step, so the page never
waits for a tensor this rank does not record.

Nothing here may stall the step: the answer is put on the outbox without waiting, and a
full outbox loses the answer (said in the log), never the step.
"""
from __future__ import annotations

import collections
import logging
import queue
from pathlib import Path
from typing import Any, Callable

import numpy as np

from rankscope.probe.vitals.fingerprint import tensor_name
from rankscope.wire import capture_values
from rankscope.wire.layout import dump_label, safe_id

log = logging.getLogger(__name__)


class Captures:
    def __init__(self, rank: Callable[[], int | None] = lambda: None,
                 folder: Callable[[], str | None] = lambda: None) -> None:
        #: I/O thread -> training thread: requests for this rank, oldest first.
        self.requests: collections.deque[dict] = collections.deque()
        #: Training thread: the step's requests by tensor name.
        self.active: dict[str, list[dict]] = {}
        self.step = -1
        self.rank, self.folder = rank, folder
        self.outbox: queue.Queue | None = None

    def link(self, client: Any) -> None:
        """The client that brings requests in and takes answers out (linked at every step's
        end: a rank may get its client after its first steps)."""
        st = getattr(client, "state", None)
        if st is not None:
            st.captures, self.outbox = self, st.outbox

    def arm(self, args: dict, rank: int | None) -> bool:
        """A request from the I/O thread; False when this rank is not named (or it is malformed)."""
        try:
            req = capture_values.check_request(args)
        except ValueError as exc:
            log.warning("rankscope: %s", exc)
            return False
        if rank is None or rank not in req["ranks"]:
            return False
        self.requests.append(req)
        return True

    def begin_step(self, step: int) -> None:
        self.step = step
        while self.requests:
            req = self.requests.popleft()
            self.active.setdefault(req["tensor"], []).append(req)

    def offer(self, name: str, value: Any) -> None:
        """A tensor read this step under ``name``: saved and sent when a request names it."""
        reqs = self.active.pop(name, None)
        if reqs is None and tensor_name(name) != name:  # a piece of a chunked tensor: the tensor whole
            reqs = self.active.pop(tensor_name(name), None)
        if reqs is None:
            return
        for req in reqs:
            self._answer(req, *self._save(req, name, value))

    def end_step(self) -> None:
        """Answer the requests whose tensor this step never offered."""
        active, self.active = self.active, {}
        for name, reqs in active.items():
            for req in reqs:
                self._answer(req, None, "", "", f"this rank recorded no tensor named {name!r} at step {self.step}")

    # ------------------------------------------------------------------ internals
    def _save(self, req: dict, name: str, value: Any) -> tuple[np.ndarray | None, str, str, str]:
        """(the values, their MindSpore dtype, where the whole tensor was saved, an error)."""
        from rankscope.probe.tensors.stats import to_numpy
        try:
            arr, dtype_name = to_numpy(value)
            if dtype_name == "BFloat16":  # raw bits from to_numpy: their exact float32 widening
                arr = (arr.astype(np.uint32) << 16).view(np.float32)
            arr = np.array(arr, copy=True)  # the step goes on and may overwrite the tensor
        except Exception as exc:  # noqa: BLE001 - a capture never costs the step
            return None, "", "", f"reading {name}: {exc!r}"[:300]
        path = ""
        root = self.folder()
        if root:
            try:
                # Ranks of one node share its dump_path: each saves under its own label.
                folder = Path(root) / "captures" / safe_id(req.get("id") or "capture") / dump_label(self.rank())
                folder.mkdir(parents=True, exist_ok=True)
                target = folder / f"{safe_id(name)}.npy"
                np.save(target, arr)
                path = str(target)
            except OSError as exc:
                log.warning("rankscope: the captured %s was not saved to disk: %s", name, exc)
        return arr, dtype_name, path, ""

    def _answer(self, req: dict, arr: np.ndarray | None, dtype_name: str, path: str, error: str) -> None:
        rank = self.rank()
        detail: dict[str, Any] = {"id": req.get("id") or "", "rank": rank if rank is not None else -1,
                                  "step": self.step, "tensor": req["tensor"], "path": path[:300], "error": error}
        if arr is not None:
            values, sent = capture_values.encode(arr)
            detail.update(shape=[int(d) for d in arr.shape], dtype=dtype_name or str(arr.dtype), sent_dtype=sent,
                          values=values, numel=int(arr.size))
        if self.outbox is None:
            log.warning("rankscope: captured %s at step %d, but this rank has no coordinator to send it to",
                        req["tensor"], self.step)
            return
        try:
            self.outbox.put_nowait(("status", {"what": capture_values.WHAT, "detail": detail}))
        except queue.Full:
            log.warning("rankscope: the capture of %s at step %d was not sent (the rank's outbox is full); "
                        "it is saved in %s", req["tensor"], self.step, path or "no file")

