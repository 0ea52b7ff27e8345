"""Numbers and small HTML pieces for people: four significant digits, NaN/Inf spelled
out, "—" for what was not recorded, and every run value escaped.

Each number cell also carries the value as recorded (``data-value``), so the page can
be checked against incident.json without parsing the rounded text back.
"""
from __future__ import annotations

import datetime as _dt
import html
import math
from typing import Any, Iterable

MISSING = "\u2014"
_NONFINITE_TEXT = {"nan": "NaN", "inf": "+Inf", "-inf": "\u2212Inf"}


def esc(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def is_nonfinite(value: Any) -> bool:
    if isinstance(value, str):
        return value in _NONFINITE_TEXT
    return isinstance(value, float) and not math.isfinite(value)


def as_float(value: Any) -> float | None:
    """A recorded value as a float (NaN/Inf included); None when it is not a number."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value in _NONFINITE_TEXT:
        return float(value)
    return None


def num(value: Any, digits: int = 4) -> str:
    """``22.6516078218316`` -> ``22.65``; ``"nan"`` -> ``NaN``; None -> ``—``; ints stay whole."""
    if value is None or value == "":
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}".replace(",", "\u2009")
    if isinstance(value, str):
        return _NONFINITE_TEXT.get(value, value)
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "+Inf" if value > 0 else "\u2212Inf"
        if value == 0:
            return "0"
        if value == int(value) and abs(value) < 1e6:
            return str(int(value))
        return f"{value:.{digits}g}".replace("e+0", "e+").replace("e-0", "e\u2212").replace("e-", "e\u2212")
    return str(value)


def seconds(value: Any) -> str:
    f = as_float(value)
    if f is None or not math.isfinite(f):
        return MISSING
    if abs(f) < 1:
        return f"{f * 1000:.0f} ms"
    return f"{f:.2f} s" if abs(f) < 100 else f"{f:.0f} s"


def when(iso_or_epoch: Any) -> str:
    """An ISO time or epoch seconds as ``2026-11-23 12:55:41.368 UTC``."""
    if iso_or_epoch is None:
        return MISSING
    try:
        if isinstance(iso_or_epoch, (int, float)):
            t = _dt.datetime.fromtimestamp(float(iso_or_epoch), _dt.timezone.utc)
        else:
            t = _dt.datetime.fromisoformat(str(iso_or_epoch)).astimezone(_dt.timezone.utc)
    except (ValueError, OverflowError, OSError):
        return str(iso_or_epoch)
    return t.strftime("%Y-%m-%d %H:%M:%S.") + f"{t.microsecond // 1000:03d} UTC"


def epoch(iso: Any) -> float | None:
    try:
        return _dt.datetime.fromisoformat(str(iso)).timestamp()
    except ValueError:
        return None


def num_cell(value: Any, cls: str = "", tag: str = "td") -> str:
    """A number cell: the formatted text, the recorded value in ``data-value``."""
    classes = " ".join(c for c in ("num", cls, "nonfinite" if is_nonfinite(value) else "",
                                   "missing" if value is None else "") if c)
    raw = "" if value is None else esc(value)
    return f'<{tag} class="{classes}" data-value="{raw}">{esc(num(value))}</{tag}>'


def text_cell(value: Any, cls: str = "", tag: str = "td") -> str:
    attr = f' class="{cls}"' if cls else ""
    return f"<{tag}{attr}>{esc(MISSING if value is None or value == '' else value)}</{tag}>"


def table(table_id: str, headers: Iterable[str], rows: Iterable[str], caption: str = "") -> str:
    """``rows`` are ready ``<tr>...</tr>`` strings."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    cap = f"<caption>{esc(caption)}</caption>" if caption else ""
    body = "".join(rows)
    return f'<table id="{esc(table_id)}">{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def muted(text: str, elem_id: str = "") -> str:
    attr = f' id="{esc(elem_id)}"' if elem_id else ""
    return f'<p class="muted"{attr}>{esc(text)}</p>'
