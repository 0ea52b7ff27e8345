"""Bit-exact fingerprints: one flipped bit anywhere changes them, on the host path and on
the device path (run here through the same MindSpore ops, on CPU)."""
from __future__ import annotations

import numpy as np
import pytest

from rankscope.probe.vitals import fingerprint as fp

ms = pytest.importorskip("mindspore")


def _flips(arr: np.ndarray, rs: np.random.RandomState, n: int = 6):
    bits = arr.dtype.itemsize * 8
    words = arr.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[arr.dtype.itemsize]).reshape(-1)
    for _ in range(n):
        out = arr.copy()
        view = out.view(words.dtype).reshape(-1)
        i, b = int(rs.randint(words.size)), int(rs.randint(bits))
        view[i] ^= words.dtype.type(1) << words.dtype.type(b)
        yield out


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_host_fingerprint_sees_any_single_bit_flip(dtype):
    rs = np.random.RandomState(1)
    a = rs.randn(300, 41).astype(dtype)
    base = fp.host_fingerprint(a)
    assert base == fp.host_fingerprint(a.copy())
    for flipped in _flips(a, rs):
        assert fp.host_fingerprint(flipped) != base


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_device_fingerprint_sees_any_single_bit_flip_through_mindspore_ops(dtype):
    rs = np.random.RandomState(2)
    a = rs.randn(257, 33).astype(dtype)
    (base,) = fp.device_fingerprints([(ms.Tensor(a), 0, None)])
    assert [base] == fp.device_fingerprints([(ms.Tensor(a.copy()), 0, None)])
    for flipped in _flips(a, rs):
        assert fp.device_fingerprints([(ms.Tensor(flipped), 0, None)]) != [base]


def test_fingerprints_are_position_sensitive():
    a = np.arange(1000, dtype=np.float32)
    swapped = a.copy()
    swapped[[3, 700]] = swapped[[700, 3]]
    assert fp.host_fingerprint(a) != fp.host_fingerprint(swapped)
    assert fp.device_fingerprints([(ms.Tensor(a), 0, None)]) != fp.device_fingerprints([(ms.Tensor(swapped), 0, None)])


def test_chunks_cover_a_large_tensor_and_fingerprint_each_piece_alone():
    per = fp.CHUNK_BYTES // 4
    parts = fp.chunks(4 * (2 * per + 5), 4)
    assert parts == [(0, per), (per, 2 * per), (2 * per, 2 * per + 5)]
    assert fp.chunks(400, 4) == [(0, 100)]
    assert fp.chunk_name("fc1.weight", 0, 1) == "fc1.weight"
    assert fp.chunk_name("fc1.weight", 2, 3) == "fc1.weight@2"
    a = np.random.RandomState(3).randn(10_000).astype(np.float32)
    b = a.copy()
    b[7_000] += 1
    assert fp.host_fingerprint(a, 0, 5_000) == fp.host_fingerprint(b, 0, 5_000)
    assert fp.host_fingerprint(a, 5_000, 10_000) != fp.host_fingerprint(b, 5_000, 10_000)
    lo = fp.device_fingerprints([(ms.Tensor(a), 0, 5_000), (ms.Tensor(a), 5_000, 10_000)])
    hi = fp.device_fingerprints([(ms.Tensor(b), 0, 5_000), (ms.Tensor(b), 5_000, 10_000)])
    assert lo[0] == hi[0] and lo[1] != hi[1]


def test_squared_norms_on_both_paths_agree_and_flag_non_finite_values():
    a = np.random.RandomState(4).randn(64, 64).astype(np.float32)
    host = fp.host_squared_norm(a)
    (dev,) = fp.device_squared_norms([ms.Tensor(a)])
    assert host == pytest.approx(float((a.astype(np.float64) ** 2).sum()), rel=1e-5)
    assert dev == pytest.approx(host, rel=1e-5)
    a[5, 5] = np.nan
    assert not np.isfinite(fp.host_squared_norm(a))
    assert not np.isfinite(fp.device_squared_norms([ms.Tensor(a)])[0])


def test_a_kept_host_view_follows_in_place_updates_and_is_taken_again_when_the_tensor_moves():
    ms = pytest.importorskip("mindspore")
    from mindspore import ops

    from rankscope.probe.vitals.vital import Piece

    p = ms.Parameter(ms.Tensor(np.arange(64, dtype=np.float32)), name="w")
    piece = Piece("w", p, 0, 64, 256, [64])
    raw, copied = piece.host_bytes({})
    assert not copied and piece.bytes is not None  # the parameter's own memory, kept
    before = fp.hash_bytes(raw)
    ops.assign(p, p + 1.0)  # an in-place update, as an optimizer's
    from rankscope.probe.tensors.stats import wait_for_device
    wait_for_device()
    kept, _ = piece.host_bytes({})
    assert kept is piece.bytes and fp.hash_bytes(kept) == fp.host_fingerprint(p.asnumpy()) != before
    p.set_data(ms.Tensor(np.full(64, 7.0, dtype=np.float32)))  # may give the parameter new memory
    again, _ = piece.host_bytes({})
    assert fp.hash_bytes(again) == fp.host_fingerprint(np.full(64, 7.0, dtype=np.float32))


def test_a_large_squared_norm_read_by_threads_is_the_same_bits_wherever_the_array_lies():
    a = np.random.RandomState(5).randn(fp.PARALLEL_MIN + 12_345).astype(np.float32)
    got = fp.host_squared_norm(a)
    in_order = sum(float(np.dot(a[i:i + fp.NORM_CHUNK], a[i:i + fp.NORM_CHUNK]))
                   for i in range(0, a.size, fp.NORM_CHUNK))
    assert got == in_order  # chunks fixed by the size, summed in order: no thread-order rounding
    assert got == pytest.approx(float((a.astype(np.float64) ** 2).sum()), rel=1e-5)
    moved = np.empty(a.size + 1, np.float32)[1:]  # another address, another alignment
    moved[:] = a
    assert fp.host_squared_norm(moved) == got
    a[-1] = np.inf  # in the last chunk
    assert not np.isfinite(fp.host_squared_norm(a))
