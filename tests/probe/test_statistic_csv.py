"""statistic.csv as MindSpore writes it on GPU/Ascend (``saved_data: "statistic"``).

The header and row shapes below are MindSpore's own, one per generation of the writer:

* ``FIXED_20`` -- mindspore-ai/mindspore, mindspore/ccsrc/debug/data_dump/tensor_stat_dump.cc
  (1.x to 2.2): a fixed header with six counts and no L2 norm; the shape is written
  quoted, ``"(2,3)"``.
* ``KBYK_15`` -- mindspore-ai/mindspore, mindspore/ccsrc/debug/data_dump/tensor_statistic.cc
  (kernel-by-kernel dump, 2.3/2.4): Max, Min, Avg, L2Norm Value, Count; Task ID is
  always 0 there.
* ``CATEGORY`` -- 2.4 onward (and the 2.10 wheel on this machine:
  mindspore/include/mindspore/ccsrc/tools/data_dump/utils.h, ``csvHeaderComm`` +
  ``header_map``, the same strings in lib/libmindspore_tools.so): the ten common columns,
  then one column per ``statistic_category`` entry in the order the config lists them
  (MindSpore's default is max, min, l2norm). The rows are copied in shape from
  msProbe's own test of its code-mapping tool (mindstudio-probe, msprobe/mindspore
  code_mapping tests, ``TEST_CSV_CONTENT``), which holds a real MindSpore statistic.csv:
  lower-case dtypes, ``"()"`` for a scalar and a trailing comma after the last value.
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from rankscope.files.kernel_files import read_statistic_csv

FIXED_20 = (
    "Op Type,Op Name,Task ID,Stream ID,Timestamp,IO,Slot,Data Size,Data Type,Shape,Max Value,Min Value,Avg Value,"
    "Count,Negative Zero Count,Positive Zero Count,NaN Count,Negative Inf Count,Positive Inf Count,Zero Count\n"
    "MatMul,Default--net-Tower--l1-Dense--MatMul-op0,3,0,1650000000001,input,0,96,float32,\"(4,6)\","
    "2.5,-1,0.25,24,3,5,0,0,0,16\n"
    "MatMul,Default--net-Tower--l1-Dense--MatMul-op0,3,0,1650000000002,output,0,32,float32,\"(4,2)\","
    "nan,nan,nan,8,0,0,2,1,0,5\n")

KBYK_15 = (
    "Op Type,Op Name,Task ID,Stream ID,Timestamp,IO,Slot,Data Size,Data Type,Shape,Max Value,Min Value,Avg Value,"
    "L2Norm Value,Count\n"
    "AllReduce,Default_reducer-DistributedGradReducer_AllReduce-op0,0,0,1733905446819790,input,0,8,float32,\"(2)\","
    "3,-4,-0.5,5,2\n"
    "AllReduce,Default_reducer-DistributedGradReducer_AllReduce-op0,0,0,1733905446819990,output,0,8,float32,\"(2)\","
    "inf,-4,inf,inf,2\n")

CATEGORY_DEFAULT = (
    "Op Type,Op Name,Task ID,Stream ID,Timestamp,IO,Slot,Data Size,Data Type,Shape,Max Value,Min Value,L2Norm Value\n"
    "Sub,Default_Sub-op0,0,0,1733905446819790,input,0,4,float32,\"()\",3,3,3,\n"
    "Cast,Default_Cast-op0,0,0,1733905446824053,input,1,8,int64,\"()\",30,30,30,\n"
    "Cast,Default_Cast-op0,0,0,1733905446824184,output,0,1,bool,\"()\",1,1,1,\n"
    "Div,Default_Div-op0,0,0,1733905446828341,output,0,4,float32,\"(3,5)\",nan,-inf,nan,\n")

# rankscope's own statistic_category (kernel_config): counts of NaN and infinities too.
CATEGORY_OURS = (
    "Op Type,Op Name,Task ID,Stream ID,Timestamp,IO,Slot,Data Size,Data Type,Shape,Max Value,Min Value,Avg Value,"
    "L2Norm Value,NaN Count,Negative Inf Count,Positive Inf Count\n"
    "MatMul,Default_net-Tower_l1-Dense_MatMul-op0,0,0,1733905446819790,input,0,64,float32,\"(4,4)\","
    "2,-2,0.5,4,1,0,2,\n")


def read(tmp_path: Path, text: str):
    path = tmp_path / "statistic.csv"
    path.write_text(text)
    return read_statistic_csv(path)


def test_fixed_header_of_the_first_writer(tmp_path):
    a, b = read(tmp_path, FIXED_20)
    assert a.tensor.record_name == "MatMul.Default--net-Tower--l1-Dense--MatMul-op0.3.0.input.0"
    assert (a.shape, a.max, a.min, a.mean, a.numel, a.nan, a.inf) == ((4, 6), 2.5, -1.0, 0.25, 24, 0, 0)
    assert math.isnan(a.norm)  # this writer has no L2 norm: unknown, not zero
    assert (b.nan, b.inf, b.numel) == (2, 1, 8)


def test_kernel_by_kernel_header(tmp_path):
    a, b = read(tmp_path, KBYK_15)
    assert a.tensor.record_name == "AllReduce.Default_reducer-DistributedGradReducer_AllReduce-op0.0.0.input.0"
    assert (a.shape, a.max, a.min, a.mean, a.norm, a.numel) == ((2,), 3.0, -4.0, -0.5, 5.0, 2)
    assert (a.nan, a.inf) == (0, 0)
    # No count columns: a non-finite statistic still says the tensor holds one.
    assert b.inf >= 1 and b.nan == 0 and b.tensor.io == "output"


def test_statistic_category_header_with_trailing_commas(tmp_path):
    rows = read(tmp_path, CATEGORY_DEFAULT)
    assert len(rows) == 4, "a trailing comma must not lose the row"
    sub, cast_in, cast_out, div = rows
    assert (sub.shape, sub.numel, sub.max, sub.norm) == ((), 1, 3.0, 3.0)
    assert math.isnan(sub.mean)  # avg was not asked for
    assert cast_in.tensor.dtype == "int64" and cast_in.max == 30.0
    assert cast_out.tensor.dtype == "bool" and cast_out.tensor.slot == 0
    assert (div.shape, div.numel, div.nan, div.inf) == ((3, 5), 15, 1, 1)


def test_rankscopes_own_category_counts_are_read(tmp_path):
    (row,) = read(tmp_path, CATEGORY_OURS)
    assert (row.nan, row.inf, row.numel, row.mean, row.norm) == (1, 2, 16, 0.5, 4.0)


@pytest.mark.parametrize("value,expect", [("True", 1.0), ("false", 0.0), ("-nan", math.nan), ("-inf", -math.inf)])
def test_value_spellings(tmp_path, value, expect):
    row = f"Cast,Default_Cast-op0,0,0,5,output,0,1,bool,\"(1)\",{value},{value},1,\n"
    text = CATEGORY_DEFAULT.splitlines()[0] + "\n" + row
    (row,) = read(tmp_path, text)
    assert row.max == expect or (math.isnan(expect) and math.isnan(row.max))


def test_a_file_that_is_not_a_statistic_csv_reads_as_no_rows(tmp_path):
    assert read(tmp_path, "") == []
    assert read(tmp_path, "a,b,c\n1,2,3\n") == []
