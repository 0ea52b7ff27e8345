"""rankscope.probe.tensors.stats against NumPy references, for every dtype class the seed names."""
from __future__ import annotations

import math
import zlib

import numpy as np
import pytest

from rankscope.probe.tensors.stats import array_stats, tensor_stats
from rankscope.wire.records import NO_CRC


def _ref(a: np.ndarray) -> tuple[float, float, float, float]:
    w = a.astype(np.float64)
    return float(w.max()), float(w.min()), float(w.mean()), float(np.sqrt((w * w).sum()))


@pytest.mark.parametrize("shape", [(64, 256), (7,), (3, 5, 11)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_float_stats_match_numpy(shape, dtype):
    a = np.random.RandomState(1).randn(*shape).astype(dtype) * 3 + 0.5
    st = array_stats(a, "Float32")
    mx, mn, mean, norm = _ref(a)
    assert st.max == mx and st.min == mn
    assert st.mean == pytest.approx(mean, rel=1e-5, abs=1e-6)
    assert st.norm == pytest.approx(norm, rel=1e-5)
    assert (st.nan, st.inf, st.numel, st.crc) == (0, 0, a.size, NO_CRC)


def test_nan_and_inf_are_counted():
    a = np.arange(100, dtype=np.float32)
    a[[3, 50, 77]] = np.nan
    a[10] = np.inf
    a[11] = -np.inf
    st = array_stats(a, "Float32")
    assert (st.nan, st.inf) == (3, 2)
    assert math.isnan(st.max) and math.isnan(st.mean)
    b = np.array([1.0, np.inf, 2.0], np.float32)
    st = array_stats(b, "Float32")
    assert (st.nan, st.inf, st.max, st.min) == (0, 1, math.inf, 1.0)


def test_crc32_is_over_the_raw_bytes_and_in_the_md5_key():
    a = np.random.RandomState(2).randn(33, 17).astype(np.float32)
    st = array_stats(a, "Float32", crc=True)
    assert st.crc == zlib.crc32(a.tobytes())
    assert st.entry()["md5"] == f"{zlib.crc32(a.tobytes()):08x}"
    b = a.copy()
    b[5, 5] = np.nextafter(b[5, 5], np.float32(np.inf))  # one ulp: stats barely move, crc must
    assert array_stats(b, "Float32", crc=True).crc != st.crc


def test_non_contiguous_view():
    a = np.random.RandomState(3).randn(20, 30).astype(np.float32)
    view = a[:, ::3]
    st = array_stats(view, "Float32", crc=True)
    assert st.max == float(view.max()) and st.shape == [20, 10]
    assert st.crc == zlib.crc32(np.ascontiguousarray(view).tobytes())


def test_empty_zero_d_bool_int_half():
    st = array_stats(np.zeros((0, 4), np.float32), "Float32")
    assert (st.max, st.min, st.mean, st.norm, st.numel, st.shape) == (None, None, None, None, 0, [0, 4])
    assert all(math.isnan(v) for v in st.row())
    st = array_stats(np.array(-2.5, np.float32), "Float32")
    assert (st.max, st.min, st.mean, st.norm, st.shape) == (-2.5, -2.5, -2.5, 2.5, [])
    st = array_stats(np.array([True, False, True]), "Bool")
    assert (st.max, st.min, st.mean, st.norm) == (True, False, None, None)
    st = array_stats(np.array([[1, -7], [3, 4]], np.int32), "Int32")
    assert (st.max, st.min) == (4, -7) and isinstance(st.max, int)
    assert st.mean == pytest.approx(0.25) and st.norm == pytest.approx(math.sqrt(75))
    h = (np.random.RandomState(4).randn(1000) * 100).astype(np.float16)
    st = array_stats(h, "Float16")
    assert st.max == float(h.max()) and st.norm == pytest.approx(_ref(h)[3], rel=1e-3)


def test_norm_does_not_overflow_in_float32():
    a = np.full(16, 1e20, np.float32)  # sum of squares overflows float32
    st = array_stats(a, "Float32")
    assert st.norm == pytest.approx(4e20, rel=1e-5) and st.inf == 0


def test_mindspore_tensors_including_bfloat16():
    ms = pytest.importorskip("mindspore")
    x = np.random.RandomState(5).randn(8, 9).astype(np.float32)
    st = tensor_stats(ms.Tensor(x))
    assert st.dtype == "Float32" and st.max == float(x.max())
    bf = ms.Tensor(x, ms.bfloat16)
    st = tensor_stats(bf, crc=True)
    widened = bf.astype(ms.float32).asnumpy()
    assert st.dtype == "BFloat16"
    assert st.max == float(widened.max()) and st.min == float(widened.min())
    assert st.norm == pytest.approx(float(np.linalg.norm(widened)), rel=1e-5)
    assert st.crc == zlib.crc32(bf.asnumpy().view(np.uint16).tobytes())
    p = ms.Parameter(ms.Tensor(x), name="w")
    assert tensor_stats(p).mean == pytest.approx(float(x.mean()), abs=1e-6)


def test_large_tensors_take_the_one_pass_chunked_path():
    a = np.random.RandomState(6).randn(300_001).astype(np.float32)  # > 4 chunks, ragged tail
    st = array_stats(a, "Float32")
    mx, mn, mean, norm = _ref(a)
    assert (st.max, st.min) == (mx, mn)
    assert st.mean == pytest.approx(mean, abs=1e-6) and st.norm == pytest.approx(norm, rel=1e-6)
    a[123_456] = np.nan
    a[299_999] = -np.inf
    st = array_stats(a, "Float32")
    assert (st.nan, st.inf) == (1, 1) and math.isnan(st.max) and math.isnan(st.min)


def test_device_side_batch_matches_the_host_path():
    ms = pytest.importorskip("mindspore")
    from rankscope.probe.tensors.stats import device_stats_batch, stats_from_device_row
    rs = np.random.RandomState(7)
    arrays = [rs.randn(16, 9).astype(np.float32), rs.randn(5).astype(np.float16),
              np.array([1.0, np.nan, np.inf, -2.0], np.float32)]
    rows = device_stats_batch([ms.Tensor(a) for a in arrays])  # one host transfer
    assert rows.shape == (3, 6)
    for a, row in zip(arrays, rows):
        dev = stats_from_device_row(row, "Float32", list(a.shape))
        host = array_stats(a, "Float32")
        assert (dev.nan, dev.inf, dev.numel) == (host.nan, host.inf, host.numel)
        if not host.nan:
            assert dev.max == pytest.approx(host.max) and dev.min == pytest.approx(host.min)
            assert dev.mean == pytest.approx(host.mean, rel=1e-3) and dev.norm == pytest.approx(host.norm, rel=1e-3)
