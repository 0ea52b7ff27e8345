"""The re-run trigger: a rank's loss and gradient norm against its own recent history."""
from __future__ import annotations

import math

from rankscope.probe.rerun.rerun_gate import AnomalyGate, GateSettings


def warmed(n: int = 10) -> AnomalyGate:
    g = AnomalyGate(GateSettings(window=32, warmup=8, spike=10.0))
    for i in range(n):
        g.learn(1.0 - 0.01 * i, 2.0 + 0.1 * (i % 3))
    return g


def test_a_value_that_is_not_finite_triggers_from_the_first_step():
    g = AnomalyGate()
    assert "not finite" in g.judge(math.nan, 1.0)
    assert "gradients that are not finite" in g.judge(1.0, math.inf)
    assert g.judge(1.0, 1.0) == ""


def test_spikes_trigger_only_once_the_history_is_warm():
    cold = warmed(3)
    assert cold.judge(500.0, 500.0) == ""
    g = warmed()
    assert "a loss of 500" in g.judge(500.0, 2.0)
    assert "gradient norm of 300" in g.judge(0.95, 300.0)
    # ordinary movement is not anomalous: a loss half the median, a norm three times it
    assert g.judge(0.45, 6.0) == ""


def test_anomalous_values_are_not_learned_and_the_window_is_bounded():
    g = warmed()
    for _ in range(100):
        assert g.judge(500.0, 2.0)
    assert "a loss of 500" in g.judge(500.0, 2.0)  # spikes never widened the bound
    g.learn(math.nan, math.inf)
    assert len(g._loss) == 10 and len(g._gnorm) == 10
    for i in range(100):
        g.learn(1.0, 1.0)
    assert len(g._loss) == 32 and len(g._gnorm) == 32
