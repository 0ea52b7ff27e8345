"""Captured values on the coordinator: the window of a slice on two ranks, their difference,
where the largest one is, and a large tensor cut at the cap (rankscope.coordinator.logic.views.captures)."""
from __future__ import annotations

import numpy as np
import pytest

from rankscope.coordinator.logic.views.captures import WINDOW, CaptureBook
from rankscope.wire import capture_values


def answer(cid: str, rank: int, arr: np.ndarray, step: int = 7, **extra) -> dict:
    values, sent = capture_values.encode(arr)
    detail = {"id": cid, "rank": rank, "step": step, "tensor": "w", "shape": list(arr.shape), "dtype": "Float32",
              "sent_dtype": sent, "values": values, "numel": int(arr.size), "path": f"/d/{rank}.npy", "error": ""}
    detail.update(extra)
    return capture_values.check_detail(detail)


def test_two_ranks_one_flipped_element_named_where_it_is():
    book = CaptureBook()
    cid = book.open("w", [0, 1], 0.0)["id"]
    a = np.arange(3 * 70 * 60, dtype=np.float32).reshape(3, 70, 60)
    b = a.copy()
    b.view(np.uint32)[2, 65, 50] ^= 1 << 3  # one bit of one element
    assert book.view(cid)["waiting"] == [0, 1] and "window" not in book.view(cid)
    assert book.on_answer(answer(cid, 0, a))
    assert book.view(cid)["waiting"] == [1]
    assert book.on_answer(answer(cid, 1, b))
    v = book.view(cid)
    assert v["waiting"] == [] and v["answers"]["1"]["step"] == 7 and v["answers"]["1"]["sent"] == a.size
    w = v["window"]
    assert (w["differing"], w["compared"], w["largest_at"]) == (1, a.size, [2, 65, 50])
    assert w["slices"] == [3] and w["index"] == [0] and w["rows"] == [0, WINDOW] and w["cols"] == [0, WINDOW]
    assert all(d == 0 for row in w["diff"] for d in row)  # slice 0 is the same on both
    # The window the page jumps to shows the element and its difference.
    w = book.view(cid, 0, 1, [2], 60, 40)["window"]
    assert w["rows"] == [60, 70] and w["cols"] == [40, 60]
    i, j = 65 - 60, 50 - 40
    assert w["a"]["values"][i][j] == float(a[2, 65, 50]) and w["b"]["values"][i][j] == float(b[2, 65, 50])
    assert w["diff"][i][j] == float(a[2, 65, 50]) - float(b[2, 65, 50]) != 0
    assert sum(d != 0 for row in w["diff"] for d in row) == 1


def test_bad_windows_are_named_and_old_captures_go():
    book = CaptureBook(keep=2)
    cid = book.open("w", [0, 1], 0.0)["id"]
    book.on_answer(answer(cid, 0, np.zeros((4, 5), np.float32)))
    book.on_answer(answer(cid, 1, np.zeros((4, 5), np.float32)))
    with pytest.raises(ValueError, match=r"index \[1\] does not select a slice of shape \[4, 5\]"):
        book.view(cid, index=[1])
    with pytest.raises(ValueError, match="row 4, col 0 are outside the 4 x 5 slice"):
        book.view(cid, row=4)
    with pytest.raises(ValueError, match="rank 3 \\(b\\) sent no values"):
        book.view(cid, 0, 3)
    assert not book.on_answer(answer(cid, 5, np.zeros(2, np.float32)))  # a rank it never asked
    book.open("x", [0], 1.0)
    book.open("y", [0], 2.0)
    assert [r["tensor"] for r in book.rows()] == ["y", "x"]
    with pytest.raises(ValueError, match=f"no capture '{cid}' is kept"):
        book.view(cid)
    assert not book.on_answer(answer(cid, 0, np.zeros(2, np.float32)))


def test_a_large_tensor_is_cut_and_the_window_says_where_nothing_came():
    book = CaptureBook()
    cid = book.open("w", [0, 1], 0.0)["id"]
    big = np.ones((1024, 1024), np.float32)  # four times the cap
    book.on_answer(answer(cid, 0, big))
    book.on_answer(answer(cid, 1, big, error="", step=7))
    v = book.view(cid)
    assert v["answers"]["0"]["sent"] == capture_values.MAX_ELEMENTS < v["answers"]["0"]["numel"] == big.size
    w = book.view(cid, row=300)["window"]  # past the 256 rows sent
    assert all(x is None for row in w["a"]["values"] for x in row) and w["differing"] == 0


def test_nan_on_both_sides_is_alike_and_a_rank_error_is_kept():
    book = CaptureBook()
    cid = book.open("w", [0, 1, 2], 0.0)["id"]
    a = np.array([1.0, np.nan, 3.0], np.float32)
    book.on_answer(answer(cid, 0, a))
    book.on_answer(answer(cid, 1, a.copy()))
    err = {"id": cid, "rank": 2, "step": 7, "tensor": "w", "error": "this rank recorded no tensor named 'w' at step 7"}
    book.on_answer(capture_values.check_detail(err))
    v = book.view(cid)
    assert v["window"]["differing"] == 0 and v["window"]["a"]["values"] == [[1.0, "nan", 3.0]]
    assert v["answers"]["2"]["error"].startswith("this rank recorded no tensor") and v["waiting"] == []
    b = a.copy()
    b[1] = 2.0
    book.on_answer(answer(cid, 1, b))
    w = book.view(cid, 0, 1)["window"]
    assert (w["differing"], w["largest_at"], w["largest"]) == (1, [1], "inf")


def test_requests_and_answers_are_checked_field_by_field():
    from rankscope.wire.errors import ProtocolError
    with pytest.raises(ValueError, match="args.tensor must name a tensor"):
        capture_values.check_request({"tensor": " ", "ranks": [0]})
    with pytest.raises(ValueError, match="args.ranks must list 1 to 8 rank ids"):
        capture_values.check_request({"tensor": "w", "ranks": [0, -1]})
    with pytest.raises(ValueError, match="args.ranks must list"):
        capture_values.check_request({"tensor": "w", "ranks": list(range(9))})
    assert capture_values.check_request({"tensor": " w ", "ranks": [3, 1, 3]}) == {"tensor": "w", "ranks": [1, 3]}
    with pytest.raises(ProtocolError, match="status.capture.values is not a whole number"):
        capture_values.check_detail({"id": "c", "rank": 0, "tensor": "w", "values": b"abc"})
    with pytest.raises(ProtocolError, match="status.capture.colour is not a known field"):
        capture_values.check_detail({"id": "c", "rank": 0, "tensor": "w", "colour": 1})
    with pytest.raises(ProtocolError, match="status.capture.sent_dtype"):
        capture_values.check_detail({"id": "c", "rank": 0, "tensor": "w", "sent_dtype": "object"})
    # bfloat16's raw bits never travel as such: floats go as float32, float64 stays.
    assert capture_values.encode(np.ones(3, np.float16))[1] == "float32"
    assert capture_values.encode(np.ones(3, np.float64))[1] == "float64"
    assert capture_values.encode(np.ones(3, np.int32))[1] == "int64"
