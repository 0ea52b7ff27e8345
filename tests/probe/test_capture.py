"""The rank's side of a capture: a request naming this rank is taken when the next step
begins, the tensor offered under its name is saved whole and sent, a name never offered is
answered with the step, and a full outbox never stalls the step (rankscope.probe.tensors.capture)."""
from __future__ import annotations

import queue

import numpy as np

from rankscope.probe.tensors.capture import Captures
from rankscope.wire import capture_values


def sent(box: queue.Queue) -> list[dict]:
    out = []
    while not box.empty():
        kind, body = box.get_nowait()
        assert kind == "status" and body["what"] == capture_values.WHAT
        out.append(capture_values.check_detail(body["detail"]))
    return out


def test_the_next_step_s_tensor_is_saved_and_sent(tmp_path):
    caps = Captures(lambda: 1, lambda: str(tmp_path))
    caps.outbox = box = queue.Queue(maxsize=4)
    assert not caps.arm({"id": "cap-1", "tensor": "w", "ranks": [0, 2]}, 1)  # not this rank
    assert not caps.arm({"tensor": "", "ranks": [1]}, 1)  # malformed: said, not raised
    assert caps.arm({"id": "cap-2", "tensor": "Sentinel.param_end.fc.weight", "ranks": [1]}, 1)
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    caps.offer("Sentinel.param_end.fc.weight", w)  # before the step that takes the request
    assert box.empty()
    caps.begin_step(5)
    caps.offer("Sentinel.loss", np.float32(1.0))
    caps.offer("Sentinel.param_end.fc.weight", w)
    w[0, 0] = 99.0  # the step goes on: the capture is the value as offered
    caps.offer("Sentinel.param_end.fc.weight", w)  # offered again: answered once
    caps.end_step()
    (d,) = sent(box)
    assert (d["id"], d["rank"], d["step"], d["shape"], d["numel"], d["error"]) == ("cap-2", 1, 5, [3, 4], 12, "")
    assert capture_values.decode(d).tolist() == list(range(12))
    saved = np.load(d["path"])
    assert saved.shape == (3, 4) and saved[0, 0] == 0.0
    assert d["path"] == str(tmp_path / "captures" / "cap-2" / "rank1" / "Sentinel.param_end.fc.weight.npy")


def test_a_name_never_offered_is_answered_with_its_step_and_a_chunk_gives_its_tensor(tmp_path):
    caps = Captures(lambda: 0, lambda: None)
    caps.outbox = box = queue.Queue(maxsize=4)
    caps.arm({"id": "a", "tensor": "no.such", "ranks": [0]}, 0)
    caps.arm({"id": "b", "tensor": "Sentinel.param.big", "ranks": [0]}, 0)
    caps.begin_step(3)
    big = np.ones(10, np.float32)
    caps.offer("Sentinel.param.big@1", big)  # a piece of a chunked tensor: the tensor whole
    caps.end_step()
    got = {d["id"]: d for d in sent(box)}
    assert got["a"]["error"] == "this rank recorded no tensor named 'no.such' at step 3"
    assert got["b"]["numel"] == 10 and got["b"]["path"] == ""  # no dump folder: values sent, nothing saved
    caps.begin_step(4)
    caps.end_step()
    assert box.empty()  # each request is answered once


def test_a_full_outbox_loses_the_answer_not_the_step(tmp_path, caplog):
    caps = Captures(lambda: 0, lambda: str(tmp_path))
    caps.outbox = queue.Queue(maxsize=1)
    caps.outbox.put(("status", {}))
    caps.arm({"id": "c", "tensor": "w", "ranks": [0]}, 0)
    caps.begin_step(1)
    caps.offer("w", np.zeros(4, np.float32))  # returns at once
    assert "was not sent (the rank's outbox is full)" in caplog.text
    assert (tmp_path / "captures" / "c" / "rank0" / "w.npy").is_file()  # still on the rank's disk
