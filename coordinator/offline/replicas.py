"""Which columns of an msProbe dump the ranks hold bit for bit: learned, not guessed.

A live rank says which of its records are weights and reduced gradients. An msProbe dump
does not: a weight is one input of a ``MatMul`` or ``linear`` call among activations, a
reduced gradient the output of an ``all_reduce`` or the input of the optimizer's update.
What data parallelism keeps equal is what the ranks of a replica set hold bit for bit
while their activations differ, and what training moves every step. So the first
``learn_steps`` steps decide: a column is replicated when, at each of those steps, every
rank of every replica set holding it holds the same value, and that value changed from
one learning step to the next. Those columns are judged as parameters (``Kind.PARAM``)
from then on: the replica detector names the rank that leaves its set's value.

The outputs of random-number APIs (dropout's mask, ``rand``, ``normal``, ...) are never
learned: ranks seeded alike draw alike until one of them does not (MindSpore's CPU
dropout gave one rank of a clean job another mask at step 3 after three equal ones).

Why so strict: a mask of 0s and 1s has the same statistics on most ranks by chance (a
majority rule took one for a weight), and an all-ones attention mask is equal on every
rank until one batch is padded. Requiring every rank and a change between steps keeps
both out. What that costs, said in docs/howto/analyze.md: a weight that already differs during the
learning steps is not learned as replicated (its effect on the activations remains for
the outlier detector), and a frozen weight (never updated) is not checked.
"""
from __future__ import annotations

import re

import numpy as np

from rankscope.coordinator.offline.dump_rows import RankStep
from rankscope.wire.records import Kind

#: Steps a column must be held alike in before it is judged as replicated.
LEARN_STEPS = 2
_LEARNABLE = frozenset({int(Kind.FORWARD), int(Kind.BACKWARD), int(Kind.GRAD_LOCAL)})
#: API names (the second field of msProbe's entry name) that draw random numbers.
_RANDOM = re.compile(r"(?i)dropout|rand|normal\b|uniform|bernoulli|multinomial|shuffle|gamma|poisson")


def random_api(name: str) -> bool:
    """Whether a row belongs to a call of a random-number API (``Primitive.dropout.Dropout.1...``)."""
    parts = name.split(".", 3)
    return any(_RANDOM.search(p) for p in parts[1:3])


class ReplicaLearner:
    def __init__(self, sets: list[list[int]] | None, learn_steps: int = LEARN_STEPS) -> None:
        self.sets = sets  # None: every rank is one replica set
        self.learn_steps = max(1, int(learn_steps))
        self.seen_steps = 0
        self._alike: dict[str, bool] = {}
        self._last: dict[str, bytes] = {}  # the value every rank held at the previous learning step
        self._moved: set[str] = set()

    @property
    def learning(self) -> bool:
        return self.seen_steps < self.learn_steps

    def observe(self, rows: dict[int, RankStep]) -> None:
        """One learning step: every readable rank's rows of it."""
        self.seen_steps += 1
        sigs: dict[str, dict[int, bytes]] = {}
        for rank, rs in rows.items():
            raw = np.ascontiguousarray(rs.stats).view(np.uint64)
            for i, name in enumerate(rs.names):
                if int(rs.kinds[i]) in _LEARNABLE and not random_api(name):
                    sigs.setdefault(name, {})[rank] = (raw[i].tobytes() + int(rs.numel[i]).to_bytes(8, "little")
                                                       + int(rs.crc[i]).to_bytes(8, "little", signed=True))
        for name, by_rank in sigs.items():
            alike = self._alike_in_sets(by_rank)
            self._alike[name] = self._alike.get(name, True) and alike
            value = min(by_rank.values())
            if name in self._last and self._last[name] != value:
                self._moved.add(name)
            self._last[name] = value

    def _alike_in_sets(self, by_rank: dict[int, bytes]) -> bool:
        sets = self.sets if self.sets is not None else [sorted(by_rank)]
        judged = False
        for members in sets:
            held = {by_rank[r] for r in members if r in by_rank}
            if sum(r in by_rank for r in members) < 2:
                continue
            judged = True
            if len(held) != 1:
                return False
        return judged

    def replicated(self) -> frozenset[str]:
        if self.seen_steps < 2:  # one step cannot show a change: nothing is learned
            return frozenset()
        return frozenset(n for n, alike in self._alike.items() if alike and n in self._moved)

    def kinds(self, rs: RankStep, replicated: frozenset[str]) -> np.ndarray:
        """``rs.kinds`` with the learned replicated columns judged as parameters."""
        if not replicated:
            return rs.kinds
        out = rs.kinds.copy()
        for i, name in enumerate(rs.names):
            if name in replicated and int(out[i]) in _LEARNABLE:
                out[i] = int(Kind.PARAM)
        return out
