"""Field checks shared by every config section: each raises ConfigError naming the field."""
from __future__ import annotations

import math
from typing import Any, Iterable

from rankscope.config.errors import ConfigError


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def typed(fld: str, val: Any, typ: type) -> Any:
    if not isinstance(val, typ) or (typ is not bool and isinstance(val, bool)):
        raise ConfigError(fld, val, f"expected a {typ.__name__}")
    return val


def positive_int(fld: str, val: Any) -> int:
    if not is_int(val) or val < 1:
        raise ConfigError(fld, val, "expected an integer >= 1")
    return val


def positive_float(fld: str, val: Any) -> float:
    if isinstance(val, bool) or not isinstance(val, (int, float)) or not math.isfinite(val) or val <= 0:
        raise ConfigError(fld, val, "expected a positive number")
    return float(val)


def choice(fld: str, val: Any, choices: Iterable[Any]) -> Any:
    choices = tuple(choices)
    if isinstance(val, bool) or val not in choices:
        raise ConfigError(fld, val, f"expected one of {list(choices)}")
    return val


def str_list(fld: str, val: Any) -> list[str]:
    if val is None:
        return []
    if not isinstance(val, list) or not all(isinstance(x, str) for x in val):
        raise ConfigError(fld, val, "expected a list of strings")
    return list(val)


def known_keys(fld: str, section: Any, allowed: Iterable[str]) -> dict:
    """``section`` must be a JSON object whose keys are all in ``allowed``."""
    if not isinstance(section, dict):
        raise ConfigError(fld or "config", section, "expected a JSON object")
    allowed = frozenset(allowed)
    for key in section:
        if key not in allowed:
            where = f"{fld}.{key}" if fld else str(key)
            from rankscope.config.schema import unknown_field
            raise ConfigError(where, section[key], unknown_field(str(key), allowed))
    return section
