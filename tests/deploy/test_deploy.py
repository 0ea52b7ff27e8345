"""deploy/ examples, exercised as far as a machine without Slurm, systemd or a Docker
engine allows: shell syntax (bash -n, shellcheck when installed), dry runs of the Slurm
and bare-metal scripts with recording stand-ins for srun/scontrol/ray/rankscope/msrun on
PATH (real processes, real sockets for the readiness waits), the systemd unit through
systemd-analyze verify, and the Dockerfile's structure (hadolint when installed)."""
from __future__ import annotations

import configparser
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from repo_paths import REPO

ROOT = REPO
DEPLOY = ROOT / "deploy"
SCRIPTS = [DEPLOY / "slurm" / "rankscope.sbatch", DEPLOY / "baremetal" / "start-coordinator.sh",
           DEPLOY / "baremetal" / "run-node.sh"]
UNIT = DEPLOY / "systemd" / "rankscope-agent.service"
DOCKERFILE = DEPLOY / "Dockerfile"

# ---- stand-ins -------------------------------------------------------------------------------
# Each logs one JSON line {tool, argv, env...} to $FAKE_LOG; daemons also do what the scripts
# wait for (listen on their TCP port / Unix socket) and block until terminated.

_COMMON = r'''
import json, os, signal, socket, sys, time
def log(**kw):
    kw.update(pid=os.getpid(), node=os.environ.get("FAKE_NODE", ""))
    with open(os.environ["FAKE_LOG"], "a") as f:
        f.write(json.dumps(kw) + "\n")
def serve_tcp(port):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", int(port))); s.listen(16); block(s)
def serve_unix(path):
    try: os.unlink(path)
    except FileNotFoundError: pass
    s = socket.socket(socket.AF_UNIX); s.bind(path); s.listen(16); block(s)
def block(s):
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    s.settimeout(0.2)
    while True:
        try: s.accept()[0].close()
        except socket.timeout: pass
def flag(argv, name):
    for i, a in enumerate(argv):
        if a == name: return argv[i + 1]
        if a.startswith(name + "="): return a.split("=", 1)[1]
'''

STUBS = {
    # srun: run the command once per selected node (in parallel, like tasks), SLURM_NODEID set.
    "srun": _COMMON + r'''
import subprocess
argv = sys.argv[1:]; opts = []
while argv and argv[0].startswith("-"):
    opts.append(argv.pop(0))
nodes = os.environ["FAKE_NODES"].split()
o = dict(a.lstrip("-").split("=", 1) for a in opts if "=" in a)
chosen = o["nodelist"].split(",") if "nodelist" in o else nodes[:int(o.get("nodes", len(nodes)))]
log(tool="srun", opts=opts, argv=argv, nodes=chosen)
procs = [subprocess.Popen(argv, env=dict(os.environ, SLURM_NODEID=str(nodes.index(n)), FAKE_NODE=n))
         for n in chosen]
def stop(*_):
    # No wait() here: the main thread's wait() holds Popen's lock (it would deadlock).
    for p in procs:
        p.terminate()
    os._exit(143)
signal.signal(signal.SIGTERM, stop)
sys.exit(max(p.wait() for p in procs))
''',
    # squeue -s: the running steps as "<id> <name>"; a step's id here is its srun's pid.
    "squeue": _COMMON + r'''
with open(os.environ["FAKE_LOG"]) as f:
    for rec in map(json.loads, f):
        name = flag(rec.get("opts") or [], "--job-name") if rec["tool"] == "srun" else None
        if name:
            try: os.kill(rec["pid"], 0)
            except ProcessLookupError: continue
            print(rec["pid"], name)
''',
    "scancel": _COMMON + r'''
argv = sys.argv[1:]
log(tool="scancel", argv=argv)
sig = flag(argv, "--signal")
os.kill(int(argv[-1]), getattr(signal, "SIG" + sig))
''',
    "scontrol": _COMMON + r'''
assert sys.argv[1:3] == ["show", "hostnames"], sys.argv
print("\n".join(os.environ["FAKE_NODES"].split()))
''',
    "ray": _COMMON + r'''
argv = sys.argv[1:]
log(tool="ray", argv=argv)
if argv[:1] == ["start"] and "--block" in argv:
    serve_tcp(flag(argv, "--port"))
elif argv[:1] == ["start"]:
    # Non-blocking `ray start` daemonises: leave a listener behind, like the real head.
    if os.fork() == 0:
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        log(tool="ray-daemon", argv=argv)
        serve_tcp(flag(argv, "--port"))
elif argv[:1] == ["stop"]:
    with open(os.environ["FAKE_LOG"]) as f:
        for rec in map(json.loads, f):
            if rec["tool"] == "ray-daemon":
                try: os.kill(rec["pid"], signal.SIGTERM)
                except ProcessLookupError: pass
''',
    "rankscope": _COMMON + r'''
import subprocess
argv = sys.argv[1:]
log(tool="rankscope", argv=argv, env={k: v for k, v in os.environ.items() if k.startswith("RANKSCOPE_")})
if argv[0] == "coordinator":
    serve_tcp(flag(argv, "--bind").rsplit(":", 1)[1])
elif argv[0] == "agent":
    serve_unix(flag(argv, "--listen")[len("ipc://"):])
elif argv[0] == "launch":
    cmd = argv[argv.index("--") + 1:]
    sys.exit(subprocess.call(cmd))
''',
    "msrun": _COMMON + r'''
log(tool="msrun", argv=sys.argv[1:])
''',
}


