"""ZeroMQ sockets for rankscope: ROUTER servers, DEALER clients, CURVE outside loopback.

Policy in one place so every component gets the same guarantees:

- every socket carries ``MAXMSGSIZE = protocol.MAX_FRAME_BYTES``, so libzmq drops an
  oversized frame (and the peer's connection) before it is buffered in our process;
- a ROUTER bound to anything but ``ipc://``, ``inproc://`` or a loopback TCP address
  refuses to start without CURVE keys; with keys it is a CURVE server whose ZAP
  handler (pyzmq's ``zmq.auth``) admits only the client public keys in ``allow_dir``;
- a DEALER connecting to a non-local endpoint likewise needs CURVE keys and the
  server's public key.

The ZAP authenticator is per ZeroMQ context (it binds ``inproc://zeromq.zap.01``),
so one is started lazily per context and shared by every CURVE ROUTER on it.
"""
from __future__ import annotations

import ipaddress
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path

import zmq

from rankscope.wire.protocol import MAX_FRAME_BYTES

_LOCAL_SCHEMES = ("ipc://", "inproc://")
_LOCAL_NAMES = frozenset({"localhost", "ip6-localhost", "ip6-loopback"})


class TransportError(ValueError):
    """An endpoint or key configuration that must not be used; names the value."""


@dataclass(frozen=True)
class CurveKeys:
    """A CURVE key pair (Z85 bytes) plus what the role needs.

    Server (bind_router): ``allow_dir`` holds the ``*.key`` public-key certificates of
    the clients it admits (``rankscope keys allow`` puts them there). Client
    (connect_dealer): ``server_public`` is the server's public key.
    """

    public: bytes
    secret: bytes
    server_public: bytes | None = None
    allow_dir: str | Path | None = None

    def __post_init__(self) -> None:
        for name in ("public", "secret", "server_public"):
            val = getattr(self, name)
            if val is None and name == "server_public":
                continue
            if isinstance(val, str):
                object.__setattr__(self, name, val.encode("ascii"))
                val = getattr(self, name)
            if not isinstance(val, bytes) or len(val) != 40:
                raise TransportError(f"CurveKeys.{name}: expected a 40-character Z85 key, got {val!r:.60}")

    @classmethod
    def from_files(cls, secret_file: str | Path, *, server_public_file: str | Path | None = None,
                   allow_dir: str | Path | None = None) -> "CurveKeys":
        """Load ``zmq.auth`` certificate files (``name.key_secret``, ``server.key``)."""
        import zmq.auth

        public, secret = zmq.auth.load_certificate(str(secret_file))
        if secret is None:
            raise TransportError(f"secret_file: {secret_file} holds no secret key (use the .key_secret file)")
        server_public = None
        if server_public_file is not None:
            server_public, _ = zmq.auth.load_certificate(str(server_public_file))
        return cls(public, secret, server_public, allow_dir)


def is_local(endpoint: str) -> bool:
    """True for ipc/inproc and TCP endpoints on a loopback address (not ``*``/0.0.0.0)."""
    if endpoint.startswith(_LOCAL_SCHEMES):
        return True
    if not endpoint.startswith("tcp://"):
        return False
    hostport = endpoint[len("tcp://"):]
    # "tcp://iface;host:port" names a source interface; the destination is what counts.
    hostport = hostport.split(";")[-1]
    if hostport.startswith("["):
        host = hostport[1:].split("]", 1)[0]
    else:
        host = hostport.rsplit(":", 1)[0]
    if host.lower() in _LOCAL_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a hostname, "*", or an interface name: could be reachable from outside


def _normalise_bind(endpoint: str) -> str:
    # Port 0 is the usual "any free port" spelling; libzmq wants "*" for that.
    if endpoint.startswith("tcp://") and endpoint.endswith(":0"):
        return endpoint[:-2] + ":*"
    return endpoint


# One ZAP authenticator per context; weak keys so a terminated context frees its entry.
_AUTHENTICATORS: "weakref.WeakKeyDictionary[zmq.Context, object]" = weakref.WeakKeyDictionary()
_AUTH_LOCK = threading.Lock()


_AUTH_USERS: "weakref.WeakKeyDictionary[zmq.Context, int]" = weakref.WeakKeyDictionary()


