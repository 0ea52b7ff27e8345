"""transport.py: endpoint policy, socket options, connection state, oversized frames."""
from __future__ import annotations

import time

import pytest
import zmq
from repo_paths import REPO

from rankscope.wire.protocol import MAX_FRAME_BYTES
from rankscope.wire.transport import (
    CurveKeys,
    TransportError,
    bind_router,
    connect_dealer,
    connect_watched_dealer,
    is_local,
)

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("endpoint, local", [
    ("ipc:///tmp/x.sock", True), ("inproc://a", True),
    ("tcp://127.0.0.1:5555", True), ("tcp://127.3.4.5:1", True), ("tcp://localhost:80", True),
    ("tcp://[::1]:5555", True), ("tcp://eth0;127.0.0.1:5555", True),
    ("tcp://0.0.0.0:5555", False), ("tcp://*:5555", False), ("tcp://10.0.0.1:5555", False),
    ("tcp://coordinator.svc:7000", False), ("tcp://[2001:db8::1]:1", False), ("udp://127.0.0.1:1", False),
    ("tcp://eth0:5555", False),
])
def test_is_local(endpoint, local):
    assert is_local(endpoint) is local


def test_curve_keys_validate_lengths():
    pub, sec = zmq.curve_keypair()
    assert CurveKeys(pub.decode(), sec).public == pub  # str is accepted and stored as bytes
    with pytest.raises(TransportError, match="CurveKeys.secret"):
        CurveKeys(pub, b"short")
    with pytest.raises(TransportError, match="CurveKeys.server_public"):
        CurveKeys(pub, sec, server_public=b"x" * 39)


def test_bind_port_zero_reports_real_port_and_sets_maxmsgsize(tmp_path):
    ctx = zmq.Context()
    try:
        sock, bound = bind_router(ctx, "tcp://127.0.0.1:0")
        assert bound.startswith("tcp://127.0.0.1:") and not bound.endswith(":0")
        assert sock.getsockopt(zmq.MAXMSGSIZE) == MAX_FRAME_BYTES
        with pytest.raises(TransportError, match="cannot bind"):
            bind_router(ctx, bound)  # in use
        sock.close(0)
        ipc, bound_ipc = bind_router(ctx, f"ipc://{tmp_path}/s.sock")
        assert bound_ipc == f"ipc://{tmp_path}/s.sock"
        ipc.close(0)
    finally:
        ctx.destroy(linger=0)  # closes whatever a failed assertion left open


def test_dealer_identity_is_checked():
    ctx = zmq.Context()
    try:
        with pytest.raises(TransportError, match="identity"):
            connect_watched_dealer(ctx, "tcp://127.0.0.1:1", b"")
    finally:
        ctx.destroy(linger=0)  # closes whatever a failed assertion left open


def test_oversized_frame_is_dropped_by_libzmq_and_the_router_keeps_serving(tmp_path):
    ctx = zmq.Context()
    try:
        router, ep = bind_router(ctx, f"ipc://{tmp_path}/r.sock")
        big, big_watch = connect_watched_dealer(ctx, ep, b"big")
        small, small_watch = connect_watched_dealer(ctx, ep, b"small")
        big.send(b"\0" * (MAX_FRAME_BYTES + 1))
        small.send(b"hello")
        got = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not got:
            if router.poll(100):
                got.append(router.recv_multipart())
        assert got == [[b"small", b"hello"]]
        # libzmq cut the oversized sender off rather than buffering 64 MiB.
        time.sleep(0.2)
        assert not router.poll(200)
        changes = big_watch.changes()
        assert False in changes
        for s in (router, big, small):
            s.close(0)
        big_watch.close()
        small_watch.close()
    finally:
        ctx.destroy(linger=0)  # closes whatever a failed assertion left open


def test_connection_watch_sees_drop_and_return(tmp_path):
    ctx = zmq.Context()
    try:
        ep = f"ipc://{tmp_path}/w.sock"
        router, _ = bind_router(ctx, ep)
        dealer, watch = connect_watched_dealer(ctx, ep, b"d")
        states = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and True not in states:
            states += watch.changes()
            time.sleep(0.02)
        router.close(0)
        while time.monotonic() < deadline and states[-1:] != [False]:
            states += watch.changes()
            time.sleep(0.02)
        router, _ = bind_router(ctx, ep)
        while time.monotonic() < deadline + 5 and states[-1:] != [True]:
            states += watch.changes()
            time.sleep(0.02)
        assert states == [True, False, True]
        for s in (router, dealer):
            s.close(0)
        watch.close()
    finally:
        ctx.destroy(linger=0)  # closes whatever a failed assertion left open


def test_a_frozen_peer_is_noticed_by_zmtp_heartbeats(tmp_path):
    # SIGSTOP keeps the peer's TCP connection open but silent (like a host that dropped
    # off the network); the DEALER must still see the link go down.
    import os
    import signal
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", (
        "import sys, time, zmq; sys.path.insert(0, sys.argv[1])\n"
        "from rankscope.wire.transport import bind_router\n"
        "ctx = zmq.Context(); s, ep = bind_router(ctx, 'tcp://127.0.0.1:0'); print(ep, flush=True)\n"
        "time.sleep(120)\n"), str(REPO)],
        stdout=subprocess.PIPE, text=True)
    ctx = zmq.Context()
    try:
        ep = child.stdout.readline().strip()
        dealer, watch = connect_watched_dealer(ctx, ep, b"d")
        states = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and True not in states:
            states += watch.changes()
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and states[-1:] != [False]:
            states += watch.changes()
            time.sleep(0.05)
        assert states[:1] == [True] and states[-1:] == [False], states
        watch.close()
        dealer.close(0)
    finally:
        os.kill(child.pid, signal.SIGCONT)
        child.kill()
        child.wait(10)
        ctx.destroy(linger=0)


def _queued_until_full(ctx: zmq.Context, ep: str, rcvhwm: int) -> int:
    """Frames a dealer gets out to a router that never reads, until the queues are full."""
    router, bound = bind_router(ctx, ep, rcvhwm=rcvhwm)
    dealer = connect_dealer(ctx, bound, b"filler", sndhwm=10)
    n = stuck = 0
    try:
        while stuck < 30:  # the I/O thread moves frames on asynchronously: give it time
            try:
                dealer.send(b"x" * 1024, zmq.NOBLOCK)
                n, stuck = n + 1, 0
            except zmq.Again:
                stuck += 1
                time.sleep(0.01)
    finally:
        dealer.close(0)
        router.close(0)
    return n


def test_rcvhwm_holds_for_connections_made_after_the_bind(tmp_path):
    # libzmq gives a bound socket's connections the options it had at bind time: a limit
    # set afterwards left them at the default 1000 and frames beyond it were held back.
    ctx = zmq.Context()
    try:
        small = _queued_until_full(ctx, f"ipc://{tmp_path}/a.sock", rcvhwm=100)
        large = _queued_until_full(ctx, f"ipc://{tmp_path}/b.sock", rcvhwm=10_000)
        assert large - small >= 8_000, (small, large)
    finally:
        ctx.destroy(linger=0)


def test_bad_high_water_mark_is_refused():
    ctx = zmq.Context()
    try:
        with pytest.raises(TransportError, match="rcvhwm"):
            bind_router(ctx, "tcp://127.0.0.1:0", rcvhwm=-1)
        with pytest.raises(TransportError, match="sndhwm"):
            connect_dealer(ctx, "tcp://127.0.0.1:1", b"d", sndhwm=True)
    finally:
        ctx.destroy(linger=0)
