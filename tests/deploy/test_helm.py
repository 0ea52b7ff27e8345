"""The Helm chart lints strictly, renders with Helm's own Go SDK (helm-python-sdk, no helm
binary, no cluster), and every object it renders is valid Kubernetes 1.30
(kubernetes-validate); the RayCluster custom resource is checked against the ray.io/v1
fields KubeRay documents, its pod templates against the core PodTemplateSpec schema.
One test per values combination that matters, and bad values must fail at install."""
from __future__ import annotations

import base64
import os
import re
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml
from repo_paths import REPO

CHART = REPO / "helm" / "rankscope"
KUBE = "1.30"
RELEASE, NAMESPACE = "rs", "ml"
FULLNAME = "rs-rankscope"

# Cert files in zmq.auth's format, as `rankscope keys` writes them (keys are dummies:
# the chart only carries the text).
PUB = 'metadata\ncurve\n    public-key = "{k}"\n'
SEC = 'metadata\ncurve\n    public-key = "{k}"\n    secret-key = "{s}"\n'
KEYS = {
    "coordinatorPublic": PUB.format(k="C" * 40),
    "coordinatorSecret": SEC.format(k="C" * 40, s="c" * 40),
    "agentPublic": PUB.format(k="A" * 40),
    "agentSecret": SEC.format(k="A" * 40, s="a" * 40),
}

# The values combinations a user will actually install.
COMBOS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "curve-created": {"curve": {"create": True, "keys": KEYS}},
    "existing-secret": {"curve": {"existingSecret": "team-curve-keys"}},
    "hostpid": {"agent": {"hostPID": True}},
    "scheduling": {"agent": {
        "nodeSelector": {"accelerator": "ascend-910b"},
        "tolerations": [{"key": "huawei.com/Ascend910", "operator": "Exists", "effect": "NoSchedule"}],
        "priorityClassName": "system-node-critical"}},
    "no-persistence": {"exports": {"persistence": {"enabled": False},
                                   "volume": {"nfs": {"server": "nfs.example", "path": "/rankscope"}}}},
    "existing-claim": {"exports": {"persistence": {"existingClaim": "evidence"}}},
    "workers-nodeport": {"ray": {"workerGroups": [{"groupName": "cpu", "replicas": 2, "maxReplicas": 4,
                                                   "resources": {"requests": {"cpu": "2"}}}]},
                         "coordinator": {"service": {"type": "NodePort", "nodePort": 30555}}},
    "agents-off": {"agent": {"enabled": False}, "ray": {"head": {"rayStartParams": {"dashboard-host": None}}}},
    "prepared-hosts": {"agent": {"prepareHostDirs": False}},
}

# ---- KubeRay's RayCluster (ray.io/v1), from raycluster_types.go: the fields it documents,
# nothing else (a typo'd field would be silently dropped by the API server).
_STRMAP = {"type": "object", "additionalProperties": {"type": "string"}}
_INT32 = {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}
RAYCLUSTER_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "ray.io/v1"},
        "kind": {"const": "RayCluster"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object", "additionalProperties": False, "required": ["headGroupSpec"],
            "properties": {
                "rayVersion": {"type": "string"},
                "enableInTreeAutoscaling": {"type": "boolean"},
                "autoscalerOptions": {"type": "object"},
                "headServiceAnnotations": _STRMAP,
                "suspend": {"type": "boolean"},
                "headGroupSpec": {
                    "type": "object", "additionalProperties": False, "required": ["template"],
                    "properties": {
                        "serviceType": {"enum": ["ClusterIP", "NodePort", "LoadBalancer"]},
                        "headService": {"type": "object"},
                        "enableIngress": {"type": "boolean"},
                        "rayStartParams": _STRMAP,
                        "template": {"type": "object"},
                    }},
                "workerGroupSpecs": {"type": "array", "items": {
                    "type": "object", "additionalProperties": False,
                    "required": ["groupName", "template"],
                    "properties": {
                        "groupName": {"type": "string", "minLength": 1},
                        "replicas": _INT32, "minReplicas": _INT32, "maxReplicas": _INT32,
                        "numOfHosts": _INT32, "rayStartParams": _STRMAP,
                        "template": {"type": "object"}, "scaleStrategy": {"type": "object"},
                    }}},
            }},
    },
}


