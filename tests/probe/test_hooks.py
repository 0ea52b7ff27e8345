"""Hook details: token counting, call indices, list-of-models naming, filters."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from rankscope.probe.token_range import TokenCounter, check_token_range


def test_token_counter_counts_only_outermost_calls():
    seen = []
    c = TokenCounter(1, 2, lambda i, inside: seen.append((i, inside)))
    for _ in range(4):
        c.enter()
        c.enter()  # a forward re-run inside the call (e.g. by a grad API) is not a new token
        c.exit()
        c.exit()
    assert seen == [(0, False), (1, True), (2, True), (3, False)]
    assert c.finished
    c.exit()  # an unbalanced exit never goes negative
    assert c.depth == 0


@pytest.mark.parametrize("bad", [[2, 1], [-1, 3], [1], "1-3", [1.0, 2], [True, 3]])
def test_token_range_validation_names_the_value(bad):
    with pytest.raises(ValueError, match="token_range"):
        check_token_range(bad)


ms = pytest.importorskip("mindspore")
from mindspore import nn  # noqa: E402

from rankscope import PrecisionDebugger  # noqa: E402

ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")


class Shared(nn.Cell):
    """One ReLU cell called three times, on tensors of widths 4, 6 and 5."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Dense(4, 6), nn.Dense(6, 5), nn.Dense(5, 2)
        self.act = nn.ReLU()

    def construct(self, x):
        return self.c(self.act(self.b(self.act(self.a(self.act(x))))))


@pytest.fixture(autouse=True)
def _cleanup():
    yield
    if PrecisionDebugger.current is not None:
        PrecisionDebugger.current.close()


def run(dbg, model, nets):
    x = ms.Tensor(np.random.RandomState(0).randn(3, 4).astype(np.float32))
    fns = [ms.value_and_grad(lambda x, n=n: n(x).sum(), None, n.trainable_params()) for n in nets]
    dbg.start(model)
    grads = [fn(x)[1] for fn in fns]
    dbg.stop()
    dbg.step()
    return grads


def dump_of(path) -> dict:
    return json.loads((path / "step0" / f"proc{os.getpid()}" / "dump.json").read_text())["data"]


def test_repeated_cell_backward_indices_match_forward_indices(tmp_path):
    net = Shared()
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="L0")
    run(dbg, net, [net])
    data = dump_of(tmp_path)
    assert [data[f"Cell.act.ReLU.forward.{n}"]["output"][0]["shape"] for n in range(3)] == \
        [[3, 4], [3, 6], [3, 5]]
    for n in (1, 2):
        # backward "input" is the grad of that very call's output: the widths tell them apart
        fwd = data[f"Cell.act.ReLU.forward.{n}"]
        bwd = data[f"Cell.act.ReLU.backward.{n}"]
        assert bwd["input"][0]["shape"] == fwd["output"][0]["shape"]
        assert bwd["output"][0]["shape"] == fwd["input_args"][0]["shape"]
    # call 0 acts on x, which needs no gradient: MindSpore runs no backward for it
    assert "Cell.act.ReLU.backward.0" not in data


def test_list_of_models_gets_index_prefix(tmp_path):
    n1, n2 = Shared(), Shared()
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="L0")
    run(dbg, [n1, n2], [n1, n2])
    data = dump_of(tmp_path)
    assert "Cell.0.a.Dense.forward.0" in data and "Cell.1.a.Dense.forward.0" in data
    assert "Cell.1.c.Dense.parameters_grad.0" in data


def filtered_dump(tmp_path, statistics: dict, level: str = "L0", sub: str = "d") -> dict:
    """One step of Shared under a config.json with this ``statistics`` section."""
    cfg = tmp_path / f"{sub}.json"
    cfg.write_text(json.dumps({"task": "statistics", "level": level, "statistics": statistics}))
    net = Shared()
    dbg = PrecisionDebugger(config_path=str(cfg), dump_path=str(tmp_path / sub))
    run(dbg, net, [net])
    dbg.close()
    return dump_of(tmp_path / sub)


def test_data_mode_and_list_filters(tmp_path):
    data = filtered_dump(tmp_path, {"list": ["Cell.b."], "data_mode": ["forward"]})
    assert set(data) == {"Cell.b.Dense.forward.0"}


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_data_mode_backward_keeps_the_backward_entries_and_writes_no_forward_ones(tmp_path, level):
    data = filtered_dump(tmp_path, {"data_mode": ["backward"]}, level)
    assert not [k for k in data if ".forward" in k], sorted(data)
    assert {"Cell.a.Dense.backward.0", "Cell.b.Dense.backward.0", "Cell.c.Dense.backward.0"} <= set(data)
    assert data["Cell.c.Dense.backward.0"]["input"][0]["shape"] == [3, 2]
    if level == "mix":
        assert any(k.startswith("Primitive.") and ".backward" in k for k in data), sorted(data)


def test_scope_is_the_range_from_its_start_record_to_its_end_record(tmp_path):
    # Shared runs act, a, act, b, act, c forward: the range a..b holds a, act#1 and b,
    # and no backward entry (they come after b).
    data = filtered_dump(tmp_path, {"scope": ["Cell.a.Dense.forward.0", "Cell.b.Dense.forward.0"]})
    assert set(data) == {"Cell.a.Dense.forward.0", "Cell.act.ReLU.forward.1", "Cell.b.Dense.forward.0"}


def test_a_backward_range_and_a_list_naming_a_forward_entry_select_as_msprobe_does(tmp_path):
    data = filtered_dump(tmp_path, {"scope": ["Cell.c.Dense.backward.0", "Cell.b.Dense.backward.0"]})
    # c's weight gradient is recorded between the two: inside the range too.
    assert set(data) == {"Cell.c.Dense.backward.0", "Cell.c.Dense.parameters_grad.0",
                         "Cell.act.ReLU.backward.2", "Cell.b.Dense.backward.0"}
    assert set(filtered_dump(tmp_path, {"list": ["Cell.b.Dense.forward.0"]}, sub="e")) == {"Cell.b.Dense.forward.0"}


def test_mix_level_records_cells_and_primitives(tmp_path):
    net = Shared()
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="mix")
    run(dbg, net, [net])
    data = dump_of(tmp_path)
    assert "Cell.a.Dense.forward.0" in data
    prims = [k for k in data if k.startswith("Primitive.")]
    assert any(".matmul." in k.lower() for k in prims), sorted(data)[:20]
    # msProbe names a Cell's primitive by its attribute there: nn.Dense's bias_add, not biasadd.
    assert "Primitive.bias_add.BiasAdd.0.forward" in data and not any(".biasadd." in k for k in prims), prims
