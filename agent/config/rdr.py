"""Resolve the RDR settings from config.json's ``"rdr"`` section and ``MS_RDR_*`` env vars.

Per seeds/000: ``enable`` / ``mode`` (1 = export on abnormal end, 2 = also on normal
end) / ``path`` (absolute only), and "user-set configuration files take precedence over
environment variables". Precedence is per field: a config section that only sets
``mode`` still picks ``MS_RDR_PATH`` up from the environment, which is what a user who
exports the path once for a whole cluster expects.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

from rankscope.config.errors import ConfigError

MODES = (1, 2)
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


@dataclass(frozen=True)
class RdrSettings:
    """``path`` is None only when RDR is disabled; when enabled it is absolute."""

    enable: bool = False
    mode: int = 1
    path: str | None = None


def resolve_rdr(section: Mapping[str, Any] | None, env: Mapping[str, str] = os.environ) -> RdrSettings:
    """Merge the config section over the env vars; raise ConfigError naming the bad field.

    An enabled recorder with no path anywhere gets ``<cwd>/rdr`` (MindSpore's RDR also
    had a default directory); the chosen path is absolute so a later ``chdir`` in the
    training script cannot move the bundle.
    """
    section = dict(section or {})
    unknown = sorted(set(section) - {"enable", "mode", "path"})
    if unknown:
        raise ConfigError(f"rdr.{unknown[0]}", section[unknown[0]], "unknown field (expected enable, mode, path)")

    if "enable" in section:
        enable = section["enable"]
        if not isinstance(enable, bool):
            raise ConfigError("rdr.enable", enable, "expected true or false")
    else:
        enable = _env_bool(env, "MS_RDR_ENABLE")

    if "mode" in section:
        mode = section["mode"]
        if isinstance(mode, bool) or mode not in MODES:
            raise ConfigError("rdr.mode", mode, "expected 1 (abnormal end) or 2 (also normal end)")
    else:
        raw = env.get("MS_RDR_MODE")
        if raw is None or raw.strip() == "":
            mode = 1
        elif raw.strip() in ("1", "2"):
            mode = int(raw.strip())
        else:
            raise ConfigError("MS_RDR_MODE", raw, "expected 1 (abnormal end) or 2 (also normal end)")

    if "path" in section:
        path, field = section["path"], "rdr.path"
    else:
        path, field = env.get("MS_RDR_PATH") or None, "MS_RDR_PATH"
    if path is not None and (not isinstance(path, str) or not os.path.isabs(path)):
        raise ConfigError(field, path, "only an absolute path is supported")
    if not enable:
        return RdrSettings(enable=False, mode=mode, path=path)
    return RdrSettings(enable=True, mode=mode, path=os.path.normpath(path or os.path.join(os.getcwd(), "rdr")))


def _env_bool(env: Mapping[str, str], name: str) -> bool:
    raw = env.get(name)
    if raw is None:
        return False
    val = raw.strip().lower()
    if val in _TRUE:
        return True
    if val in _FALSE:
        return False
    raise ConfigError(name, raw, "expected 1 or 0 (true/false)")
