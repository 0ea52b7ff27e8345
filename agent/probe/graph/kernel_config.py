"""The MINDSPORE_DUMP_CONFIG rankscope writes so compiled code is watched kernel by kernel.

MindSpore reads the file named by ``MINDSPORE_DUMP_CONFIG`` when it compiles its first
graph (checked on 2.10: setting it after ``import mindspore``, ``set_context`` and
``init()`` but before the first compile works). So rankscope writes it from the compile
hook, just before that first compile, and only when something is compiled: a PyNative
job never gets a dump config.

A dump config the user already set wins as a whole (their path, their kernels, their
files kept): rankscope reads what it writes and deletes nothing. CPU builds can only
write tensors (``saved_data: "statistic"`` is GPU/Ascend only), so on CPU rankscope
dumps a few kernel types by default -- the gradient AllReduce (local and reduced
gradients), MatMul and Conv2D (where a bad input first meets the weights: in a conv net
a NaN in the batch can be squashed by ReLU before any MatMul and show again only in the
gradients) -- and reads, then deletes, each finished iteration's files. ``cluster.graph_kernels: "all"`` dumps every
kernel; a list of op types chooses them; ``"off"`` dumps nothing.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV = "MINDSPORE_DUMP_CONFIG"
DEFAULT_KERNELS = ("AllReduce", "MatMul", "Conv2D")
NET_NAME = "rankscope"
#: What MindSpore accepts in a dump path ("Dump path only support alphabets, digit or
#: {'-', '_', '/'}"): anything else fails the script's first compile.
_DUMP_PATH = re.compile(r"[A-Za-z0-9_\-/]+")


@dataclass
class KernelDump:
    """Where the kernel dump lands and whose it is."""

    root: Path
    own: bool  # rankscope's: delete files once read
    saved_data: str  # "tensor" | "statistic" | "full"
    kernels: str  # how the line describes the selection

    def describe(self) -> str:
        who = "" if self.own else "; your MINDSPORE_DUMP_CONFIG, files kept"
        return f"{self.kernels}{who}"


def settings_of(choice: Any) -> tuple[int, list[str], str]:
    """(dump_mode, kernels, description) for ``cluster.graph_kernels``."""
    if choice == "all":
        return 0, [], "every kernel"
    kernels = list(DEFAULT_KERNELS) if choice in (None, "default") else [str(k) for k in choice]
    return 1, kernels, "kernels " + "+".join(kernels)


def install(dump_root: Path, choice: Any, device_target: str, env: dict | None = None) -> KernelDump | None:
    """Point MindSpore at a dump config (ours, or the user's) and say where files land.
    None when kernels are off. Raises OSError/ValueError with the reason on failure."""
    env = os.environ if env is None else env
    if choice == "off":
        return None
    user = env.get(ENV)
    if user:
        return _users(Path(user))
    mode, kernels, text = settings_of(choice)
    root = scratch_root(Path(dump_root))
    root.mkdir(parents=True, exist_ok=True)
    saved = "tensor" if device_target == "CPU" else "statistic"
    cfg = {
        "common_dump_settings": {
            "op_debug_mode": 0, "dump_mode": mode, "path": str(root), "net_name": NET_NAME,
            "iteration": "all", "saved_data": saved, "input_output": 0, "kernels": kernels,
            "support_device": [0, 1, 2, 3, 4, 5, 6, 7],
        },
        "e2e_dump_settings": {"enable": True, "trans_flag": True},
    }
    if saved == "statistic":
        cfg["common_dump_settings"]["statistic_category"] = ["max", "min", "avg", "l2norm", "nan count",
                                                             "negative inf count", "positive inf count"]
    path = root / "mindspore_dump_config.json"
    path.write_text(json.dumps(cfg, indent=1))
    env[ENV] = str(path)
    return KernelDump(root, True, saved, text)


def scratch_root(dump_root: Path) -> Path:
    """Where this process's kernel files land: beside its local dump, or, when that path has
    a character MindSpore's dump refuses (a "first.last" home, a "run.v2" export folder),
    under the temp folder. ValueError when neither is a path MindSpore takes."""
    name = f"kernels_{os.getpid()}"
    here, there = Path(dump_root).absolute() / name, Path(tempfile.gettempdir()).absolute() / "rankscope-kernels" / name
    for root in (here, there):
        if _DUMP_PATH.fullmatch(str(root)):
            return root
    raise ValueError(f"MindSpore's kernel dump takes only letters, digits, '-', '_' and '/' in its path, and "
                     f"neither {here} nor {there} is one")


def _users(path: Path) -> KernelDump:
    cfg = json.loads(path.read_text())
    common = cfg.get("common_dump_settings") or {}
    root = common.get("path")
    if not isinstance(root, str) or not root:
        raise ValueError(f"{ENV}={path}: common_dump_settings.path is missing")
    kernels = "every kernel" if common.get("dump_mode", 0) == 0 else \
        "kernels " + "+".join(str(k) for k in common.get("kernels") or [])
    return KernelDump(Path(root), False, str(common.get("saved_data", "tensor")), kernels)
