"""Reading config.json from disk, for every process that takes ``--config``."""
from __future__ import annotations

import json
import os
from pathlib import Path

from rankscope.config.errors import ConfigError


def read_config_file(config_path: str | os.PathLike) -> dict:
    """The file's top-level object; ConfigError("config_path", ...) saying why not."""
    path = Path(config_path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError("config_path", str(config_path), f"cannot read: {exc.strerror or exc}") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError("config_path", str(config_path),
                          f"not valid JSON (line {exc.lineno} column {exc.colno}: {exc.msg})") from None
    if not isinstance(raw, dict):
        raise ConfigError("config_path", str(config_path), "top level must be a JSON object")
    return raw
