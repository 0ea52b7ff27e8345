"""Which decode token a recorded tensor belongs to.

With ``start(model, token_range=[a, b])`` the probe records the root model's forward
calls a..b (0 = prefill, k = decode iteration k) and names each cell's calls the
msProbe way, ``Cell.<path>.<Class>.forward.<n>``, counting only recorded calls. In a
decoder every cell runs once per token, so call ``n`` of a cell is token ``a + n`` on
every worker alike: that is how records line up across workers by token index.
"""
from __future__ import annotations

import re

_CALL = re.compile(r"\.(?:forward|backward)\.(\d+)(?=\.|$)")


def call_index(tensor: str) -> int | None:
    """The ``n`` of ``...forward.<n>`` (the first one in the name), or None."""
    m = _CALL.search(tensor)
    return int(m.group(1)) if m else None


def token_of(tensor: str, token_range: tuple[int, int] | list[int]) -> int | None:
    """Token index of a record named ``tensor`` captured with ``token_range``."""
    n = call_index(tensor)
    if n is None:
        return None
    a, b = token_range
    token = a + n
    if token > b:
        raise ValueError(f"tensor {tensor!r}: call {n} is past token_range {list(token_range)}")
    return token