@pytest.fixture
def fakes(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, body in STUBS.items():
        path = bindir / name
        path.write_text(f"#!{sys.executable}\n{body}")
        path.chmod(0o755)
    log = tmp_path / "calls.jsonl"
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "HOME": str(tmp_path), "FAKE_LOG": str(log),
           "LANG": "C.UTF-8"}
    return env, log


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def calls(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def flag(argv: list[str], name: str) -> str:
    for i, a in enumerate(argv):
        if a == name:
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    raise AssertionError(f"{name} not in {argv}")


def parse_with_real_cli(argv: list[str]):
    """Parse a `rankscope ...` command line with the real subcommand's parser: the examples
    must use the flags that exist."""
    import contextlib
    import io
    cmd, rest = argv[0], argv[1:]
    if cmd == "agent":
        from rankscope.cli.agent import build_parser
    elif cmd == "coordinator":
        from rankscope.coordinator.cli.coordinator import build_parser
    elif cmd == "launch":
        from rankscope.coordinator.cli.launch import build_parser
    else:
        raise AssertionError(f"unexpected rankscope command {argv}")
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return build_parser().parse_args(rest)
    except SystemExit:
        pytest.fail(f"`rankscope {cmd}` rejects {rest}: {err.getvalue().strip()}")


def assert_all_exited(pids: list[int]) -> None:
    """Every stand-in the script started is gone once it returns (bounded wait for reaping)."""
    deadline = time.monotonic() + 10
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _alive(p)]
        if alive:
            time.sleep(0.1)
    assert not alive, f"processes left running after the script: {alive}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (our grandchild, not yet reaped by init) is not running
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# ---- shell syntax ------------------------------------------------------------------------------

@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_bash_syntax(script):
    out = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert script.read_text().startswith("#!/bin/bash\n") and os.access(script, os.X_OK)


