"""Installing rankscope as a library: the rank side into a training environment that
already has its own MindSpore build must keep that build and bring no Ray.

Offline and small: rankscope's real wheel is built from this checkout, and every other
distribution is a stand-in wheel of the right name and version made here, served from a
local folder (``--no-index``), so nothing is downloaded.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from repo_paths import REPO

pytestmark = pytest.mark.timeout(300)

USERS_MINDSPORE = "2.7.0"  # another 2.x than the one the tests run against
STAND_INS = {"mindspore": USERS_MINDSPORE, "numpy": "1.26.0", "pyzmq": "26.0.0", "msgpack": "1.1.0",
             "jsonschema": "4.23.0", "xxhash": "3.5.0",
             "ray": "2.50.0", "matplotlib": "3.9.0"}


def stand_in_wheel(folder: Path, name: str, version: str) -> Path:
    """A minimal valid wheel: a package that only knows its version."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"__version__ = {version!r}\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: rankscope-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{dist}/RECORD,,")
    whl = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
        z.writestr(f"{dist}/RECORD", "\n".join(record) + "\n")
    return whl


def pip(target: Path, *args: str, env: dict) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "pip", "--python", str(target), *args],
                         capture_output=True, text=True, env=env, timeout=240)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("install")
    src = tmp / "src"
    src.mkdir()
    for item in ("pyproject.toml", "README.md", "agent", "coordinator"):
        copy = shutil.copytree if (REPO / item).is_dir() else shutil.copy2
        copy(REPO / item, src / item, **({"ignore": shutil.ignore_patterns("__pycache__")}
                                          if (REPO / item).is_dir() else {}))
    wh = tmp / "wheels"
    wh.mkdir()
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(wh), str(src)], capture_output=True, text=True, timeout=240, env=pip_env())
    assert build.returncode == 0, build.stderr[-3000:]
    for name, version in STAND_INS.items():
        stand_in_wheel(wh, name, version)
    return wh


def pip_env() -> dict:
    # No machine or user pip configuration (extra indexes, find-links, constraints).
    return {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PIP_NO_INPUT": "1"}


def test_rank_side_install_keeps_the_users_mindspore_and_brings_no_ray(wheelhouse, tmp_path):
    env = pip_env()
    venv = tmp_path / "training-env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    local = ("--no-index", "--find-links", str(wheelhouse))
    pip(python, "install", *local, f"mindspore=={USERS_MINDSPORE}", env=env)  # the user's own build
    pip(python, "install", *local, "rankscope", env=env)
    installed = {d["name"].lower(): d["version"]
                 for d in json.loads(pip(python, "list", "--format", "json", env=env).stdout)}
    assert installed.get("rankscope") == "0.1.0", installed
    assert installed["mindspore"] == USERS_MINDSPORE, installed
    assert "ray" not in installed, installed  # the rank side never imports Ray
    # The coordinator host asks for Ray by name.
    report = tmp_path / "report.json"
    pip(python, "install", "--dry-run", "--report", str(report), *local, "rankscope[coordinator]", env=env)
    wanted = {i["metadata"]["name"].lower() for i in json.loads(report.read_text())["install"]}
    assert {"ray", "matplotlib"} <= wanted and "mindspore" not in wanted, wanted


def test_the_wheel_carries_the_pages_assets(wheelhouse):
    """The console and the report are served from the installed package (no CDN): a
    missing asset would be a blank page on an air-gapped cluster."""
    [whl] = wheelhouse.glob("rankscope-*.whl")
    names = set(zipfile.ZipFile(whl).namelist())
    for asset in ("rankscope/coordinator/console/static/index.html", "rankscope/coordinator/console/static/console.js",
                  "rankscope/coordinator/console/static/console.css", "rankscope/coordinator/report/template.html"):
        assert asset in names, sorted(n for n in names if "static" in n or "report/" in n)