class _CurveRouter(zmq.Socket):
    """A CURVE server socket that stops its context's ZAP thread when the last one closes.

    The ZAP thread keeps sockets open in the context, so ``ctx.term()`` would wait for
    ever; callers that only ever close their own socket must not have to know that.
    """

    counted = False  # set once bind_router has counted this socket as a ZAP user

    def close(self, linger: int | None = None) -> None:
        was_open = not self.closed
        ctx = self.context
        super().close(linger)
        if not (was_open and self.counted):
            return
        with _AUTH_LOCK:
            users = _AUTH_USERS.get(ctx, 0) - 1
            _AUTH_USERS[ctx] = max(users, 0)
        if users <= 0:
            try:
                stop_authenticator(ctx)
            except Exception:  # teardown (ctx.destroy) may have closed its sockets already
                pass


def _authenticator(ctx: zmq.Context, allow_dir: str | Path) -> object:
    from zmq.auth.thread import ThreadAuthenticator

    allow = Path(allow_dir)
    if not allow.is_dir():
        raise TransportError(f"allow_dir: {allow} is not a directory of client public keys")
    with _AUTH_LOCK:
        auth = _AUTHENTICATORS.get(ctx)
        if auth is None:
            auth = ThreadAuthenticator(ctx)
            auth.start()
            _AUTHENTICATORS[ctx] = auth
        # configure_curve reads every *.key in the directory now; calling it again on
        # each bind picks up keys added since (rankscope keys allow).
        auth.configure_curve(domain="*", location=str(allow))
    return auth


def reload_allowlist(ctx: zmq.Context, allow_dir: str | Path) -> int:
    """Re-read ``allow_dir`` (after ``rankscope keys allow/revoke``); returns how many keys
    are now admitted. Applies to new handshakes; connected peers stay connected."""
    _authenticator(ctx, allow_dir)
    return len(list(Path(allow_dir).glob("*.key")))


def stop_authenticator(ctx: zmq.Context) -> None:
    """Stop the ZAP thread of ``ctx`` (call before ``ctx.term()``)."""
    with _AUTH_LOCK:
        auth = _AUTHENTICATORS.pop(ctx, None)
    if auth is not None:
        auth.stop()


def _common_options(sock: zmq.Socket, rcvhwm: int | None = None, sndhwm: int | None = None) -> None:
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
    # Ranks never wait on the wire: close drops what is queued after a short grace.
    sock.setsockopt(zmq.LINGER, 200)
    # libzmq copies the high-water marks into each pipe when the pipe is made, and a bound
    # socket's listener keeps the options it had at bind: set after bind/connect, they
    # never reach the pipes that carry the traffic.
    for opt, val, name in ((zmq.RCVHWM, rcvhwm, "rcvhwm"), (zmq.SNDHWM, sndhwm, "sndhwm")):
        if val is not None:
            if not isinstance(val, int) or isinstance(val, bool) or val < 0:
                raise TransportError(f"{name}: expected a message count >= 0 (0 = no limit), got {val!r:.40}")
            sock.setsockopt(opt, val)


def bind_router(ctx: zmq.Context, endpoint: str, curve: CurveKeys | None = None, *,
                rcvhwm: int | None = None, sndhwm: int | None = None) -> tuple[zmq.Socket, str]:
    """Bind a ROUTER on ``endpoint``; return it and the endpoint actually bound
    (the real port when ``:0``/``:*`` was asked for).

    A non-local endpoint without ``curve`` (or without ``curve.allow_dir``) is refused:
    stats and control must never travel unauthenticated across a network.
    ``rcvhwm``/``sndhwm``: queue limits in messages per peer (libzmq's default 1000 when
    None), applied before the bind so they hold for every connection.
    """
    local = is_local(endpoint)
    if not local and curve is None:
        raise TransportError(f"endpoint {endpoint!r} is not loopback/ipc: CURVE keys are required to bind it")
    if curve is not None and curve.allow_dir is None:
        raise TransportError(f"endpoint {endpoint!r}: CurveKeys.allow_dir is required for a CURVE server")
    sock = ctx.socket(zmq.ROUTER, socket_class=_CurveRouter if curve is not None else None)
    try:
        _common_options(sock, rcvhwm, sndhwm)
        # A peer that reconnects with its old identity (e.g. after a half-open TCP
        # connection) takes the route over; otherwise replies would go to a dead pipe.
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        if curve is not None:
            _authenticator(ctx, curve.allow_dir)  # type: ignore[arg-type]
            with _AUTH_LOCK:
                _AUTH_USERS[ctx] = _AUTH_USERS.get(ctx, 0) + 1
            sock.counted = True
            sock.curve_secretkey = curve.secret
            sock.curve_publickey = curve.public
            sock.curve_server = True
        sock.bind(_normalise_bind(endpoint))
        bound = sock.getsockopt_string(zmq.LAST_ENDPOINT)
    except zmq.ZMQError as exc:
        sock.close(0)
        raise TransportError(f"cannot bind {endpoint!r}: {exc}") from exc
    except BaseException:
        sock.close(0)
        raise
    return sock, bound


