"""RdrRecorder in real rank processes: exception, thread exception, SIGTERM, SIGABRT,
segfault (faulthandler) + on-behalf adoption, mode 2 normal exit, mode 1 normal exit."""
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from repo_paths import REPO

from rankscope.rdr.bundle import FATAL_STACKS, MANIFEST, verify_bundle, write_bundle
from rankscope.rdr.steps_file import load_steps

# A stand-in rank: feeds a flight recorder a few steps, installs RDR from MS_RDR_* env
# (so the env path of resolve_rdr is exercised end to end), then ends as argv[1] says.
RANK = textwrap.dedent("""
    import os, signal, sys, threading, time
    from rankscope.rdr.flight_recorder import FlightRecorder
    from rankscope.rdr.crash_hooks import install_rdr
    from rankscope.wire.records import Kind, NameTable, StepBatchBuilder
    action = sys.argv[1]
    names, fr = NameTable(), FlightRecorder(3)
    for step in range(5):
        b = StepBatchBuilder(names)
        b.add("Sentinel.loss", Kind.LOSS, (1.0 / (step + 1),) * 4, numel=1)
        fr.emit(b.build("job", 1, step))
    if action == "chain":
        sys.excepthook = lambda *a: (print("USER_HOOK_RAN", flush=True), sys.__excepthook__(*a))
        signal.signal(signal.SIGTERM, lambda s, f: (print("USER_SIGTERM_RAN", flush=True), sys.exit(7)))
    calls = []
    def context():
        calls.append(1)
        if action == "slow_raise" and len(calls) == 1:  # hold the first bundle open until SIGTERM lands
            print("DUMPING", flush=True)
            time.sleep(30)
        return {"last_step": fr.last_step()}
    rec = install_rdr(None, rank=os.environ.get("RANK_ID"), flight_recorder=fr,
                      config={"task": "statistics"}, seeds={"seed": 42}, context=context)
    def train_step_that_hangs():
        print("READY", flush=True)
        time.sleep(60)
    if action == "relabel":  # the node agent assigned another id after registration
        rec.set_rank(5)
        action = "raise"
    if action == "twice":  # e.g. autoattach, then the user's own PrecisionDebugger
        assert install_rdr(None, rank=os.environ.get("RANK_ID")) is rec
        action = "raise"
    if action in ("raise", "slow_raise"):
        raise ValueError("loss exploded at step 4")
    if action == "thread":
        t = threading.Thread(target=lambda: 1 / 0, name="data-loader")
        t.start(); t.join()
        print("MAIN_CONTINUES", flush=True)
    if action in ("wait", "chain"):
        train_step_that_hangs()
    if action == "segv":
        import faulthandler
        print("READY", flush=True)
        faulthandler._sigsegv()
    print("NORMAL_END", flush=True)
""")


