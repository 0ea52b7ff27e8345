"""ReplayFilter: exact within its window, bounded per sender however long the job runs."""
from __future__ import annotations

import random
import sys

from rankscope.wire.replay import ReplayFilter


def _reference(window: int, events: list[tuple[str, int]]) -> list[bool]:
    """Every seq ever seen kept: a seq is fresh unless seen, or window or more below its
    sender's highest."""
    seen: dict[str, set[int]] = {}
    high: dict[str, int] = {}
    out = []
    for src, seq in events:
        h = high.get(src)
        dup = seq in seen.setdefault(src, set()) or (h is not None and seq <= h - window)
        out.append(not dup)
        if not dup:
            seen[src].add(seq)
            high[src] = seq if h is None else max(h, seq)
    return out


def test_replays_reorders_and_old_seqs_are_judged_as_a_full_memory_would():
    rng = random.Random(3)
    for window in (1, 8, 64):
        events: list[tuple[str, int]] = []
        nxt = {"a": 0, "b": 0}
        for _ in range(5000):
            src = rng.choice("ab")
            r = rng.random()
            if r < 0.6:
                nxt[src] += 1
                events.append((src, nxt[src]))
            elif r < 0.7:  # a jump, leaving gaps
                nxt[src] += rng.randint(2, 3 * window)
                events.append((src, nxt[src]))
            else:  # a replay or a late one, near or far below the top
                events.append((src, max(0, nxt[src] - rng.randint(0, 2 * window))))
        f = ReplayFilter(window)
        got = [f.fresh(s, q) for s, q in events]
        assert got == _reference(window, events)
        assert f.duplicates == got.count(False) > 0


def test_senders_in_order_with_replays_inside_their_run_are_judged_as_a_full_memory_would():
    # Most senders never reorder: they stay on the cheap path (no bits) through
    # duplicates of seqs they sent, until a seq below their first or a gap arrives.
    rng = random.Random(5)
    for window in (4, 64):
        events: list[tuple[str, int]] = []
        for src in "abcdef":
            start = rng.randint(0, 50)
            top = start
            for _ in range(300):
                r = rng.random()
                if r < 0.8:
                    top += 1
                    events.append((src, top))
                elif r < 0.95:  # a replay of one it sent, inside the run or past the window
                    events.append((src, rng.randint(start, top)))
                elif r < 0.98:  # one from before its first
                    events.append((src, max(0, start - rng.randint(1, window))))
                else:
                    top += rng.choice([2, window, window + 1])
                    events.append((src, top))
        rng.shuffle(events)  # senders interleave; each sender's own order is what matters
        events.sort(key=lambda e: "abcdef".index(e[0]))
        f = ReplayFilter(window)
        got = [f.fresh(s, q) for s, q in events]
        assert got == _reference(window, events)


def test_a_long_running_sender_costs_no_bits_in_order_and_its_window_after_a_reorder():
    f = ReplayFilter(4096)
    for seq in range(200_000):
        assert f.fresh("rank:0", seq)
    assert "rank:0" not in f._seen
    assert not f.fresh("rank:0", 199_000) and f.fresh("rank:0", 200_000)
    assert f.fresh("rank:0", 200_002) and f.fresh("rank:0", 200_001)  # a gap, then filled: bits now
    for seq in range(200_003, 300_000):
        assert f.fresh("rank:0", seq)
    assert not f.fresh("rank:0", 299_000) and not f.fresh("rank:0", 200_001)
    assert sys.getsizeof(f._seen["rank:0"]) <= 4096 // 8 + 64


def test_a_seq_far_ahead_forgets_the_window_without_building_a_huge_number():
    f = ReplayFilter(4096)
    assert f.fresh("s", 5) and f.fresh("s", 10**15)
    assert sys.getsizeof(f._seen.get("s", 0)) < 64
    assert not f.fresh("s", 10**15) and not f.fresh("s", 5) and f.fresh("s", 10**15 - 1)
    assert sys.getsizeof(f._seen["s"]) < 64
    assert f.state() == {"s": 10**15}
