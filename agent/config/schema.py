"""The JSON Schema of config.json's msProbe fields, and its errors as ConfigError.

Shapes, types, choices and unknown keys are checked by jsonschema against
:data:`MSPROBE_SCHEMA`; what a schema cannot say well stays in code (msProbe's
``"a-b"`` step/rank ranges; the ``cluster`` and ``rdr`` sections have their own modules).
A schema node's ``x-expected`` is the plain sentence a user reads when that node fails;
the first problem becomes one :class:`ConfigError` naming the field, the value and it.
"""
from __future__ import annotations

import difflib
from typing import Any, Iterable

from rankscope.config.errors import ConfigError

TASKS = ("statistics", "tensor")
#: msProbe's kernel level: the kernels of compiled code (GRAPH mode, ``ms.jit`` parts in
#: PyNative), read from MindSpore's kernel dump; eager code has no kernel record.
KERNEL_LEVEL = "L2"
LEVELS = ("L0", "L1", "mix", KERNEL_LEVEL, "debug")
SUMMARY_MODES = ("statistics", "md5")
DATA_MODES = ("all", "input", "output", "forward", "backward")

# Top-level keys msProbe understands but this probe does not act on: accepted so an
# msProbe config.json loads unchanged, ignored otherwise.
MSPROBE_IGNORED_TOP = frozenset({
    "extra_info", "async_dump", "precision", "dump_enable", "risk_level",
    "custom_op_namespaces", "load", "acc_check", "overflow_check", "free_benchmark",
    "run_ut", "grad_probe", "structure", "exception_dump", "diff_check", "nan_check",
})
# Task-section keys msProbe understands beyond the four we use.
TASK_IGNORED = frozenset({"slice", "request_id", "diff_nums", "device", "precision",
                          "tensor_list", "file_format", "online_run_ut", "nfs_path",
                          "host", "port", "error_data_path", "bench_path"})

_ANY: dict = {}
_STRINGS = {"type": ["array", "null"], "items": {"type": "string", "x-expected": "expected a string"},
            "x-expected": "expected a list of strings"}

_TASK_SECTION = {
    "type": ["object", "null"],
    "x-expected": "expected a JSON object",
    "properties": {
        "scope": {**_STRINGS, "if": {"type": "array", "minItems": 1},
                  "then": {"minItems": 2, "maxItems": 2,
                           "x-expected": "scope names a [start, end] pair: exactly 2 entries"}},
        "list": _STRINGS,
        "data_mode": {
            "type": ["array", "null"], "x-expected": f"expected a list of modes from {list(DATA_MODES)}",
            "items": {"enum": list(DATA_MODES), "x-expected": f"expected one of {list(DATA_MODES)}"},
            "if": {"type": "array", "contains": {"const": "all"}},
            "then": {"maxItems": 1, "x-expected": "'all' cannot be combined with other modes"},
        },
        "summary_mode": {"enum": [*SUMMARY_MODES, None], "x-expected": f"expected one of {list(SUMMARY_MODES)}"},
        **{key: _ANY for key in sorted(TASK_IGNORED)},
    },
    "additionalProperties": False,
}

#: config.json's msProbe part. ``rank``/``step`` (range strings), ``rdr`` and ``cluster``
#: are checked by their own code; here they are only known keys.
MSPROBE_SCHEMA: dict = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "x-expected": "expected a JSON object",
    "properties": {
        "task": {"enum": [*TASKS, None], "x-expected": f"expected one of {list(TASKS)}"},
        "level": {"enum": [*LEVELS, None], "x-expected": f"expected one of {list(LEVELS)}"},
        "dump_path": {"type": ["string", "null"], "minLength": 1, "x-expected": "expected a non-empty path string"},
        "statistics": _TASK_SECTION,
        "tensor": _TASK_SECTION,
        "rank": _ANY, "step": _ANY, "rdr": _ANY, "cluster": _ANY,
        **{key: _ANY for key in sorted(MSPROBE_IGNORED_TOP)},
    },
    "additionalProperties": False,
}


def check_msprobe_fields(raw: Any, skip: Iterable[str] = ()) -> None:
    """Raise ConfigError for the first problem in ``raw``'s msProbe fields; ``skip`` names
    top-level keys a constructor argument overrides (checked under the argument's name)."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import best_match
    if isinstance(raw, dict):
        raw = {k: v for k, v in raw.items() if k not in set(skip)}
    error = best_match(Draft202012Validator(MSPROBE_SCHEMA).iter_errors(raw))
    if error is not None:
        raise to_config_error(error)


def unknown_field(key: str, known: Iterable[str]) -> str:
    """The expectation for a key that is not in ``known``: the likely intended one first."""
    known = sorted(known)
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown field; {hint}known: {', '.join(known)}"


def to_config_error(error: Any) -> ConfigError:
    """One jsonschema ValidationError as the field (dotted; list positions are not part
    of a field's name, the element is the value), the value and the expectation."""
    names = [str(p) for p in error.absolute_path if not isinstance(p, int)]
    if error.validator == "additionalProperties":
        known = error.schema.get("properties", {})
        extra = sorted(k for k in error.instance if k not in known)[0]
        return ConfigError(".".join([*names, extra]), error.instance[extra], unknown_field(extra, known))
    reason = error.schema.get("x-expected") or error.message
    return ConfigError(".".join(names) or "config", error.instance, reason)