def run_rank(tmp_path, action, mode=1, signal_after_ready=None, rank="1", ready="READY"):
    env = dict(os.environ, MS_RDR_ENABLE="1", MS_RDR_MODE=str(mode), MS_RDR_PATH=str(tmp_path / "rdr"),
               RANK_ID=rank, PYTHONPATH=str(REPO), RANKSCOPE_TEST_SECRET_TOKEN="do-not-leak-me")
    proc = subprocess.Popen([sys.executable, "-c", RANK, action], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if signal_after_ready is not None:
        assert proc.stdout.readline().strip() == ready
        proc.send_signal(signal_after_ready)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


def bundles(tmp_path, rank="1"):
    rank_dir = tmp_path / "rdr" / f"rank_{rank}"
    return sorted(p for p in rank_dir.glob("rdr*") if p.is_dir()) if rank_dir.is_dir() else []


def check_bundle(d, reason_part):
    man = json.loads((d / MANIFEST).read_text())
    assert man["complete"] is True and reason_part in man["reason"], man
    assert verify_bundle(d) == []
    batches, _ = load_steps((d / "flight_recorder_steps.msgpack").read_bytes())
    assert [b.step for b in batches] == [2, 3, 4]
    assert json.loads((d / "last_step.json").read_text()) == 4
    assert json.loads((d / "seeds.json").read_text()) == {"seed": 42}
    assert "do-not-leak-me" not in (d / "environment.json").read_text()
    return man


def test_uncaught_exception_writes_bundle(tmp_path):
    code, out, err = run_rank(tmp_path, "raise")
    assert code == 1 and "ValueError: loss exploded at step 4" in err  # the default hook still ran
    [d] = bundles(tmp_path)
    check_bundle(d, "ValueError")
    assert "ValueError: loss exploded at step 4" in (d / "exception.txt").read_text()
    assert not (d / FATAL_STACKS).exists()


def test_second_install_reuses_the_recorder_one_bundle(tmp_path):
    code, out, err = run_rank(tmp_path, "twice")
    assert code == 1 and err.count("bundle written to") == 1
    [d] = bundles(tmp_path)
    check_bundle(d, "ValueError")


def test_signal_during_a_bundle_write_gets_its_own_directory(tmp_path):
    code, out, err = run_rank(tmp_path, "slow_raise", signal_after_ready=signal.SIGTERM, ready="DUMPING")
    assert code == -signal.SIGTERM
    written = [d for d in bundles(tmp_path) if (d / MANIFEST).exists()]
    assert [d.name for d in written] == ["rdr.1"]  # never written into the half-done rdr/
    assert "SIGTERM" in json.loads((written[0] / MANIFEST).read_text())["reason"]


def test_set_rank_moves_the_reservation(tmp_path):
    code, out, err = run_rank(tmp_path, "relabel")
    assert code == 1
    assert bundles(tmp_path, "1") == [] and not (tmp_path / "rdr" / "rank_1").exists()
    [d] = bundles(tmp_path, "5")
    check_bundle(d, "ValueError")


@pytest.mark.parametrize("mode", [1, 2])
def test_thread_exception_writes_bundle_and_process_continues(tmp_path, mode):
    code, out, err = run_rank(tmp_path, "thread", mode=mode)
    assert code == 0 and "MAIN_CONTINUES" in out and "NORMAL_END" in out
    assert "ZeroDivisionError" in err  # threading's default hook chained
    found = bundles(tmp_path)
    check_bundle(found[0], "thread data-loader")
    assert "ZeroDivisionError" in (found[0] / "exception.txt").read_text()
    if mode == 1:
        assert len(found) == 1  # the normal end afterwards adds nothing
    else:  # the process went on and ended normally: mode 2 records that end too
        assert [d.name for d in found] == ["rdr", "rdr.1"]
        check_bundle(found[1], "normal exit")


def test_sigterm_writes_bundle_and_dies_by_sigterm(tmp_path):
    code, out, err = run_rank(tmp_path, "wait", signal_after_ready=signal.SIGTERM)
    assert code == -signal.SIGTERM  # the parent (msrun) still sees the true cause
    [d] = bundles(tmp_path)
    check_bundle(d, "SIGTERM")
    assert "train_step_that_hangs" in (d / "thread_stacks.txt").read_text()


def test_previous_handlers_are_chained(tmp_path):
    code, out, err = run_rank(tmp_path, "chain", signal_after_ready=signal.SIGTERM)
    assert code == 7 and "USER_SIGTERM_RAN" in out
    [d] = bundles(tmp_path)
    check_bundle(d, "SIGTERM")


def test_sigabrt_writes_bundle_with_faulthandler_stacks(tmp_path):
    code, out, err = run_rank(tmp_path, "wait", signal_after_ready=signal.SIGABRT)
    assert code == -signal.SIGABRT
    [d] = bundles(tmp_path)
    man = check_bundle(d, "SIGABRT")
    assert FATAL_STACKS in {f["path"] for f in man["files"]}
    assert "Fatal Python error: Aborted" in (d / FATAL_STACKS).read_text()


def test_segfault_leaves_stacks_that_the_on_behalf_bundle_adopts(tmp_path):
    code, out, err = run_rank(tmp_path, "segv")
    assert code == -signal.SIGSEGV
    [d] = bundles(tmp_path)
    assert not (d / MANIFEST).exists()  # the rank could not write its own bundle
    stacks = (d / FATAL_STACKS).read_text()
    assert "Segmentation fault" in stacks and "<module>" in stacks
    # What the node agent does for a dead rank: same root, same rank -> adopts the directory.
    again = write_bundle(tmp_path / "rdr", 1, reason="rank lost: SIGSEGV", on_behalf=True)
    assert again == d
    man = json.loads((d / MANIFEST).read_text())
    assert man["on_behalf"] is True and man["complete"] is True
    assert FATAL_STACKS in {f["path"] for f in man["files"]} and verify_bundle(d) == []


def test_mode2_normal_exit_writes_bundle(tmp_path):
    code, out, err = run_rank(tmp_path, "exit", mode=2)
    assert code == 0 and "NORMAL_END" in out
    [d] = bundles(tmp_path)
    check_bundle(d, "normal exit")
    assert not (d / "exception.txt").exists()


def test_mode1_normal_exit_writes_nothing(tmp_path):
    code, out, err = run_rank(tmp_path, "exit", mode=1)
    assert code == 0 and "NORMAL_END" in out
    assert not (tmp_path / "rdr").exists()  # reservation removed, root it created removed too


def test_mode2_after_exception_writes_one_bundle(tmp_path):
    code, out, err = run_rank(tmp_path, "raise", mode=2)
    assert code == 1
    [d] = bundles(tmp_path)
    check_bundle(d, "ValueError")


def test_disabled_installs_nothing():
    from rankscope.config.rdr import RdrSettings
    from rankscope.rdr.crash_hooks import RdrRecorder

    hook = sys.excepthook
    rec = RdrRecorder(RdrSettings(enable=False)).install()
    assert sys.excepthook is hook and rec.bundles == []


MINDSPORE_RANK = textwrap.dedent("""
    import sys
    import numpy as np
    import mindspore as ms
    from mindspore import nn
    from rankscope.rdr.flight_recorder import FlightRecorder
    from rankscope.rdr.crash_hooks import install_rdr
    from rankscope.wire.records import Kind, NameTable, StepBatchBuilder
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(7)
    fr = FlightRecorder(8)
    # config.json's "rdr" section; MS_RDR_ENABLE=0 in the env must lose to it.
    install_rdr({"enable": True, "mode": 1, "path": sys.argv[1]}, rank=0, flight_recorder=fr)
    net, loss_fn = nn.Dense(4, 2), nn.MSELoss()
    opt = nn.SGD(net.trainable_params(), 0.1)

    def forward(x, y):
        return loss_fn(net(x), y)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)

    @ms.jit
    def train_step(x, y):
        loss, grads = grad_fn(x, y)
        opt(grads)
        return loss

    names = NameTable()
    x, y = ms.Tensor(np.ones((3, 4), np.float32)), ms.Tensor(np.zeros((3, 2), np.float32))
    for step in range(3):
        loss = float(train_step(x, y).asnumpy())
        b = StepBatchBuilder(names)
        b.add("Sentinel.loss", Kind.LOSS, (loss,) * 4, numel=1)
        fr.emit(b.build("job", 0, step))
    raise FloatingPointError(f"loss diverged after step 2 (loss={loss})")
""")


def test_mindspore_graph_mode_rank_bundle_has_ir_seed_and_versions(tmp_path):
    graphs = tmp_path / "graphs"
    env = dict(os.environ, MS_RDR_ENABLE="0", PYTHONPATH=str(REPO), MS_DEV_SAVE_GRAPHS="1",
               MS_DEV_SAVE_GRAPHS_PATH=str(graphs))
    script = tmp_path / "train.py"  # GRAPH mode compiles from source: needs a real file
    script.write_text(MINDSPORE_RANK)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "rdr")], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "FloatingPointError" in proc.stderr, proc.stderr[-2000:]
    d = tmp_path / "rdr" / "rank_0" / "rdr"
    man = json.loads((d / MANIFEST).read_text())
    assert man["complete"] is True and verify_bundle(d) == []
    ir = [f["path"] for f in man["files"] if f["path"].startswith("graphs/") and f["path"].endswith(".ir")]
    assert ir and len(ir) == len(list(graphs.rglob("*.ir")))  # MindSpore's own IR dumps, all copied
    assert json.loads((d / "seeds.json").read_text())["mindspore_global_seed"] == 7
    import mindspore  # only to compare versions; the bundle itself never imports it
    assert json.loads((d / "versions.json").read_text())["mindspore_runtime"] == mindspore.__version__
    batches, names = load_steps((d / "flight_recorder_steps.msgpack").read_bytes())
    losses = [float(b.stats[0, 0]) for b in batches]
    assert len(losses) == 3 and losses[0] > losses[-1] > 0  # real SGD steps, recorded in order
    assert "loss diverged after step 2" in (d / "exception.txt").read_text()