@pytest.mark.skipif(shutil.which("shellcheck") is None,
                    reason="shellcheck not installed (Debian: apt-get install -y shellcheck)")
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_shellcheck(script):
    out = subprocess.run(["shellcheck", "--shell=bash", "--severity=style", str(script)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


# ---- Slurm dry run -----------------------------------------------------------------------------

def test_sbatch_dry_run(fakes, tmp_path):
    env, log = fakes
    ray_port, coord_port = free_port(), free_port()
    env.update(FAKE_NODES="127.0.0.1 node-b", SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="n[1-2]",
               SLURM_CPUS_ON_NODE="16",
               RANKS_PER_NODE="4", RAY_PORT=str(ray_port), COORDINATOR_PORT=str(coord_port),
               SOCKET_DIR=str(tmp_path / "sock"), EXPORT_DIR=str(tmp_path / "exports"),
               CURVE_DIR="/keys")
    out = subprocess.run(["bash", str(SCRIPTS[0]), "train.py", "--lr", "0.1"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    log_calls = calls(log)
    assert_all_exited([c["pid"] for c in log_calls])

    def steps(pred):
        return [c for c in log_calls if c["tool"] == "srun" and pred(c["argv"])]
    ray_step, = steps(lambda a: "ray start" in " ".join(a))
    coord_step, = steps(lambda a: a[:2] == ["rankscope", "coordinator"])
    agent_step, = steps(lambda a: "rankscope agent" in " ".join(a))
    train_step, = steps(lambda a: "rankscope launch" in " ".join(a))
    order = [log_calls.index(s) for s in (ray_step, coord_step, agent_step, train_step)]
    assert order == sorted(order), "ray head, coordinator, agents, training: in that order"
    # Coordinator on the first node only; agents and training on every node, one task each.
    assert ray_step["nodes"] == coord_step["nodes"] == ["127.0.0.1"]
    assert "--ntasks-per-node=1" in agent_step["opts"] and agent_step["nodes"] == ["127.0.0.1", "node-b"]
    assert "--ntasks-per-node=1" in train_step["opts"] and train_step["nodes"] == ["127.0.0.1", "node-b"]
    assert "--cpus-per-task=16" in train_step["opts"]  # msrun's workers get the whole node
    assert all("--overlap" in s["opts"] for s in (ray_step, coord_step, agent_step))
    # At the end the daemon steps are signalled through Slurm (SIGTERM to srun would make
    # Slurm SIGKILL them), agents first, Ray last.
    stopped = [c["argv"] for c in log_calls if c["tool"] == "scancel"]
    assert stopped == [["--signal=TERM", str(s["pid"])] for s in (agent_step, coord_step, ray_step)]

    coord, = [c for c in log_calls if c["tool"] == "rankscope" and c["argv"][0] == "coordinator"]
    agents = [c for c in log_calls if c["tool"] == "rankscope" and c["argv"][0] == "agent"]
    launches = [c for c in log_calls if c["tool"] == "rankscope" and c["argv"][0] == "launch"]
    msruns = [c for c in log_calls if c["tool"] == "msrun"]
    for c in [coord, *agents]:
        parse_with_real_cli(c["argv"])
    assert flag(coord["argv"], "--address") == f"127.0.0.1:{ray_port}"
    ray_head, = [c for c in log_calls if c["tool"] == "ray" and "--head" in c["argv"]]
    assert flag(ray_head["argv"], "--temp-dir") == str(tmp_path / "sock" / "ray")  # never /tmp/ray
    assert {a["node"] for a in agents} == {"127.0.0.1", "node-b"}
    for a in agents:
        assert flag(a["argv"], "--coordinator") == f"tcp://127.0.0.1:{coord_port}"
        assert flag(a["argv"], "--job") == flag(coord["argv"], "--job") == "slurm-4242"
    socket_endpoint = f"ipc://{tmp_path / 'sock'}/agent.sock"
    assert all(a["argv"][a["argv"].index("--listen") + 1] == socket_endpoint for a in agents)
    assert len(launches) == 2 and all(flag(lc["argv"], "--agent") == socket_endpoint for lc in launches)
    # Same launch flags as run-node.sh, whose launch line test_launch_flags_are_real parses.
    assert {a for a in launches[0]["argv"][:launches[0]["argv"].index("--")] if a.startswith("--")} == \
        {"--agent", "--job", "--export-dir"}
    # One msrun per node: node ranks 0 and 1 of a 2 x 4 world, rendezvous on the first node.
    assert sorted(int(flag(m["argv"], "--node_rank")) for m in msruns) == [0, 1]
    for m in msruns:
        assert flag(m["argv"], "--worker_num") == "8" and flag(m["argv"], "--local_worker_num") == "4"
        assert flag(m["argv"], "--master_addr") == "127.0.0.1"
        assert m["argv"][-3:] == ["train.py", "--lr", "0.1"]


def test_sbatch_needs_a_training_script(fakes):
    env, _ = fakes
    out = subprocess.run(["bash", str(SCRIPTS[0])], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "usage" in out.stderr


# ---- bare metal dry runs ---------------------------------------------------------------------

@pytest.fixture
def agent_socket(tmp_path):
    path = tmp_path / "agent.sock"
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(path))
    srv.listen(1)
    yield path
    srv.close()


def test_run_node_dry_run(fakes, agent_socket, tmp_path):
    env, log = fakes
    env.update(AGENT_SOCKET=str(agent_socket), RANKS_PER_NODE="2", RANKSCOPE_JOB="bm-1",
               EXPORT_DIR=str(tmp_path / "out"), RANKSCOPE_CONFIG=str(tmp_path / "config.json"))
    out = subprocess.run(["bash", str(SCRIPTS[2]), "1", "3", "10.0.0.1", "train.py", "--epochs", "2"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    launch, msrun = [c for c in calls(log) if c["tool"] in ("rankscope", "msrun")]
    assert launch["argv"][0] == "launch"
    assert flag(launch["argv"], "--agent") == f"ipc://{agent_socket}"
    assert flag(launch["argv"], "--job") == "bm-1"
    assert flag(launch["argv"], "--config") == str(tmp_path / "config.json")
    assert flag(msrun["argv"], "--worker_num") == "6" and flag(msrun["argv"], "--node_rank") == "1"
    assert flag(msrun["argv"], "--master_addr") == "10.0.0.1"
    assert msrun["argv"][-3:] == ["train.py", "--epochs", "2"]


def test_launch_flags_are_real(fakes, agent_socket, tmp_path):
    env, log = fakes
    env.update(AGENT_SOCKET=str(agent_socket), RANKSCOPE_CONFIG=str(tmp_path / "c.json"))
    out = subprocess.run(["bash", str(SCRIPTS[2]), "0", "2", "10.0.0.1", "train.py"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    launch, = [c["argv"] for c in calls(log) if c["tool"] == "rankscope"]
    from rankscope.coordinator.cli.launch import build_parser
    known, unknown = build_parser().parse_known_args(launch[1:])
    if unknown == ["--agent"]:
        # Multi-node needs launch to use the node agent already running on the host
        # (started by srun / systemd) instead of starting its own.
        pytest.xfail("`rankscope launch` has no --agent ENDPOINT option yet (needed for multi-node)")
    parse_with_real_cli(launch)


@pytest.mark.parametrize("args, rc, message", [
    (["0", "2"], 2, "usage"),
    (["2", "2", "h", "t.py"], 2, "must be below"),
    (["x", "2", "h", "t.py"], 2, "integers"),
])
def test_run_node_rejects_bad_arguments(fakes, agent_socket, args, rc, message):
    env, log = fakes
    env["AGENT_SOCKET"] = str(agent_socket)
    out = subprocess.run(["bash", str(SCRIPTS[2]), *args], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == rc and message in out.stderr
    assert not calls(log)


def test_run_node_without_agent_says_so(fakes, tmp_path):
    env, log = fakes
    env["AGENT_SOCKET"] = str(tmp_path / "missing.sock")
    out = subprocess.run(["bash", str(SCRIPTS[2]), "0", "1", "h", "t.py"], env=env,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 1 and "no node agent" in out.stderr and not calls(log)


def test_start_coordinator_dry_run(fakes, tmp_path):
    env, log = fakes
    coord_port = free_port()
    env.update(COORDINATOR_PORT=str(coord_port), RAY_PORT=str(free_port()), RANKSCOPE_JOB="bm-1")
    # The stand-in coordinator serves until terminated: stop it once it is listening.
    proc = subprocess.Popen(["bash", str(SCRIPTS[1]), str(tmp_path / "exp")], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not [c for c in calls(log) if c["tool"] == "rankscope"] and time.monotonic() < deadline:
            time.sleep(0.1)
        coord = [c for c in calls(log) if c["tool"] == "rankscope"]
        assert coord, "the coordinator was never started"
        os.kill(coord[0]["pid"], signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    ray_calls = [c["argv"] for c in calls(log) if c["tool"] == "ray"]
    assert ray_calls[0][:2] == ["start", "--head"] and ray_calls[-1] == ["stop"], err
    parse_with_real_cli(coord[0]["argv"])
    assert flag(coord[0]["argv"], "--bind") == f"tcp://0.0.0.0:{coord_port}"
    assert flag(coord[0]["argv"], "--export-dir") == str(tmp_path / "exp")
    assert (tmp_path / "exp").is_dir()
    # `ray stop` on exit took the (daemonised) head down with the coordinator.
    assert [c for c in calls(log) if c["tool"] == "ray-daemon"]
    assert_all_exited([c["pid"] for c in calls(log)])


# ---- systemd -------------------------------------------------------------------------------

def _unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=True, interpolation=None, delimiters=("=",))
    parser.optionxform = str  # systemd keys are case-sensitive
    parser.read_string(UNIT.read_text())
    return parser


def test_systemd_unit_parses_and_is_locked_down():
    unit = _unit()
    assert set(unit.sections()) == {"Unit", "Service", "Install"}
    svc = unit["Service"]
    assert svc["User"] not in ("root", "0") and svc["NoNewPrivileges"] == "yes"
    assert svc["CapabilityBoundingSet"] == "" and svc["ProtectSystem"] == "strict"
    assert svc["UMask"] == "0007" and svc["RuntimeDirectory"] == "rankscope"
    exec_start = svc["ExecStart"].replace("\\\n", " ").split()
    assert exec_start[1] == "agent"
    # The socket it listens on is inside the runtime directory systemd creates for it.
    assert flag(exec_start, "--listen") == "ipc:///run/rankscope/agent.sock"
    assert flag(exec_start, "--spool").startswith("/var/lib/rankscope/")
    assert flag(exec_start, "--coordinator") == "${RANKSCOPE_COORDINATOR}"
    parse_with_real_cli([a.replace("${RANKSCOPE_COORDINATOR}", "tcp://c:5555").replace("%H", "h")
                         .replace("${RANKSCOPE_JOB}", "j") for a in exec_start[1:]])
    env_file = (DEPLOY / "systemd" / "agent.env").read_text()
    assert re.search(r"^RANKSCOPE_COORDINATOR=tcp://", env_file, re.M)
    assert re.search(r"^RANKSCOPE_JOB=\S+", env_file, re.M)
    assert unit["Install"]["WantedBy"] == "multi-user.target"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_verify(tmp_path):
    # verify checks that ExecStart's binary exists: point it at one that does.
    copy = tmp_path / UNIT.name
    copy.write_text(UNIT.read_text().replace("/opt/rankscope/bin/rankscope", shutil.which("true")))
    out = subprocess.run(["systemd-analyze", "verify", str(copy)], capture_output=True, text=True,
                         env={**os.environ, "SYSTEMD_LOG_LEVEL": "warning"})
    assert out.returncode == 0 and UNIT.name not in out.stderr, out.stderr


# ---- Dockerfile -----------------------------------------------------------------------------

def dockerfile_instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_structure():
    ins = dockerfile_instructions()
    assert ins[0][0] == "ARG" and ins[0][1].startswith("BASE_IMAGE=python:3.11-slim")
    froms = [i for i, (w, _) in enumerate(ins) if w == "FROM"]
    assert len(froms) == 2 and all(ins[i][1].startswith("${BASE_IMAGE}") for i in froms)
    final = ins[froms[-1]:]
    users = [rest for w, rest in final if w == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), "the image must not run as root"
    assert not [rest for w, rest in ins if w == "ADD"], "COPY only: no remote ADD"
    # The MindSpore the image installs is the release the tests run against (the Makefile's).
    pin = re.search(r"^TESTED_MINDSPORE := (mindspore==\S+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert ("ARG", f'MINDSPORE_SPEC="{pin}"') in ins
    # The Ray it installs is the release the chart's RayCluster declares.
    ray_pin = next(rest for w, rest in ins if w == "ARG" and rest.startswith("RAY_SPEC="))
    values = yaml.safe_load((ROOT / "helm" / "rankscope" / "values.yaml").read_text())
    assert ray_pin == f'RAY_SPEC="ray[default]=={values["ray"]["version"]}"'
    # The uid is the one the chart's securityContext runs as.
    uid = next(rest.split("=")[1] for w, rest in ins if w == "ARG" and rest.startswith("RANKSCOPE_UID="))
    values = yaml.safe_load((ROOT / "helm" / "rankscope" / "values.yaml").read_text())
    assert int(uid) == values["agent"]["podSecurityContext"]["runAsUser"] == \
        values["ray"]["head"]["podSecurityContext"]["runAsUser"]
    # Everything it copies exists, and survives the .dockerignore.
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().split()
    for w, rest in ins:
        if w == "COPY" and not rest.startswith("--from"):
            for src in rest.split()[:-1]:
                assert (ROOT / src).exists(), src
                assert f"!{src}" in ignore or f"!{src}/**" in ignore, f"{src} is excluded by the .dockerignore"


def test_dockerfile_run_steps_are_valid_sh(tmp_path):
    # What hadolint does with ShellCheck, without hadolint: RUN lines run under /bin/sh.
    runs = [rest for w, rest in dockerfile_instructions() if w == "RUN"]
    assert runs
    for i, script in enumerate(runs):
        path = tmp_path / f"run{i}.sh"
        path.write_text(script + "\n")
        out = subprocess.run(["sh", "-n", str(path)], capture_output=True, text=True)
        assert out.returncode == 0, script + out.stderr
        if shutil.which("shellcheck"):
            out = subprocess.run(["shellcheck", "--shell=sh", str(path)], capture_output=True, text=True)
            assert out.returncode == 0, script + out.stdout


@pytest.mark.skipif(shutil.which("hadolint") is None, reason="hadolint not installed")
def test_hadolint():
    out = subprocess.run(["hadolint", str(DOCKERFILE)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
