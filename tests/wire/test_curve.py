"""CURVE with a zmq.auth allowlist: an allowed agent gets through, a stranger is refused.

Keys come from the real key tool (``rankscope keys``); sockets are real TCP sockets, and
the last test runs real node-agent processes against a CURVE coordinator.
"""
from __future__ import annotations

import time

import pytest
import zmq
from node_harness import FakeCoordinator, free_port, start_agent, start_rank, stop, wait_event

from rankscope.cli import keys as keys_cli
from rankscope.wire import protocol
from rankscope.wire.protocol import Message
from rankscope.wire.transport import (
    CurveKeys,
    TransportError,
    bind_router,
    connect_dealer,
    connect_watched_dealer,
    stop_authenticator,
)

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def keys(tmp_path):
    for name in ("coordinator", "agent", "stranger"):
        assert keys_cli.main(["new", name, "--dir", str(tmp_path / "keys")]) == 0
    assert keys_cli.main(["allow", str(tmp_path / "keys" / "agent.key"),
                          "--allow-dir", str(tmp_path / "keys" / "allowed")]) == 0
    return tmp_path / "keys"


def _server(keys) -> CurveKeys:
    return CurveKeys.from_files(keys / "coordinator.key_secret", allow_dir=keys / "allowed")


def _client(keys, name: str) -> CurveKeys:
    return CurveKeys.from_files(keys / f"{name}.key_secret", server_public_file=keys / "coordinator.key")


def _frame(src: str) -> bytes:
    return protocol.encode(Message(protocol.STATUS, "j", src, 0, {"what": "hello"}))


def test_allowed_key_passes_and_stranger_and_plaintext_are_refused(keys):
    ctx = zmq.Context()
    try:
        # Not loopback: CURVE is mandatory, and given.
        router, bound = bind_router(ctx, "tcp://0.0.0.0:0", _server(keys))
        port = bound.rsplit(":", 1)[1]
        ep = f"tcp://127.0.0.1:{port}"
        good = connect_dealer(ctx, ep, b"good", _client(keys, "agent"))
        stranger, stranger_watch = connect_watched_dealer(ctx, ep, b"stranger", _client(keys, "stranger"))
        plain = connect_dealer(ctx, ep, b"plain")
        for sock, src in ((stranger, "stranger"), (plain, "plain"), (good, "good")):
            try:
                sock.send(_frame(src), zmq.NOBLOCK)
            except zmq.Again:
                pass  # IMMEDIATE: no finished handshake, nothing queued -- refused as well
        good.send(_frame("good2"))  # blocks until the allowed handshake completes
        seen = []
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            if router.poll(100):
                ident, frame = router.recv_multipart()
                seen.append((ident, protocol.Decoder().decode(frame).src))
        assert seen and {i for i, _ in seen} == {b"good"}, seen
        assert (b"good", "good2") in seen
        stranger_watch.changes()
        assert stranger_watch.connected is False
        assert stranger_watch.handshake_failed > 0  # the server said no (ZAP 400), not just silence
        for s in (good, stranger, plain, router):
            s.close(0)
        stranger_watch.close()
    finally:
        stop_authenticator(ctx)
        ctx.destroy(linger=0)


def test_non_local_endpoints_need_keys(keys):
    ctx = zmq.Context()
    try:
        with pytest.raises(TransportError, match="CURVE keys are required"):
            bind_router(ctx, "tcp://0.0.0.0:0")
        with pytest.raises(TransportError, match="CURVE keys are required"):
            connect_dealer(ctx, "tcp://10.1.2.3:7000", b"x")
        with pytest.raises(TransportError, match="allow_dir"):
            bind_router(ctx, "tcp://0.0.0.0:0", CurveKeys.from_files(keys / "coordinator.key_secret"))
        with pytest.raises(TransportError, match="server_public"):
            connect_dealer(ctx, "tcp://10.1.2.3:7000", b"x", CurveKeys.from_files(keys / "agent.key_secret"))
    finally:
        ctx.destroy(linger=0)


def test_agent_processes_allowed_vs_stranger(tmp_path, keys):
    coord = FakeCoordinator(f"tcp://127.0.0.1:{free_port()}", curve=_server(keys))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    agents = []
    try:
        good, good_ep = start_agent(tmp_path / "a", coord.bound, "--curve-secret", str(keys / "agent.key_secret"),
                                    "--coordinator-key", str(keys / "coordinator.key"))
        bad, bad_ep = start_agent(tmp_path / "b", coord.bound, "--curve-secret", str(keys / "stranger.key_secret"),
                                  "--coordinator-key", str(keys / "coordinator.key"))
        agents = [good, bad]
        ranks = [start_rank(good_ep, "--claim", "0", "--world-size", "1", "--steps", "3"),
                 start_rank(bad_ep, "--claim", "1", "--world-size", "1", "--steps", "3")]
        for r in ranks:
            wait_event(r, "done")
            assert r.wait(30) == 0
        coord.wait_for(lambda m: m.type == protocol.STEP and m.body["step"] == 2)
        coord.pump(1.0)
        steps = {m.body["rank"] for m in coord.of_type(protocol.STEP)}
        assert steps == {0}  # the stranger's rank 1 never got in
        assert all(not m.src.startswith("agent:") or str(bad.pid) not in m.src for m in coord.messages)
        assert bad.poll() is None  # refused, but the stranger agent itself keeps serving its ranks
    finally:
        for a in agents:
            stop(a)
        coord.close()


