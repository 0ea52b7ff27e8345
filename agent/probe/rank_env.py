"""What the debugger reads from the rank's environment: world size, device side, env ints,
the data-parallel index a serving framework gave the worker, and its optional flight recorder."""
from __future__ import annotations

import os
from typing import Any, Mapping

#: Where a data-parallel worker learns its index from the framework that started it,
#: first one set wins: (variable, who sets it). Only job-wide indices belong here (a
#: node-local one such as vLLM's VLLM_DP_RANK_LOCAL repeats on every node).
DP_INDEX_VARS: tuple[tuple[str, str], ...] = (
    ("RANKSCOPE_DP_INDEX", "rankscope (set it yourself where the framework says nothing)"),
    ("VLLM_DP_RANK", "vLLM (vllm/envs.py; vllm-ascend and vllm-mindspore run on it)"),
    ("SGLANG_DP_RANK", "SGLang (sglang_router's launch_server sets it per DP server process)"),
)


#: How many data-parallel workers the serving framework started, first one set wins. A
#: worker alone in its world cannot know how many peers to expect; with this the
#: coordinator awaits all of them before it compares their first request batch.
DP_SIZE_VARS: tuple[tuple[str, str], ...] = (
    ("RANKSCOPE_DP_SIZE", "rankscope (set it yourself where the framework says nothing)"),
    ("VLLM_DP_SIZE", "vLLM (vllm/envs.py; its data_parallel.py example sets it beside VLLM_DP_RANK)"),
)


def make_flight_recorder(k: int) -> Any:
    try:
        from rankscope.rdr.flight_recorder import FlightRecorder
    except ImportError:
        return None
    try:
        return FlightRecorder(k)
    except Exception:  # noqa: BLE001
        return None


def device_side() -> bool:
    """Device-side stats on accelerators (RANKSCOPE_DEVICE_STATS=1/0 forces it)."""
    forced = os.environ.get("RANKSCOPE_DEVICE_STATS")
    if forced in ("0", "1"):
        return forced == "1"
    try:
        import mindspore as ms
        return ms.get_context("device_target") not in ("CPU", None)
    except Exception:  # noqa: BLE001
        return False


def env_int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def world_size() -> int | None:
    try:
        from mindspore.communication import get_group_size
        from mindspore.communication._comm_helper import GlobalComm
        return int(get_group_size()) if GlobalComm.INITED else None
    except Exception:  # noqa: BLE001
        return None


def dp_index_from_env(env: Mapping[str, str] | None = None) -> tuple[int | None, str | None, list[str]]:
    """(index, the variable it came from, problems): the first of :data:`DP_INDEX_VARS`
    holding an integer >= 0. A set variable that is not one is skipped and named in
    ``problems``, so the rank can say why its order is not the server's."""
    env = os.environ if env is None else env
    problems = []
    for name, _who in DP_INDEX_VARS:
        raw = env.get(name)
        if raw is None or raw.strip() == "":
            continue
        try:
            value = int(raw.strip())
        except ValueError:
            value = -1
        if value < 0:
            problems.append(f"{name}={raw!r} is not an integer >= 0")
            continue
        return value, name, problems
    return None, None, problems


def dp_size_from_env(env: Mapping[str, str] | None = None) -> int | None:
    """The first of :data:`DP_SIZE_VARS` holding an integer >= 1, else None (a bad value
    is skipped: the only cost is that the first batch may be compared before every
    worker arrived, which coverage then says)."""
    env = os.environ if env is None else env
    for name, _who in DP_SIZE_VARS:
        try:
            value = int((env.get(name) or "").strip())
        except ValueError:
            continue
        if value >= 1:
            return value
    return None


def resolve_dp_index(configured: int | None) -> tuple[int | None, str]:
    """The index this worker registers with and where it came from (``cluster.dp_index``
    wins over the environment). Said once on the rank's stderr (its log), because an id
    order that looks wrong is first checked there."""
    import sys
    if configured is not None:
        index, source, problems = configured, "cluster.dp_index", []
    else:
        index, source, problems = dp_index_from_env()
    for problem in problems:
        print(f"[rankscope] ignored {problem}", file=sys.stderr, flush=True)
    if index is not None:
        print(f"[rankscope] DP index {index} from {source}: workers claiming one rank id are "
              "numbered in this order", file=sys.stderr, flush=True)
    return index, source or ""
