"""What the debugger reads from the rank's environment: world size, device side, env ints,
and its optional flight recorder."""
from __future__ import annotations

import os
from typing import Any


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
