"""token_range=[a, b]: record only forward calls a..b (0-based, inclusive) of the root model.

Inference engines call the root model once per generated token; msProbe numbers those
calls from 0. Only *outermost* calls count: a root whose construct re-enters itself, or
an API that re-runs the forward inside another forward, must not advance the counter,
so a depth counter (pre-hook +1, post-hook -1) guards it. The counter itself is plain
logic, tested without MindSpore.
"""
from __future__ import annotations

from typing import Any, Callable

from rankscope.probe.graph import compile_guard


def check_token_range(token_range: Any) -> tuple[int, int] | None:
    """Validate msProbe's rules; a clear error naming the value."""
    if token_range is None:
        return None
    if not isinstance(token_range, (list, tuple)) or len(token_range) != 2:
        raise ValueError(f"token_range = {token_range!r}: expected [start, end]")
    a, b = token_range
    if any(isinstance(v, bool) or not isinstance(v, int) for v in (a, b)):
        raise ValueError(f"token_range = {token_range!r}: start and end must be integers")
    if a < 0 or a > b:
        raise ValueError(f"token_range = {token_range!r}: need 0 <= start <= end")
    return a, b


class TokenCounter:
    """Counts outermost forward calls; ``on_change(index, in_range)`` when a call begins."""

    def __init__(self, start: int, end: int, on_change: Callable[[int, bool], None]) -> None:
        self.start, self.end = start, end
        self.next_index = 0
        self.depth = 0
        self.current = -1
        self._on_change = on_change

    def reset(self, start: int, end: int) -> None:
        self.start, self.end = start, end
        self.next_index, self.depth, self.current = 0, 0, -1

    @property
    def in_range(self) -> bool:
        return self.start <= self.current <= self.end

    @property
    def finished(self) -> bool:
        return self.next_index > self.end

    def enter(self) -> None:
        self.depth += 1
        if self.depth > 1:
            return  # a nested/re-run forward belongs to the call already counted
        self.current = self.next_index
        self.next_index += 1
        self._on_change(self.current, self.in_range)

    def exit(self) -> None:
        if self.depth > 0:
            self.depth -= 1


class TokenRangeHooks:
    """Hooks a root Cell so :class:`TokenCounter` sees its forward calls."""

    def __init__(self, root: Any, counter: TokenCounter) -> None:
        self.counter = counter
        self._handles = [
            compile_guard.register(root, lambda cell, args: self._guard(counter.enter), pre=True),
            # always_call: an exception inside forward must still unwind the depth
            compile_guard.register(root, lambda cell, args, out: self._guard(counter.exit), always_call=True),
        ]
        self.errors = 0

    def _guard(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception:  # noqa: BLE001 - the probe never breaks inference
            self.errors += 1
        return None

    def remove(self) -> None:
        for h in self._handles:
            try:
                h.remove()
            except Exception:  # noqa: BLE001
                pass
        self._handles = []
