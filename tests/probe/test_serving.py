"""Zero-code serving: where a request batch begins, decided from the root's calls alone
(pure logic), and the finder on real MindSpore Cells."""
from __future__ import annotations

import numpy as np
import pytest

from rankscope.probe.attach.serving import BatchBoundary, input_shape


class T:  # anything with a shape and a dtype reads as a tensor
    dtype = "int32"

    def __init__(self, *shape: int) -> None:
        self.shape = shape


def batches(shapes) -> list[int]:
    b = BatchBoundary()
    return [i for i, s in enumerate(shapes) if b.new_batch(s)]


def test_kv_cache_decode_continues_and_every_prefill_starts_a_batch():
    calls = [(2, 5), (2, 1), (2, 1), (3, 4), (3, 1), (2, 6), (2, 1), (2, 3)]
    assert batches(calls) == [0, 3, 5, 7]


def test_decode_without_a_cache_grows_by_one_and_a_repeated_prompt_is_a_new_batch():
    calls = [(1, 4), (1, 5), (1, 6), (1, 4), (1, 5), (1, 5)]
    assert batches(calls) == [0, 3, 5]


def test_a_prefill_of_one_call_then_the_same_shape_again_is_two_batches():
    assert batches([(4, 7), (4, 7)]) == [0, 1]


def test_a_root_without_a_shaped_argument_is_one_batch():
    assert batches([None, None, None]) == [0]


def test_the_first_tensor_argument_is_read_as_batch_and_length():
    assert input_shape((3, T(2, 5, 8)), {}) == (2, 5)
    assert input_shape((T(7),), {}) == (1, 7)
    assert input_shape(("x",), {"ids": T(4, 1)}) == (4, 1)
    assert input_shape((T(),), {}) is None
    assert input_shape((), {}) is None


@pytest.fixture
def ms_cells():
    ms = pytest.importorskip("mindspore")
    from mindspore import nn
    ms.set_context(mode=ms.PYNATIVE_MODE)
    return ms, nn


def test_the_finder_picks_the_outermost_cell_with_weights_then_goes_away(ms_cells):
    ms, nn = ms_cells
    from rankscope.probe.attach.serving import ServingFinder

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc = nn.Dense(4, 3)

        def construct(self, x):
            return self.fc(x)

    found, wanted = [], [True]
    finder = ServingFinder(lambda: wanted[0], lambda cell, args, kwargs: found.append((cell, args)))
    orig = nn.Cell.__call__
    finder.install()
    try:
        relu, net = nn.ReLU(), Net()
        x = ms.Tensor(np.ones((2, 4), np.float32))
        relu(x)  # no weights: not a model
        assert not found and nn.Cell.__call__ is not orig
        out = net(x)
        assert [c for c, _ in found] == [net] and found[0][1][0] is x
        assert nn.Cell.__call__ is orig  # gone once found: no cost afterwards
        assert out.shape == (2, 3)
    finally:
        finder.uninstall()
    assert nn.Cell.__call__ is orig


def test_the_finder_leaves_a_process_that_trains(ms_cells):
    ms, nn = ms_cells
    from rankscope.probe.attach.serving import ServingFinder
    found = []
    finder = ServingFinder(lambda: False, lambda *a: found.append(a))
    orig = nn.Cell.__call__
    finder.install()
    nn.Dense(2, 2)(ms.Tensor(np.ones((1, 2), np.float32)))
    assert not found and nn.Cell.__call__ is orig


def test_the_driver_makes_one_step_per_request_batch_with_its_tokens(ms_cells, tmp_path):
    # A real debugger and model, no node agent: batches of different shapes, KV-cache
    # style decode calls, a keyword-only call, then the exit that ends the last batch.
    import json

    ms, nn = ms_cells
    from rankscope import PrecisionDebugger
    from rankscope.probe.attach.serving import ServingDriver

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(16, 4)
            self.head = nn.Dense(4, 16)

        def construct(self, ids=None):
            return self.head(self.emb(ids))

    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), task="statistics", level="L0")
    try:
        net = Net()
        drv = ServingDriver(dbg, net, (1, 2))  # record decode calls 1 and 2 only
        ids = lambda b, t: ms.Tensor(np.ones((b, t), np.int32))  # noqa: E731
        for b, prompt in ((2, 5), (3, 4)):
            net(ids(b, prompt))
            for _ in range(3):
                net(ids=ids(b, 1))
        assert dbg.current_step == 1 and drv.batches == 2 and dbg.gate.started == 1
        drv._at_exit()
        # The last batch ended and nothing began after it: a crash verdict about another
        # worker must not say this one "began step 2".
        assert dbg.current_step == 2 and drv.retired and dbg.gate.started == 1
        net(ids(1, 7))  # after the end nothing more is counted
        assert dbg.current_step == 2
    finally:
        dbg.close()
    for step in (0, 1):
        data = json.loads(next((tmp_path / "d" / f"step{step}").glob("*/dump.json")).read_text())["data"]
        assert sorted(k for k in data if k.startswith("Cell.head.")) == \
            ["Cell.head.Dense.forward.0", "Cell.head.Dense.forward.1"]  # tokens 1 and 2