def connect_dealer(ctx: zmq.Context, endpoint: str, identity: bytes, curve: CurveKeys | None = None, *,
                   sndhwm: int | None = None, heartbeat: bool = True) -> zmq.Socket:
    """Connect a DEALER with routing ``identity``; CURVE client when ``curve`` is given
    (required for a non-local endpoint, with ``curve.server_public``).

    ``IMMEDIATE`` is set so a send while the peer is unreachable fails with
    ``zmq.Again`` instead of queueing into a pipe that may never drain: callers use
    that to spool or count a drop. ``sndhwm``: the send queue limit in messages (0 = no
    limit), set before connecting (see :func:`bind_router`). ``heartbeat=False``: no ZMTP
    pings, for a sender without a spool: a peer that stops reading when its queue is full
    also stops answering pings, and the connection dropped after the timeout takes the
    frames in flight with it (a node agent replays them from its spool).
    """
    sock = _dealer(ctx, endpoint, identity, curve, sndhwm, heartbeat)
    _connect(sock, endpoint)
    return sock


def connect_watched_dealer(ctx: zmq.Context, endpoint: str, identity: bytes, curve: CurveKeys | None = None, *,
                           sndhwm: int | None = None) -> tuple[zmq.Socket, "ConnectionWatch"]:
    """:func:`connect_dealer` plus a :class:`ConnectionWatch` attached *before* connecting,
    so the first handshake cannot happen before anyone listens for it."""
    sock = _dealer(ctx, endpoint, identity, curve, sndhwm)
    watch = ConnectionWatch(sock)
    try:
        _connect(sock, endpoint)
    except BaseException:
        watch.close()
        raise
    return sock, watch


def _dealer(ctx: zmq.Context, endpoint: str, identity: bytes, curve: CurveKeys | None,
            sndhwm: int | None = None, heartbeat: bool = True) -> zmq.Socket:
    if not isinstance(identity, bytes) or not identity:
        raise TransportError(f"identity: expected non-empty bytes, got {identity!r:.60}")
    if not is_local(endpoint) and curve is None:
        raise TransportError(f"endpoint {endpoint!r} is not loopback/ipc: CURVE keys are required to connect")
    if curve is not None and curve.server_public is None:
        raise TransportError(f"endpoint {endpoint!r}: CurveKeys.server_public is required for a CURVE client")
    sock = ctx.socket(zmq.DEALER)
    try:
        _common_options(sock, sndhwm=sndhwm)
        sock.setsockopt(zmq.IDENTITY, identity)
        sock.setsockopt(zmq.IMMEDIATE, 1)
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        # ZMTP pings: a peer that vanished without closing TCP (host down, partition) is
        # noticed within seconds, so a spool rewinds before it counts frames as delivered.
        if heartbeat:
            sock.setsockopt(zmq.HEARTBEAT_IVL, 1000)
            sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3000)
        if curve is not None:
            sock.curve_secretkey = curve.secret
            sock.curve_publickey = curve.public
            sock.curve_serverkey = curve.server_public
    except BaseException:
        sock.close(0)
        raise
    return sock


def _connect(sock: zmq.Socket, endpoint: str) -> None:
    try:
        sock.connect(endpoint)
    except zmq.ZMQError as exc:
        sock.close(0)
        raise TransportError(f"cannot connect {endpoint!r}: {exc}") from exc


class ConnectionWatch:
    """Connection state of a DEALER from its socket-monitor events.

    ``connected`` turns True on a finished handshake (CURVE or NULL) and False on a
    disconnect; ``changes()`` returns the transitions since the last call, so a caller
    knows when to resend state (registration, name tables) or rewind its spool.
    ``handshake_failed`` counts refusals (e.g. a CURVE key the server does not allow).
    """

    _EVENTS = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED
               | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
               | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)

    def __init__(self, sock: zmq.Socket) -> None:
        self._sock = sock
        self._mon = sock.get_monitor_socket(self._EVENTS)
        self.connected = False
        self.handshake_failed = 0

    def changes(self) -> list[bool]:
        from zmq.utils.monitor import recv_monitor_message

        out: list[bool] = []
        while True:
            try:
                ev = recv_monitor_message(self._mon, zmq.NOBLOCK)
            except zmq.Again:
                return out
            except zmq.ZMQError:
                return out
            event = ev["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                state = True
            elif event == zmq.EVENT_DISCONNECTED:
                state = False
            else:
                self.handshake_failed += 1
                continue
            if state != self.connected:
                self.connected = state
                out.append(state)

    def close(self) -> None:
        try:
            self._sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self._mon.close(0)
