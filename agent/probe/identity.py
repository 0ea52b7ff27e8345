"""Which rank this process is, and the dump folder name that follows from it.

Order (DESIGN "Rank identity"): an explicit ``rank_id`` (msProbe's override for
SGLang/vLLM DP workers that all think they are rank 0); ``get_rank()`` but only once
``mindspore.communication`` is initialised, because before ``init()`` it returns 0
instead of raising and every process would claim rank 0; then the ``RANK_ID`` /
``RANK`` environment variables launchers set (msrun sets RANK_ID); else unknown,
which the dump writer records as ``proc{pid}``.
"""
from __future__ import annotations

import os
import sys
from typing import Mapping

SOURCE_EXPLICIT = "explicit"
SOURCE_GET_RANK = "get_rank"
SOURCE_ENV = "env"
SOURCE_NONE = "none"

_ENV_VARS = ("RANK_ID", "RANK")


def _comm_rank() -> int | None:
    """get_rank() when MindSpore's communication is initialised; None otherwise.

    Never imports mindspore itself: a process that has not imported it cannot have
    initialised communication, and importing it here would cost seconds.
    """
    if "mindspore" not in sys.modules:
        return None
    try:
        from mindspore.communication import GlobalComm, get_rank
    except Exception:  # noqa: BLE001 - an odd MindSpore build must not break rank lookup
        return None
    if not getattr(GlobalComm, "INITED", False):
        return None
    try:
        rank = int(get_rank())
    except Exception:  # noqa: BLE001
        return None
    return rank if rank >= 0 else None


def _env_rank(env: Mapping[str, str]) -> int | None:
    for var in _ENV_VARS:
        raw = env.get(var)
        if raw is None or not raw.strip():
            continue
        try:
            rank = int(raw.strip())
        except ValueError:
            continue  # a garbage value is not a rank; try the next source
        if rank >= 0:
            return rank
    return None


def resolve_rank(explicit: int | None, env: Mapping[str, str] | None = None) -> tuple[int | None, str]:
    """Return ``(rank, source)`` with source one of "explicit", "get_rank", "env", "none".

    Raises ValueError for an explicit rank that is not an integer >= 0 (a user error,
    reported at ``start()``, like msProbe does).
    """
    if explicit is not None:
        if isinstance(explicit, bool) or not isinstance(explicit, int) or explicit < 0:
            raise ValueError(f"rank_id = {explicit!r}: expected an integer >= 0")
        return explicit, SOURCE_EXPLICIT
    rank = _comm_rank()
    if rank is not None:
        return rank, SOURCE_GET_RANK
    rank = _env_rank(os.environ if env is None else env)
    if rank is not None:
        return rank, SOURCE_ENV
    return None, SOURCE_NONE