def test_agent_cli_refuses_plaintext_to_a_remote_coordinator(tmp_path):
    from rankscope.cli import agent as daemon_cli

    with pytest.raises(SystemExit, match="--curve-secret and --coordinator-key are required"):
        daemon_cli.settings_from_args(daemon_cli.build_parser().parse_args(
            ["--listen", f"ipc://{tmp_path}/a.sock", "--coordinator", "tcp://10.1.2.3:7000"]))
    with pytest.raises(SystemExit, match="--curve-secret and --allow-dir are required"):
        daemon_cli.settings_from_args(daemon_cli.build_parser().parse_args(["--listen", "tcp://0.0.0.0:7001"]))


def test_key_tool_files_permissions_and_refusals(tmp_path, keys, capsys):
    assert (keys / "agent.key_secret").stat().st_mode & 0o777 == 0o600
    with pytest.raises(SystemExit, match="exists; pass --force"):
        keys_cli.main(["new", "agent", "--dir", str(keys)])
    with pytest.raises(SystemExit, match="is a secret key"):
        keys_cli.main(["allow", str(keys / "stranger.key_secret"), "--allow-dir", str(keys / "allowed")])
    with pytest.raises(SystemExit, match="must be letters"):
        keys_cli.main(["new", "../evil", "--dir", str(keys)])
    capsys.readouterr()
    assert keys_cli.main(["show", str(keys / "agent.key")]) == 0
    shown = capsys.readouterr().out.strip()
    assert keys_cli.main(["list", "--allow-dir", str(keys / "allowed")]) == 0
    assert capsys.readouterr().out.split() == [shown, "agent.key"]
    # The allowlist copy holds the public key only, and zmq.auth reads it.
    assert "secret" not in (keys / "allowed" / "agent.key").read_text()
    assert CurveKeys.from_files(keys / "agent.key_secret").public.decode() == shown
    assert keys_cli.main(["revoke", "agent", "--allow-dir", str(keys / "allowed")]) == 0
    assert not list((keys / "allowed").glob("*.key"))


def test_revoked_key_is_refused_after_reload(keys):
    from rankscope.wire.transport import reload_allowlist

    ctx = zmq.Context()
    try:
        router, ep = bind_router(ctx, "tcp://127.0.0.1:0", _server(keys))
        first, w1 = connect_watched_dealer(ctx, ep, b"first", _client(keys, "agent"))
        first.send(_frame("before"))
        assert router.poll(10000) and router.recv_multipart()[0] == b"first"
        assert keys_cli.main(["revoke", "agent", "--allow-dir", str(keys / "allowed")]) == 0
        assert reload_allowlist(ctx, keys / "allowed") == 0
        later, w2 = connect_watched_dealer(ctx, ep, b"later", _client(keys, "agent"))
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and not w2.handshake_failed:
            w2.changes()
            time.sleep(0.05)
        assert w2.handshake_failed > 0 and not w2.connected
        assert not router.poll(200)
    finally:
        stop_authenticator(ctx)
        ctx.destroy(linger=0)


def test_closing_the_curve_router_lets_the_context_terminate(keys):
    # The ZAP thread lives in the context; closing the only CURVE router must stop it,
    # or ctx.term() (what a service does at shutdown) would wait for ever.
    import threading

    ctx = zmq.Context()
    router, _ = bind_router(ctx, "tcp://127.0.0.1:0", _server(keys))
    router.close(0)
    done = threading.Event()
    t = threading.Thread(target=lambda: (ctx.term(), done.set()), daemon=True)
    t.start()
    assert done.wait(10), "ctx.term() blocked: the ZAP authenticator was left running"


def test_agent_cli_accepts_host_port_and_names_a_bad_listen_endpoint(tmp_path):
    from rankscope.cli import agent as daemon_cli

    s = daemon_cli.settings_from_args(daemon_cli.build_parser().parse_args(
        ["--listen", f"ipc://{tmp_path}/a.sock", "--coordinator", "127.0.0.1:7000"]))
    assert s.coordinator == "tcp://127.0.0.1:7000"
    with pytest.raises(SystemExit, match="must be ipc://PATH or tcp://HOST:PORT"):
        daemon_cli.main(["--listen", "bogus://x", "--spool", str(tmp_path / "s")])
    # A listen endpoint that cannot be bound: exit status 2 and a message, no traceback.
    assert daemon_cli.main(["--listen", f"ipc://{tmp_path}/no/such/dir/a.sock", "--spool", str(tmp_path / "s"),
                            "--bundle-dir", str(tmp_path / "b")]) == 2


def test_agent_listening_off_loopback_admits_only_allowlisted_ranks(tmp_path, keys):
    from rankscope.client.agent_client import AgentClient, RankClaim
    from rankscope.probe.gate import StepGate

    assert keys_cli.main(["new", "rank", "--dir", str(keys)]) == 0
    assert keys_cli.main(["allow", str(keys / "rank.key"), "--allow-dir", str(keys / "ranks")]) == 0
    port = free_port()
    agent, _ = start_agent(tmp_path, None, "--curve-secret", str(keys / "coordinator.key_secret"),
                           "--allow-dir", str(keys / "ranks"), listen=f"tcp://0.0.0.0:{port}")
    ep = f"tcp://127.0.0.1:{port}"
    good = AgentClient(ep, "j", StepGate(), curve=CurveKeys.from_files(
        keys / "rank.key_secret", server_public_file=keys / "coordinator.key"))
    stranger = AgentClient(ep, "j", StepGate(), curve=_client(keys, "stranger"))
    try:
        assert good.register(RankClaim.here(4, world_size=1), timeout=10.0) == 4
        assert stranger.register(RankClaim.here(5, world_size=1), timeout=3.0) is None
    finally:
        good.close(timeout=0.5)
        stranger.close(timeout=0.5)
        stop(agent)
