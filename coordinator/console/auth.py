"""Who may see the console: the holder of its token.

The token is random per console and travels once in the URL printed at the start
(``?token=``); the page then holds it in a cookie named for this console (HttpOnly,
SameSite=Strict). A control action (a POST) must also carry it in a header: a page of
another site can make a browser send the cookie, never a custom header without a CORS
preflight that the console never grants. A POST with an Origin naming another host:port
is refused too.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
from urllib.parse import urlsplit

HEADER = "X-Rankscope-Token"


def cookie_name(token: str) -> str:
    """The console's cookie, named after its token: browsers keep cookies by host, not by
    port, so two consoles on one machine must not overwrite each other's."""
    return "rankscope_console_" + hashlib.sha256(token.encode()).hexdigest()[:12]


def new_token() -> str:
    return secrets.token_urlsafe(24)


def _same(given: str | None, token: str) -> bool:
    return bool(given) and hmac.compare_digest(given.encode(), token.encode())


def may_read(token: str, query: str | None, cookie: str | None, header: str | None) -> bool:
    """The request carries the token in the URL, the cookie or the header."""
    return any(_same(x, token) for x in (query, cookie, header))


def may_act(token: str, header: str | None, origin: str | None, host: str | None) -> str | None:
    """Why a control POST is refused, or None: the header must hold the token, and an
    Origin (browsers send one on every POST) must be this console's own host:port."""
    if not _same(header, token):
        return f"a control request needs the {HEADER} header holding the console's token"
    if origin and origin != "null":
        parts = urlsplit(origin)
        if parts.netloc != (host or ""):
            return f"a control request from another site ({origin}) is refused"
    elif origin == "null":
        return "a control request from an opaque origin is refused"
    return None
