"""The launcher's pure parts: the child environment, config checks, what it prints."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from rankscope.coordinator.cli.launch import build_parser
from rankscope.coordinator.launch.env import ATTACH_DIR, AttachSettings, child_env
from rankscope.coordinator.launch.preflight import UsageError
from rankscope.coordinator.launch.preflight import check_config as load_cluster_section
from rankscope.coordinator.launch.progress import ProgressPrinter, format_verdict


def test_child_env_attaches_and_keeps_existing_pythonpath(tmp_path):
    settings = AttachSettings(job="j1", agent_endpoint="ipc:///tmp/x.sock", dump_path=tmp_path / "d",
                              config_path=tmp_path / "c.json")
    env = child_env(settings, {"PATH": "/usr/bin", "PYTHONPATH": "/mine", "RANKSCOPE_CONFIG": "stale"})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(ATTACH_DIR), "/mine"]
    # msrun starts `python` from PATH: it must be this interpreter.
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    assert env["RANKSCOPE_ATTACH"] == "1" and env["RANKSCOPE_JOB"] == "j1"
    assert env["RANKSCOPE_AGENT"] == "ipc:///tmp/x.sock"
    assert env["RANKSCOPE_CONFIG"] == str(tmp_path / "c.json")
    assert env["RANKSCOPE_DUMP_PATH"] == str(tmp_path / "d")


def test_child_env_drops_a_stale_config_when_none_given(tmp_path):
    env = child_env(AttachSettings("j", "ipc://a", tmp_path), {"RANKSCOPE_CONFIG": "/old.json"})
    assert "RANKSCOPE_CONFIG" not in env


def test_child_env_names_launchs_output_file_only_when_launch_prints(tmp_path):
    from rankscope.text.watch_line import LAUNCH_OUTPUT_ENV
    stale = {LAUNCH_OUTPUT_ENV: "1:2"}  # from an outer launch: not this one's output
    assert LAUNCH_OUTPUT_ENV not in child_env(AttachSettings("j", "ipc://a", tmp_path), stale)
    env = child_env(AttachSettings("j", "ipc://a", tmp_path, launch_output="5:7"), stale)
    assert env[LAUNCH_OUTPUT_ENV] == "5:7"


def test_attach_hook_is_inert_in_a_process_that_never_imports_mindspore(tmp_path):
    # msrun's own launcher process runs the hook too: it must not import MindSpore
    # (a second of start-up and a device context in a process that never trains).
    env = child_env(AttachSettings("j", f"ipc://{tmp_path}/none.sock", tmp_path))
    code = "import sys; print('mindspore' in sys.modules, 'agent' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    imported_ms, _ = out.stdout.split()
    assert imported_ms == "False"
    assert "attach failed" not in out.stderr


def test_bad_config_file_is_named(tmp_path):
    bad = tmp_path / "c.json"
    bad.write_text("{not json")
    with pytest.raises(UsageError, match="not valid JSON"):
        load_cluster_section(bad, None)
    with pytest.raises(UsageError, match="(?i)no such file"):
        load_cluster_section(tmp_path / "missing.json", None)


def test_bad_cluster_field_is_rejected_before_anything_starts(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"cluster": {"on_divergence": "explode"}}))
    with pytest.raises(UsageError, match="on_divergence"):
        load_cluster_section(cfg, None)


def test_flag_overrides_config_action(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"cluster": {"on_divergence": "continue"}}))
    assert load_cluster_section(cfg, "terminate")["cluster"]["on_divergence"] == "terminate"
    assert load_cluster_section(cfg, None)["cluster"]["on_divergence"] == "continue"
    assert load_cluster_section(None, None) == {"level": "L0", "cluster": {"on_divergence": "pause"}}


def test_watch_flag_sets_the_jobs_tier_over_its_config(tmp_path):
    from rankscope.coordinator.cli.launch import check_args
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"cluster": {"watch": "default", "budget": 0.1}}))
    base = ["--export-dir", str(tmp_path / "o"), "--config", str(cfg)]
    job = check_args(build_parser().parse_args([*base, "--watch", "full", "--", sys.executable, "-c", "0"]))
    assert job["cluster"]["watch"] == "full" and job["cluster"]["budget"] == 0.1
    job = check_args(build_parser().parse_args([*base, "--", sys.executable, "-c", "0"]))
    assert job["cluster"]["watch"] == "default"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--watch", "light", "--", "x"])


def test_parser_keeps_the_command_verbatim():
    args = build_parser().parse_args(["--export-dir", "o", "--", "msrun", "--worker_num=4", "train.py"])
    assert args.cmd == ["--", "msrun", "--worker_num=4", "train.py"]


def test_progress_prints_only_changes():
    lines: list[str] = []
    pp = ProgressPrinter(lines.append)
    status = {"ranks": {"0": {"step": 1}, "1": {"step": 1}}, "last_judged_step": 1, "incidents": []}
    pp.update(status)
    pp.update(status)
    assert len(lines) == 2 and "2 rank(s) attached: 0, 1" in lines[0] and "step 1 judged" in lines[1]
    status["incidents"] = [{"incident_id": "i1", "detector": "nan_origin", "first_diverging_rank": 1,
                            "step": 3, "tensor": "Cell.fc1.Dense.forward.0"}]
    pp.update(status)
    pp.update(status)
    assert len(lines) == 3 and "rank 1 at step 3" in lines[2]


def test_a_step_judged_without_a_rank_says_so():
    lines: list[str] = []
    pp = ProgressPrinter(lines.append)
    pp.update({"ranks": {"0": {"step": 6}, "1": {"step": 6}, "2": {"step": 5}, "3": {"step": 6}},
               "last_judged_step": 6, "incidents": []})
    assert lines[-1] == "step 6 judged without rank 2 (each rank's newest step 0:6, 1:6, 2:5, 3:6)"
    pp.update({"ranks": {str(r): {"step": 7} for r in range(4)}, "last_judged_step": 7, "incidents": []})
    assert lines[-1].startswith("step 7 judged across all ranks")


def test_ranks_watched_alike_share_one_watch_line_and_a_late_rank_gets_its_own():
    lines: list[str] = []
    pp = ProgressPrinter(lines.append)
    graph = {"mode": "GRAPH", "how": "the kernel dump", "reason": ""}
    status = {"ranks": {str(r): {"step": 0, "watch": graph} for r in range(4)}, "incidents": []}
    pp.update(status)
    pp.update(status)
    assert [x for x in lines if "watched" in x] == ["ranks 0-3: GRAPH mode, watched through the kernel dump"]
    status["ranks"]["4"] = {"step": 0, "watch": {"mode": "PYNATIVE", "how": "hooks", "reason": ""}}
    pp.update(status)
    assert lines[-1] == "rank 4: PYNATIVE mode, watched through hooks"


def test_verdict_names_rank_step_tensor_and_report():
    text = format_verdict({"first_diverging_rank": 2, "detector": "nan_origin", "step": 4,
                           "tensor": "Cell.fc1.Dense.forward.0", "dir": "/x/incidents/abc",
                           "bundles": {"0": "a", "2": "b"}, "ties": [], "evidence": {"rule": "nan_count > 0"}})
    assert "rank 2 diverged first" in text and "step     : 4" in text
    assert "/x/incidents/abc/report.html" in text and "rank 0, rank 2" in text and "nan_count > 0" in text


def test_a_crash_verdict_shows_the_token_the_others_and_later_findings():
    text = format_verdict({
        "first_diverging_rank": 1, "detector": "progress", "step": 3, "token": 1, "tensor": None, "ties": [],
        "evidence": {"failed_at": 1.0, "manner": "killed by SIGKILL while at token 1", "rule": "first to fail",
                     "followers": [{"rank": 3, "signal": "SIGTERM", "delay_s": 0.4}],
                     "others": [{"rank": 0, "state": "running", "started": 3, "last_step": 2},
                                {"rank": 2, "state": "finished", "started": 3, "last_step": 3, "heard_s": 0.25},
                                {"rank": 3, "state": "lost", "started": 3, "last_step": 2}]},
        "related_verdicts": [{"detector": "progress", "rank": 1, "step": 3},
                             {"detector": "nan_origin", "rank": 2, "step": 2, "token": 3, "tensor": "Cell.a.forward.1"}]})
    assert "token    : 1" in text and "how      : killed by SIGKILL while at token 1" in text
    assert ("others   : when it died, rank 0 running (began step 3), rank 2 finished (done with step 3, heard 0.2 s "
            "before its death), rank 3 alive (began step 3; lost 0.40 s later)") in text
    assert text.count("also     :") == 1
    assert "also     : nan_origin names rank 2 at step 2, token 3 (Cell.a.forward.1)" in text


def test_a_crash_filed_under_an_earlier_incident_says_how_the_rank_failed():
    text = format_verdict({
        "first_diverging_rank": 1, "detector": "replica", "step": 1, "token": 2, "tensor": "Cell.q.forward.2",
        "ties": [], "evidence": {"rule": "md5 differs from the replicas'"},
        "related_verdicts": [{"detector": "progress", "rank": 0, "step": 3, "token": 1, "tensor": None,
                              "evidence": {"manner": "killed by SIGKILL while at token 1"}}]})
    assert "rank 1 diverged first" in text
    assert "also     : progress names rank 0 at step 3, token 1 (killed by SIGKILL while at token 1)" in text


def _config_answering_agent(endpoint: str, config: dict, stop: threading.Event) -> threading.Thread:
    """This host's node agent as launch --agent sees it: a real socket answering launch's
    job-config question with ``config`` (what a node agent relays from its coordinator)."""
    import zmq

    from rankscope.wire import job_config, protocol
    from rankscope.wire.transport import bind_router
    ctx = zmq.Context()
    sock, _ = bind_router(ctx, endpoint)

    def serve() -> None:
        dec = protocol.Decoder()
        try:
            while not stop.is_set():
                if not sock.poll(100):
                    continue
                ident, frame = sock.recv_multipart()
                msg = dec.decode(frame)
                if msg is not None and msg.body.get("what") == job_config.WHAT:
                    answer = protocol.Message(protocol.STATUS, msg.job, "agent", 0, job_config.body(config))
                    sock.send_multipart([ident, protocol.encode(answer)])
        finally:
            sock.close(linger=0)
            ctx.term()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return t


def test_agent_mode_joins_the_hosts_agent_and_returns_the_command_status(short_tmp):
    # Multi-node (Slurm, bare metal, k8s): no Ray, no coordinator, no agent of its own;
    # the ranks get the host agent's endpoint, the job id every node shares and the
    # coordinator's job config, relayed by that agent.
    from rankscope.config.job import job_config
    endpoint, stop = f"ipc://{short_tmp}/agent.sock", threading.Event()
    agent = _config_answering_agent(endpoint, job_config(None, "continue"), stop)
    code = ("import json, os, sys; print(os.environ['RANKSCOPE_AGENT'], os.environ['RANKSCOPE_JOB'], "
            "os.environ['RANKSCOPE_ATTACH'], json.load(open(os.environ['RANKSCOPE_CONFIG']))['cluster']"
            "['on_divergence']); sys.exit(3)")
    try:
        out = subprocess.run([sys.executable, "-m", "rankscope", "launch", "--agent", endpoint, "--job", "j42",
                              "--export-dir", str(short_tmp / "out"), "--", sys.executable, "-c", code],
                             capture_output=True, text=True, timeout=120)
    finally:
        stop.set()
        agent.join(5)
    assert out.returncode == 3, out.stderr
    assert f"{endpoint} j42 1 continue" in out.stdout, out.stdout
    assert "coordinator up" not in out.stdout and "node agent listening" not in out.stdout
    assert "attaching ranks to this host's node agent" in out.stdout
    assert "ranks take the coordinator's job config" in out.stdout


def test_agent_mode_requires_a_shared_job_id(tmp_path):
    out = subprocess.run([sys.executable, "-m", "rankscope", "launch", "--agent", "ipc:///run/x.sock",
                          "--", "true"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--agent needs --job" in out.stderr


def test_the_attach_directory_is_the_installed_packages():
    from rankscope.coordinator.launch.env import ATTACH_DIR
    assert (ATTACH_DIR / "sitecustomize.py").is_file()


def test_nothing_known_is_a_dash_never_none():
    from rankscope.coordinator.cli.control import format_status
    verdict = format_verdict({"first_diverging_rank": 1, "detector": "manual", "step": None, "tensor": None})
    status = format_status({"endpoint": None, "last_judged_step": None, "ranks": {"0": {"state": "expected",
                            "step": None}}, "incidents": [{"incident_id": "i1", "detector": "manual",
                                                           "first_diverging_rank": None, "step": None}]})
    for text in (verdict, status):
        assert "None" not in text and "—" in text, text


def test_status_says_what_was_watched_beside_the_incident_count():
    from rankscope.coordinator.cli.control import format_status
    full = {"job": "j", "steps": [0, 9], "ranks": 4, "watched_ranks": 4, "complete": True, "not_seen": []}
    gap = {**full, "watched_ranks": 3, "complete": False, "not_seen": [{"rank": 2, "steps": "all"}]}
    one = format_status({"ranks": {}, "incidents": [], "coverage": {"j": full}})
    assert "coverage: watched steps 0-9 on 4/4 ranks" in one.splitlines()
    two = format_status({"ranks": {}, "incidents": [], "coverage": {"j": full, "k": gap}})
    assert "coverage (job k): watched steps 0-9 on 3/4 ranks; rank 2 not seen at all" in two.splitlines()


def test_replicas_split_with_no_majority_name_no_first_rank():
    text = format_verdict({"first_diverging_rank": None, "detector": "replica", "step": 0, "ties": [],
                           "decided": False, "undecided_between": [0, 1, 2, 3],
                           "tensor": "Sentinel.param.w", "evidence": {"majority": False, "rule": "no majority"}})
    assert ("rankscope verdict: no rank named: ranks 0-3 disagree, and nothing tells which is wrong (the job was "
            "left running; the bundles are exported)") in text
    assert "diverged first" not in text and "tensor   : Sentinel.param.w" in text
    # An incident.json written before "decided" existed reads the same.
    old = format_verdict({"first_diverging_rank": 0, "detector": "replica", "step": 0, "ties": [1, 2, 3],
                          "tensor": "Sentinel.param.w", "evidence": {"majority": False}})
    assert "no rank named: ranks 0-3 disagree" in old
    one = format_verdict({"first_diverging_rank": 2, "detector": "replica", "step": 1, "ties": [],
                          "evidence": {"majority": True}})
    assert "rankscope verdict: rank 2 diverged first" in one
    hinted = format_verdict({"first_diverging_rank": 0, "detector": "replica", "step": 0, "ties": [1],
                             "evidence": {"majority": False, "hint": "give every rank the same seed"}})
    assert "  hint     : give every rank the same seed" in hinted.splitlines()
    again = format_verdict({"first_diverging_rank": 0, "detector": "replica", "step": 0, "ties": [1],
                            "tensor": "Sentinel.param.w", "evidence": {"majority": False},
                            "related_verdicts": [{"detector": "replica", "rank": 1, "step": 1,
                                                  "tensor": "Sentinel.param.w"},
                                                 {"detector": "nan_origin", "rank": 1, "step": 2, "tensor": "x"}]})
    assert [x for x in again.splitlines() if "also" in x] == ["  also     : nan_origin names rank 1 at step 2 (x)"]


def test_the_live_divergence_line_names_no_first_rank_of_a_split_without_majority():
    said: list[str] = []
    p = ProgressPrinter(said.append)
    inc = {"incident_id": "i1", "first_diverging_rank": None, "detector": "replica", "step": 0, "ties": [],
           "decided": False, "undecided_between": [0, 1, 2, 3],
           "tensor": "Sentinel.param.0.weight", "state": "exporting",
           "evidence": {"majority": False, "hint": "give every rank the same seed"}}
    p.update({"ranks": {}, "incidents": [inc]})
    assert said[1:] == ["UNDECIDED: replica: ranks 0-3 disagree at step 0 (Sentinel.param.0.weight) and nothing "
                        "tells which is wrong; exported, the job runs on; state exporting",
                        "  hint: give every rank the same seed"]


def test_an_operator_export_is_not_called_a_divergence_of_rank_minus_one():
    from rankscope.coordinator.launch.progress import ProgressPrinter
    inc = {"incident_id": "I9", "first_diverging_rank": -1, "detector": "manual", "step": 4, "tensor": None,
           "ties": [], "state": "exporting", "evidence": {"rule": "operator export"}}
    text = format_verdict(inc)
    assert "rankscope verdict: no divergence named: bundles exported on an operator's request at step 4" in text
    assert "rank -1" not in text
    lines = []
    ProgressPrinter(lines.append).update({"incidents": [inc]})
    assert lines[-1] == "EXPORT on an operator's request at step 4 (no divergence named); state exporting"


def test_msruns_logs_are_linked_one_by_one_and_a_later_run_replaces_the_links(tmp_path):
    from rankscope.coordinator.launch.worker_logs import WorkerLogLinks
    out = tmp_path / "out"
    out.mkdir()
    # msrun's default: logs where it runs, which holds the export folder too.
    links = WorkerLogLinks.for_command(["msrun", "--worker_num=2", "t.py"], tmp_path, out)
    links.poll()  # nothing written yet
    (tmp_path / "worker_0.log").write_text("step 0\n")
    links.poll()
    (tmp_path / "worker_1.log").write_text("step 0\n")
    links.poll()
    folder = out / "worker_logs"
    assert not folder.is_symlink() and sorted(p.name for p in folder.iterdir()) == ["worker_0.log", "worker_1.log"]
    assert (folder / "worker_1.log").read_text() == "step 0\n"
    # A later run into the same export folder, logging elsewhere: only its own logs.
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "worker_0.log").write_text("run 2\n")
    again = WorkerLogLinks.for_command(["msrun", "--log_dir", "logs", "t.py"], tmp_path, out)
    again.poll()
    assert [p.name for p in folder.iterdir()] == ["worker_0.log"] and (folder / "worker_0.log").read_text() == "run 2\n"
    assert WorkerLogLinks.for_command(["msrun", "--log_dir=out/own", "t.py"], tmp_path, out) is None
    assert WorkerLogLinks.for_command(["python", "t.py"], tmp_path, out) is None


def test_an_outlier_rule_reads_as_a_sentence_with_its_size():
    text = format_verdict({"first_diverging_rank": 2, "detector": "outlier", "step": 3, "tensor": "t",
                           "evidence": {"rule": "peer+history", "ratio_to_median": 61.84, "value": "Norm"}})
    assert "  rule     : peer+history: far from the other ranks' median and far from its own recent history " \
           "(61.8x the median Norm)" in text
    assert "  rule     : first non-finite record" in format_verdict(
        {"first_diverging_rank": 2, "detector": "nan_origin", "step": 3, "evidence": {"rule": "first non-finite record"}})