def validate_raycluster(obj: dict) -> None:
    jsonschema.validate(obj, RAYCLUSTER_SCHEMA)
    spec = obj["spec"]
    templates = [spec["headGroupSpec"]["template"]] + [w["template"] for w in spec.get("workerGroupSpecs", [])]
    for template in templates:
        # A pod template is core Kubernetes: wrap it as a PodTemplate for the 1.30 schema.
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate",
                                      "metadata": {"name": "t"}, "template": template}, KUBE, strict=True)
        # KubeRay starts Ray in the first container.
        assert template["spec"]["containers"][0]["name"].startswith("ray-")
    for w in spec.get("workerGroupSpecs", []):
        assert w["minReplicas"] <= w["replicas"] <= w["maxReplicas"], w


def validate_object(obj: dict) -> None:
    if obj["apiVersion"] == "ray.io/v1":
        validate_raycluster(obj)
    else:
        kubernetes_validate.validate(obj, KUBE, strict=True)


# ---- rendering -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def chart():
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def render(chart, values: dict | None = None) -> tuple[dict[str, dict], str]:
    """{"Kind/name": object} and the NOTES text."""
    manifests = chart.render(values or {}, name=RELEASE, namespace=NAMESPACE, is_install=True)
    objects: dict[str, dict] = {}
    notes = ""
    for path, text in manifests.items():
        if path.endswith("NOTES.txt"):
            notes = text
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                objects[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return objects, notes


def daemonset(objs: dict) -> dict:
    return objs[f"DaemonSet/{FULLNAME}-agent"]


def head_pod(objs: dict) -> dict:
    return objs[f"RayCluster/{FULLNAME}"]["spec"]["headGroupSpec"]["template"]["spec"]


def container(pod_spec: dict, name: str) -> dict:
    return next(c for c in pod_spec["containers"] if c["name"] == name)


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def volume(pod_spec: dict, name: str) -> dict:
    return next(v for v in pod_spec["volumes"] if v["name"] == name)


# ---- lint + validate every combination -------------------------------------------------------

@pytest.mark.parametrize("combo", COMBOS)
def test_lint_strict(combo):
    report = helm.lint(CHART, COMBOS[combo], strict=True, kube_version=f"v{KUBE}.0",
                       namespace=NAMESPACE)
    problems = [m for m in report["messages"] if m["severity"] >= 2]  # warning or error
    assert not problems and not report["errors"], report


@pytest.mark.parametrize("combo", COMBOS)
def test_renders_valid_kubernetes(chart, combo):
    objs, notes = render(chart, COMBOS[combo])
    assert f"RayCluster/{FULLNAME}" in objs and f"Service/{FULLNAME}-coordinator" in objs
    for key, obj in objs.items():
        try:
            validate_object(obj)
        except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as exc:
            pytest.fail(f"{key} ({combo}) is not valid Kubernetes {KUBE}: {exc.message}")
    assert notes.strip()


# ---- what the defaults promise -----------------------------------------------------------------

def test_defaults_agent_is_least_privileged(chart):
    objs, _ = render(chart)
    pod = daemonset(objs)["spec"]["template"]["spec"]
    agent = container(pod, "agent")
    assert not pod.get("hostPID") and not pod.get("hostNetwork") and not pod.get("hostIPC")
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] > 0
    sc = agent["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
    assert not sc.get("privileged") and "add" not in sc["capabilities"]
    # The only root step is the host-dir preparation, and it gets CHOWN/FOWNER only.
    init = pod["initContainers"][0]["securityContext"]
    assert init["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN", "FOWNER"]}
    assert init["allowPrivilegeEscalation"] is False
    assert agent["resources"]["requests"] and agent["resources"]["limits"]
    assert agent["readinessProbe"]["exec"]["command"] == ["test", "-S", "/run/rankscope/agent.sock"]
    assert agent["livenessProbe"]["exec"]["command"] == ["test", "-S", "/run/rankscope/agent.sock"]
    node_name = next(e for e in agent["env"] if e["name"] == "NODE_NAME")
    assert node_name["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_defaults_wire_agents_to_the_coordinator(chart):
    objs, _ = render(chart)
    pod = daemonset(objs)["spec"]["template"]["spec"]
    args = container(pod, "agent")["args"]
    service = objs[f"Service/{FULLNAME}-coordinator"]
    port = service["spec"]["ports"][0]
    assert flag(args, "--coordinator") == f"tcp://{FULLNAME}-coordinator.{NAMESPACE}.svc:{port['port']}"
    assert flag(args, "--listen") == "ipc:///run/rankscope/agent.sock"
    # The Service reaches the head pod by KubeRay's labels, on a port the head declares.
    assert service["spec"]["selector"] == {"ray.io/cluster": FULLNAME, "ray.io/node-type": "head"}
    head = head_pod(objs)
    ray_head = container(head, "ray-head")
    assert port["targetPort"] in {p["name"] for p in ray_head["ports"]}
    coord_args = container(head, "coordinator")["args"]
    assert flag(coord_args, "--bind") == f"tcp://0.0.0.0:{port['port']}"
    # The socket directory is the same host path the training pods are told to mount.
    socket_vol = volume(pod, "socket-dir")
    assert socket_vol["hostPath"]["path"] == "/run/rankscope"
    # Exports: a PVC, mounted where the coordinator is told to export.
    pvc = objs[f"PersistentVolumeClaim/{FULLNAME}-exports"]
    assert volume(head, "exports")["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    mounts = {m["name"]: m["mountPath"] for m in ray_head["volumeMounts"]}
    assert mounts["exports"] == flag(coord_args, "--export-dir")


def test_agents_never_get_the_coordinator_secret_key(chart):
    objs, _ = render(chart)
    agent_items = {i["key"] for i in volume(daemonset(objs)["spec"]["template"]["spec"], "curve")["secret"]["items"]}
    assert agent_items == {"agent.key", "agent.key_secret", "coordinator.key"}
    head_items = {i["path"] for i in volume(head_pod(objs), "curve")["secret"]["items"]}
    assert "agent.key_secret" not in head_items and "allowed/agent.key" in head_items


# ---- one test per values combination ---------------------------------------------------------

def test_curve_secret_created_by_chart(chart):
    objs, notes = render(chart, COMBOS["curve-created"])
    secret = objs[f"Secret/{FULLNAME}-curve"]
    decoded = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert decoded == {"coordinator.key": KEYS["coordinatorPublic"], "coordinator.key_secret": KEYS["coordinatorSecret"],
                       "agent.key": KEYS["agentPublic"], "agent.key_secret": KEYS["agentSecret"]}
    assert volume(head_pod(objs), "curve")["secret"]["secretName"] == f"{FULLNAME}-curve"
    assert volume(daemonset(objs)["spec"]["template"]["spec"], "curve")["secret"]["secretName"] == f"{FULLNAME}-curve"
    assert f"{FULLNAME}-curve" in notes


def test_existing_secret_is_used_not_created(chart):
    objs, _ = render(chart, COMBOS["existing-secret"])
    assert not [k for k in objs if k.startswith("Secret/")]
    assert volume(head_pod(objs), "curve")["secret"]["secretName"] == "team-curve-keys"
    assert volume(daemonset(objs)["spec"]["template"]["spec"], "curve")["secret"]["secretName"] == "team-curve-keys"


def test_hostpid_only_when_asked(chart):
    on, _ = render(chart, COMBOS["hostpid"])
    off, _ = render(chart)
    assert daemonset(on)["spec"]["template"]["spec"]["hostPID"] is True
    assert "hostPID" not in daemonset(off)["spec"]["template"]["spec"]
    # hostPID never brings other privileges with it.
    agent = container(daemonset(on)["spec"]["template"]["spec"], "agent")
    assert agent["securityContext"]["capabilities"]["drop"] == ["ALL"]


def test_custom_node_selector_and_tolerations(chart):
    values = COMBOS["scheduling"]["agent"]
    objs, _ = render(chart, COMBOS["scheduling"])
    pod = daemonset(objs)["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == values["nodeSelector"]
    assert pod["tolerations"] == values["tolerations"]
    assert pod["priorityClassName"] == values["priorityClassName"]
    assert "nodeSelector" not in head_pod(objs)  # the head is scheduled independently


def test_exports_without_persistence_use_the_given_volume(chart):
    objs, notes = render(chart, COMBOS["no-persistence"])
    assert not [k for k in objs if k.startswith("PersistentVolumeClaim/")]
    assert volume(head_pod(objs), "exports")["nfs"] == {"server": "nfs.example", "path": "/rankscope"}
    assert "not persistent" in notes


def test_existing_claim_is_mounted_not_created(chart):
    objs, _ = render(chart, COMBOS["existing-claim"])
    assert not [k for k in objs if k.startswith("PersistentVolumeClaim/")]
    assert volume(head_pod(objs), "exports")["persistentVolumeClaim"]["claimName"] == "evidence"


def test_agents_off_renders_no_daemonset(chart):
    objs, notes = render(chart, COMBOS["agents-off"])
    assert not [k for k in objs if k.startswith(("DaemonSet/", "ServiceAccount/"))]
    assert objs[f"RayCluster/{FULLNAME}"]["spec"]["headGroupSpec"]["rayStartParams"] == {}
    assert "rankscope agent" in notes


def test_notes_tell_training_pods_how_to_reach_the_agent(chart):
    _, notes = render(chart, {"agent": {"socketDir": "/var/run/rs", "socketGroup": 4242}, "job": "llm-7b"})
    assert "RANKSCOPE_AGENT" in notes and "ipc:///var/run/rs/agent.sock" in notes
    assert "path: /var/run/rs" in notes and "supplementalGroups: [4242]" in notes
    assert 'value: "llm-7b"' in notes


# ---- bad values fail at install ---------------------------------------------------------------

BAD_VALUES = {
    "hostPID not a bool": ({"agent": {"hostPID": "yes"}}, "/agent/hostPID"),
    "port out of range": ({"coordinator": {"port": 70000}}, "/coordinator/port"),
    "unknown divergence action": ({"coordinator": {"onDivergence": "explode"}}, "/coordinator/onDivergence"),
    "typo'd key": ({"agnet": {"enabled": True}}, "agnet"),
    "root agent": ({"agent": {"podSecurityContext": {"runAsNonRoot": False}}}, "/agent/podSecurityContext/runAsNonRoot"),
    "privileged agent": ({"agent": {"securityContext": {"privileged": True}}}, "/agent/securityContext/privileged"),
    "chart secret without keys": ({"curve": {"create": True}}, "/curve/keys"),
    "no secret at all": ({"curve": {"existingSecret": ""}}, "/curve/existingSecret"),
    "relative socket dir": ({"agent": {"socketDir": "run/rankscope"}}, "/agent/socketDir"),
    "non-string ray param": ({"ray": {"head": {"rayStartParams": {"num-cpus": 4}}}}, "/ray/head/rayStartParams/num-cpus"),
    "bad toleration effect": ({"agent": {"tolerations": [{"key": "k", "effect": "Sometimes"}]}}, "/agent/tolerations/0/effect"),
}


@pytest.mark.parametrize("case", BAD_VALUES)
def test_bad_values_rejected_by_schema(chart, case):
    values, field = BAD_VALUES[case]
    with pytest.raises(helm.HelmValuesError) as schema_err:
        chart.validate_schema(values)
    assert field in str(schema_err.value)
    # Rendering (what `helm install` does) refuses them too.
    with pytest.raises(helm.HelmValuesError):
        chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)


# ---- values are documented ---------------------------------------------------------------------

def _schema_paths(schema: dict, prefix: tuple = ()) -> set[tuple]:
    """Chart-defined keys: those the schema lists under "properties" (Kubernetes-native
    blocks like resources or securityContext are typed as plain objects and not walked)."""
    paths = set()
    for key, sub in schema.get("properties", {}).items():
        if key == "global":
            continue
        paths.add(prefix + (key,))
        if sub.get("type") == "object" and "properties" in sub and sub.get("additionalProperties") is False:
            paths |= _schema_paths(sub, prefix + (key,))
    return paths


def test_every_chart_value_is_documented(chart):
    lines = (CHART / "values.yaml").read_text().splitlines()
    documented: set[tuple] = set()
    stack: list[tuple[int, str]] = []
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)([A-Za-z][\w.-]*):", line)
        if not m:
            continue
        indent = len(m.group(1))
        stack = [(ind, key) for ind, key in stack if ind < indent] + [(indent, m.group(2))]
        prev = next((p for p in reversed(lines[:i]) if p.strip()), "")
        if prev.strip().startswith("#"):
            documented.add(tuple(key for _, key in stack))
    # A key is documented by a comment right above it, or (for the fields of a small
    # documented block such as resources or probe timings) right above its parent.
    required = _schema_paths(chart.schema)
    undocumented = sorted(".".join(p) for p in required
                          if p not in documented and p[:-1] not in documented)
    assert not undocumented, f"values.yaml keys without a comment above them: {undocumented}"
    # ... and every documented chart value is one the schema checks.
    defaults = chart.values

    def leaves(d: dict, prefix: tuple = ()) -> set[tuple]:
        return {prefix + (k,) for k in d}
    assert leaves(defaults) <= _schema_paths(chart.schema), "top-level values missing from the schema"


# ---- the chart's flags and key layout are the real CLIs' ----------------------------------------

def public_key(cert: Path) -> bytes:
    import zmq.auth
    return zmq.auth.load_certificate(str(cert))[0]


def _project_secret(volume_spec: dict, secret: dict, dest: Path) -> Path:
    """What the kubelet does with a secret volume's items: each key lands at its path."""
    for item in volume_spec["secret"]["items"]:
        target = dest / item["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(base64.b64decode(secret["data"][item["key"]]))
    return dest


def test_rendered_flags_and_keys_work_with_the_real_clis(chart, tmp_path):
    from rankscope.cli import agent as daemon_cli
    from rankscope.cli import keys as keys_cli
    from rankscope.coordinator.cli import coordinator as serve

    # Keys exactly as the docs say to make them, handed to the chart as with --set-file.
    keys = tmp_path / "keys"
    for name in ("coordinator", "agent"):
        assert keys_cli.main(["new", name, "--dir", str(keys)]) == 0
    values = {"curve": {"create": True, "keys": {
        "coordinatorPublic": (keys / "coordinator.key").read_text(),
        "coordinatorSecret": (keys / "coordinator.key_secret").read_text(),
        "agentPublic": (keys / "agent.key").read_text(),
        "agentSecret": (keys / "agent.key_secret").read_text()}}}
    objs, _ = render(chart, values)
    secret = objs[f"Secret/{FULLNAME}-curve"]
    mount = "/etc/rankscope/curve"

    # The agent container: its flags parse, and its projected keys load as CURVE client keys.
    pod = daemonset(objs)["spec"]["template"]["spec"]
    agent_dir = _project_secret(volume(pod, "curve"), secret, tmp_path / "agent-pod")
    args = [a.replace(mount, str(agent_dir)).replace("$(NODE_NAME)", "node-1")
            for a in container(pod, "agent")["args"]]
    settings = daemon_cli.settings_from_args(daemon_cli.build_parser().parse_args(args))
    assert settings.coordinator_curve.server_public == public_key(keys / "coordinator.key")
    assert settings.host == "node-1" and str(settings.spool_dir).startswith("/var/lib/rankscope/")

    # The coordinator sidecar: its flags parse, and the allowlist it gets admits the agent.
    head = head_pod(objs)
    head_dir = _project_secret(volume(head, "curve"), secret, tmp_path / "head-pod")
    cargs = serve.build_parser().parse_args(
        [a.replace(mount, str(head_dir)) for a in container(head, "coordinator")["args"]])
    curve = serve.curve_keys(cargs.curve_secret, cargs.allow_dir)
    admitted = {public_key(f) for f in Path(curve["allow_dir"]).glob("*.key")}
    assert admitted == {settings.coordinator_curve.public}
    assert cargs.on_divergence == "pause" and cargs.job == "default"


def _all_containers(objs: dict) -> list[dict]:
    pods = [daemonset(objs)["spec"]["template"]["spec"], head_pod(objs)]
    return [c for pod in pods for c in pod.get("initContainers", []) + pod["containers"]]


def test_rendered_scripts_and_probes_parse(chart, tmp_path):
    import shutil
    import subprocess
    objs, _ = render(chart)
    scripts = [c["command"][2] for c in _all_containers(objs)
               if c.get("command", [])[:2] == ["/bin/sh", "-c"]]
    assert len(scripts) == 3  # coordinator sidecar, agent, host-dir preparation
    for i, script in enumerate(scripts):
        path = tmp_path / f"script{i}.sh"
        path.write_text(script)
        out = subprocess.run(["sh", "-n", str(path)], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        if shutil.which("shellcheck"):
            out = subprocess.run(["shellcheck", "--shell=sh", str(path)], capture_output=True, text=True)
            assert out.returncode == 0, script + out.stdout
    probes = [c[kind]["exec"]["command"] for c in _all_containers(objs)
              for kind in ("readinessProbe", "livenessProbe") if "exec" in c.get(kind, {})]
    python_probes = [p[2] for p in probes if p[:2] == ["python3", "-c"]]
    assert python_probes
    for code in python_probes:
        compile(code, "probe", "exec")


# ---- the rendered containers, run for real on this machine ---------------------------------------

class LocalPods:
    """The chart rendered with keys made by `rankscope keys new`, the Secret projected into
    each pod's key directory, and a map that moves the pods' host paths and cluster
    addresses onto this machine."""

    def __init__(self, chart, tmp_path: Path) -> None:
        from rankscope.cli import keys as keys_cli
        keys = tmp_path / "keys"
        for name in ("coordinator", "agent"):
            keys_cli.main(["new", name, "--dir", str(keys)])
        values = {"curve": {"create": True, "keys": {
            "coordinatorPublic": (keys / "coordinator.key").read_text(),
            "coordinatorSecret": (keys / "coordinator.key_secret").read_text(),
            "agentPublic": (keys / "agent.key").read_text(),
            "agentSecret": (keys / "agent.key_secret").read_text()}}}
        self.objs, _ = render(chart, values)
        secret = self.objs[f"Secret/{FULLNAME}-curve"]
        self.head = head_pod(self.objs)
        self.node = daemonset(self.objs)["spec"]["template"]["spec"]
        self.head_keys = _project_secret(volume(self.head, "curve"), secret, tmp_path / "head-keys")
        self.node_keys = _project_secret(volume(self.node, "curve"), secret, tmp_path / "node-keys")
        (tmp_path / "run").mkdir()
        self.socket = tmp_path / "run" / "agent.sock"
        self.tmp = tmp_path
        self.node_map = {"/run/rankscope": str(tmp_path / "run"), "/var/lib/rankscope": str(tmp_path / "state"),
                         "/etc/rankscope/curve": str(self.node_keys), "$(NODE_NAME)": "node-1"}

    def command(self, container_spec: dict, mapping: dict[str, str]) -> list[str]:
        def localise(arg: str) -> str:
            for k, v in mapping.items():
                arg = arg.replace(k, v)
            return arg
        return [localise(a) for a in container_spec["command"] + container_spec.get("args", [])]

    def env(self, container_spec: dict, mapping: dict[str, str]) -> dict[str, str]:
        import sys
        env = {e["name"]: self.command({"command": [e["value"]]}, mapping)[0]
               for e in container_spec.get("env", []) if "value" in e}
        env.update(PATH=f"{Path(sys.executable).parent}:/usr/bin:/bin", NODE_NAME="node-1",
                   HOME=str(self.tmp))
        if "RAY_AUTH_MODE" in os.environ:
            env["RAY_AUTH_MODE"] = os.environ["RAY_AUTH_MODE"]
        return env

    def start_agent(self, coordinator: str):
        import subprocess
        agent = container(self.node, "agent")
        mapping = {f"tcp://{FULLNAME}-coordinator.{NAMESPACE}.svc:5555": coordinator, **self.node_map}
        return subprocess.Popen(self.command(agent, mapping), env=self.env(agent, mapping),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def readiness(self) -> int:
        import subprocess
        probe = container(self.node, "agent")["readinessProbe"]["exec"]["command"]
        return subprocess.run(self.command({"command": probe}, self.node_map)).returncode


def _stop(proc) -> str:
    import subprocess
    if proc.poll() is None:
        proc.terminate()
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out or ""


def test_rendered_agent_container_runs_and_reaches_a_curve_coordinator(chart, tmp_path):
    """The DaemonSet's container command as rendered: the real agent starts, its socket
    is group-connectable only and passes the readiness probe, and it reaches a CURVE
    ROUTER that holds the head pod's projected keys and allowlist."""
    import zmq

    from rankscope.wire import protocol
    from rankscope.wire.transport import CurveKeys, bind_router, stop_authenticator

    pods = LocalPods(chart, tmp_path)
    ctx = zmq.Context()
    keys = CurveKeys.from_files(pods.head_keys / "coordinator.key_secret", allow_dir=pods.head_keys / "allowed")
    router, bound = bind_router(ctx, "tcp://127.0.0.1:0", keys)
    proc = pods.start_agent(bound)
    try:
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        status = None
        for _ in range(150):  # bounded: ~30 s on a loaded machine, normally the first 2 s
            if proc.poll() is not None:
                break
            if poller.poll(200):
                ident, frame = router.recv_multipart()
                msg = protocol.Decoder(job=None).decode(frame)
                if msg is not None and msg.type == protocol.STATUS:
                    status = (ident, msg)
                    break
        assert status is not None, f"no STATUS from the agent: rc={proc.poll()}"
        ident, msg = status
        assert ident.startswith(b"agent:node-1:") and msg.body["detail"]["host"] == "node-1"
        assert oct(pods.socket.stat().st_mode & 0o777) == "0o770"  # umask 007 in the command
        assert pods.readiness() == 0
    finally:
        out = _stop(proc)
        router.close(0)
        stop_authenticator(ctx)  # its ZAP socket would keep ctx.term() waiting
        ctx.term()
    assert proc.returncode == 0, out


@pytest.mark.ray
def test_rendered_head_sidecar_and_agent_run_together(chart, tmp_path, monkeypatch):
    """The head pod's coordinator sidecar script as rendered, against a real local Ray in
    place of the ray-head container: it waits for Ray, starts the coordinator actor bound
    with CURVE on all interfaces, exporting where the exports volume is mounted; the
    rendered agent then connects to it as a peer. SIGTERM stops both cleanly."""
    import socket as socketlib
    import subprocess
    import time

    import ray

    from rankscope.coordinator.server.actor import DEFAULT_NAME, DEFAULT_NAMESPACE

    pods = LocalPods(chart, tmp_path)
    # A fresh `ray start --head` in a pod has no token auth; a local ray.init() turns it on
    # when ~/.ray/auth_token exists, which the sidecar here (own HOME) would not have.
    # Ray keeps a process's auth mode, so a private Ray started in this pytest process after
    # this test would fail its GCS start: tests starting Ray in-process live under
    # tests/coordinator, which runs before tests/deploy.
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    with socketlib.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ray.init(num_cpus=2, include_dashboard=False, namespace=DEFAULT_NAMESPACE)
    sidecar = agent = None
    try:
        gcs = ray.get_runtime_context().gcs_address
        exports = tmp_path / "exports"
        head_map = {"127.0.0.1:6379": gcs, "0.0.0.0:5555": f"0.0.0.0:{port}",
                    "/var/lib/rankscope/exports": str(exports), "/etc/rankscope/curve": str(pods.head_keys)}
        spec = container(pods.head, "coordinator")
        sidecar = subprocess.Popen(pods.command(spec, head_map), env=pods.env(spec, head_map),
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        # The sidecar's readinessProbe: a TCP connect to the ZeroMQ port.
        deadline = time.monotonic() + 120
        while sidecar.poll() is None and time.monotonic() < deadline:
            try:
                socketlib.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.5)
        assert sidecar.poll() is None, _stop(sidecar)
        handle = ray.get_actor(DEFAULT_NAME, namespace=DEFAULT_NAMESPACE)
        assert ray.get(handle.endpoint.remote()).endswith(f":{port}")

        agent = pods.start_agent(f"tcp://127.0.0.1:{port}")
        peers = 0
        while agent.poll() is None and time.monotonic() < deadline and not peers:
            peers = ray.get(handle.status.remote(), timeout=30)["peers"]
            time.sleep(0.5)
        assert peers == 1, f"the agent never became a coordinator peer: {_stop(agent)}"
        assert pods.readiness() == 0
        assert exports.is_dir()
    finally:
        outputs = [_stop(p) for p in (agent, sidecar) if p is not None]
        ray.shutdown()
    assert agent.returncode == 0 and sidecar.returncode == 0, outputs
