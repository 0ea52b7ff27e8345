"""What a bundle records about the process: stacks, versions, environment, memory, graphs.

Each function returns plain JSON-able data (or text) and never raises: a bundle written
while the process is dying must not fail because, say, /proc is missing.
"""
from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import resource
import sys
import threading
import traceback
from pathlib import Path
from typing import Iterator, Mapping

#: Variables whose *name* contains one of these have their value withheld.
SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "PRIVATE")
FILTERED = "<filtered>"
_PACKAGES = ("rankscope", "mindspore", "numpy", "msgpack", "pyzmq", "ray", "mindstudio-probe")
_GRAPH_SUFFIXES = (".ir", ".dot", ".dat")
_GRAPH_MAX_FILES = 500
_GRAPH_MAX_BYTES = 256 * 1024 * 1024


def is_secret(name: str) -> bool:
    upper = name.upper()
    return any(m in upper for m in SECRET_MARKERS)


def environment(env: Mapping[str, str] | None = None) -> dict:
    env = os.environ if env is None else env
    values = {k: (FILTERED if is_secret(k) else v) for k, v in sorted(env.items())}
    return {"variables": values, "filtered": sorted(k for k in env if is_secret(k)),
            "filter_rule": f"value withheld when the name contains any of {list(SECRET_MARKERS)}"}


def thread_stacks() -> str:
    """Every thread's Python stack, the way faulthandler prints them but with names."""
    names = {t.ident: (t.name, t.daemon) for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        name, daemon = names.get(ident, ("<unknown>", None))
        parts.append(f"Thread {name} (ident {ident}, daemon={daemon}):\n"
                     + "".join(traceback.format_stack(frame)))
    return "\n".join(parts)


def format_exception(exc: BaseException | str | None) -> str | None:
    if exc is None:
        return None
    if isinstance(exc, BaseException):
        return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return str(exc)


def versions() -> dict:
    pkgs = {}
    for name in _PACKAGES:
        try:
            pkgs[name] = importlib.metadata.version(name)
        except Exception:
            pkgs[name] = None
    out = {"python": sys.version, "implementation": platform.python_implementation(),
           "platform": platform.platform(), "executable": sys.executable, "packages": pkgs}
    ms = sys.modules.get("mindspore")  # only if already imported: never import it from a crash path
    if ms is not None:
        out["mindspore_runtime"] = getattr(ms, "__version__", None)
    return out


def observed_seeds(env: Mapping[str, str] | None = None) -> dict:
    """The seeds visible from outside, for when the probe did not pass the ones it set."""
    env = os.environ if env is None else env
    out: dict = {"source": "observed in the process (the probe passed no seeds)",
                 "PYTHONHASHSEED": env.get("PYTHONHASHSEED"),
                 "HCCL_DETERMINISTIC": env.get("HCCL_DETERMINISTIC")}
    ms = sys.modules.get("mindspore")
    if ms is not None:
        try:
            out["mindspore_global_seed"] = ms.get_seed()
        except Exception as exc:  # noqa: BLE001 - a crash path must not fail on this
            out["mindspore_global_seed"] = f"unavailable: {exc}"
    return out


def _proc_fields(path: str, keys: tuple[str, ...]) -> dict:
    out = {}
    try:
        with open(path) as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in keys:
                    out[key] = rest.strip()
    except OSError:
        pass
    return out


def memory() -> dict:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "process": _proc_fields("/proc/self/status", ("VmPeak", "VmSize", "VmHWM", "VmRSS", "VmSwap", "Threads")),
        "max_rss_kb": usage.ru_maxrss,
        "host": _proc_fields("/proc/meminfo", ("MemTotal", "MemFree", "MemAvailable", "SwapTotal", "SwapFree")),
    }


def graph_files(env: Mapping[str, str] | None = None) -> Iterator[tuple[Path, str]]:
    """(source, name in bundle) for MindSpore IR files when MS_DEV_SAVE_GRAPHS is on.

    Bounded (file count, bytes, walk depth): the default graph path is the working
    directory, which may be a large checkout.
    """
    env = os.environ if env is None else env
    flag = env.get("MS_DEV_SAVE_GRAPHS", "").strip()
    if flag in ("", "0", "false", "False"):
        return
    src = Path(env.get("MS_DEV_SAVE_GRAPHS_PATH") or os.getcwd())
    count = total = 0
    base_depth = len(src.parts)
    for dirpath, dirnames, filenames in os.walk(src):
        if len(Path(dirpath).parts) - base_depth >= 4:
            dirnames[:] = []
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d != "rdr"]
        for fn in sorted(filenames):
            if not fn.endswith(_GRAPH_SUFFIXES):
                continue
            path = Path(dirpath, fn)
            try:
                size = path.stat().st_size
            except OSError:
                continue
            if count >= _GRAPH_MAX_FILES or total + size > _GRAPH_MAX_BYTES:
                return
            count, total = count + 1, total + size
            rel = path.relative_to(src).as_posix()
            yield path, "graphs/" + re.sub(r"[^A-Za-z0-9_.\-/]", "_", rel)
