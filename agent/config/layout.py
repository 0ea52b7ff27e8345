"""``cluster.layout``: the job's data x tensor x pipeline parallel degrees, given by hand.

Overrides what rankscope learns from the job (:mod:`rankscope.coordinator.logic.job.layout`).
Ranks are numbered tensor-parallel fastest, then data parallel, then pipeline stage, as
Megatron and MindSpore number them: with ``{"data_parallel": 2, "tensor_parallel": 2}``
ranks 0 and 1 are the two shards of replica 0, and ranks {0, 2} hold the same shard.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rankscope.config.checks import known_keys, positive_int
from rankscope.config.errors import ConfigError

Ranks = tuple[int, ...]
_FIELDS = ("data_parallel", "tensor_parallel", "pipeline_stages")


@dataclass(frozen=True)
class LayoutSpec:
    data_parallel: int
    tensor_parallel: int = 1
    pipeline_stages: int = 1

    @property
    def world(self) -> int:
        return self.data_parallel * self.tensor_parallel * self.pipeline_stages

    def sets(self) -> dict[int, Ranks]:
        """Each rank's replica set: same stage, same shard, every data-parallel index."""
        dp, tp, pp = self.data_parallel, self.tensor_parallel, self.pipeline_stages
        out: dict[int, Ranks] = {}
        for stage in range(pp):
            for t in range(tp):
                ranks = tuple(stage * dp * tp + d * tp + t for d in range(dp))
                for r in ranks:
                    out[r] = ranks
        return out

    def to_dict(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in _FIELDS}


def parse_layout(val: Any) -> LayoutSpec | None:
    if val is None:
        return None
    sec = known_keys("cluster.layout", val, _FIELDS)
    if "data_parallel" not in sec:
        raise ConfigError("cluster.layout.data_parallel", None,
                          "expected an integer >= 1 (the number of data-parallel replicas)")
    return LayoutSpec(**{k: positive_int(f"cluster.layout.{k}", v) for k, v in sec.items()})
