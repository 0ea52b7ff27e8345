"""Stats throughput (GB/s) against a plain memory copy of the same array.

    .venv/bin/python bench/stats_throughput.py [--sizes 65536,1048576,16777216] [--repeat 30]

For each float32 size: median GB/s of ``np.copy`` (the memory-bandwidth yardstick),
of rankscope.probe.tensors.stats (Max/Min/Mean/Norm + NaN/Inf check), of the same with CRC-32, and of
a MindSpore-op implementation (4 ops + one host transfer) when MindSpore is present.
Ratios are stats/copy: 1.0 would mean statistics as fast as copying the array once.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

from rankscope.probe.tensors.stats import array_stats


def gbps(fn, nbytes: int, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times) / 1e9


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="65536,1048576,16777216")
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--no-mindspore", action="store_true")
    args = ap.parse_args(argv)
    ms = None
    if not args.no_mindspore:
        try:
            import mindspore as ms
            from mindspore import ops
            ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
        except ImportError:
            ms = None
    out = []
    for n in (int(s) for s in args.sizes.split(",")):
        a = np.random.RandomState(0).randn(n).astype(np.float32)
        nb = a.nbytes
        row = {"elements": n, "MB": round(nb / 1e6, 2),
               "copy_GBps": gbps(lambda: np.copy(a), nb, args.repeat),
               "stats_GBps": gbps(lambda: array_stats(a, "Float32"), nb, args.repeat),
               "stats_crc_GBps": gbps(lambda: array_stats(a, "Float32", crc=True), nb, args.repeat)}
        if ms is not None:
            t = ms.Tensor(a)
            row["ms_ops_GBps"] = gbps(
                lambda: ops.stack([t.max(), t.min(), t.mean(), ops.norm(t)]).asnumpy(), nb,
                max(3, args.repeat // 5))
        row = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}
        row["stats_vs_copy"] = round(row["stats_GBps"] / row["copy_GBps"], 3)
        row["stats_crc_vs_copy"] = round(row["stats_crc_GBps"] / row["copy_GBps"], 3)
        print(f"{row['MB']:8.2f} MB  copy {row['copy_GBps']:6.2f} GB/s  stats {row['stats_GBps']:6.2f} GB/s "
              f"({row['stats_vs_copy']:.2f}x copy)  stats+crc {row['stats_crc_GBps']:6.2f} GB/s"
              + (f"  ms-ops {row['ms_ops_GBps']:6.2f} GB/s" if "ms_ops_GBps" in row else ""))
        out.append(row)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
