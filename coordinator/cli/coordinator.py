"""``rankscope coordinator``: start (or join) the coordinator actor on a Ray cluster.

Joins the Ray cluster at ``--address`` (``auto``: the one Ray started last on this
machine; default: a new private local Ray, never another job's by chance), starts the named actor (or finds it already running) and prints the
endpoint node agents connect to (``rankscope agent --coordinator ENDPOINT``).
``--detached`` leaves the actor running after this command exits; otherwise it
serves until Ctrl-C / SIGTERM. Incident state lives under ``--export-dir``
(``incidents/<id>/state.json``), so a coordinator restarted on the same directory
picks its incidents up where they were.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from rankscope.coordinator.cli.shards_option import add_shards_option, apply_shards
from rankscope.coordinator.server.actor import DEFAULT_NAME, DEFAULT_NAMESPACE


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="rankscope coordinator", description=__doc__.replace("``", ""),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--address", default=None,
                    help="Ray cluster address, or 'auto' for the running local one "
                         "(default: start a private local Ray)")
    ap.add_argument("--export-dir", type=Path, default=Path("rankscope-out"),
                    help="where incidents/ and dumps/ are written (default: ./rankscope-out)")
    ap.add_argument("--config", type=Path, default=None, help="config.json whose \"cluster\" section applies")
    ap.add_argument("--on-divergence", choices=("pause", "export", "terminate", "continue"), default=None,
                    help="what to do at the first divergence (default: the config's, else pause)")
    add_shards_option(ap)
    ap.add_argument("--bind", default="tcp://127.0.0.1:0",
                    help="ZeroMQ endpoint for node agents (non-loopback needs --curve-secret and --allow-dir)")
    ap.add_argument("--curve-secret", type=Path, default=None, help="the coordinator's CURVE .key_secret file")
    ap.add_argument("--allow-dir", type=Path, default=None, help="directory of admitted agents' public .key files")
    ap.add_argument("--job", default=None, help="accept only this job id (default: any)")
    ap.add_argument("--name", default=DEFAULT_NAME, help="Ray actor name")
    ap.add_argument("--namespace", default=DEFAULT_NAMESPACE, help="Ray namespace")
    ap.add_argument("--detached", action="store_true", help="keep the actor running after this command exits")
    ap.add_argument("--endpoint-file", type=Path, default=None, help="also write the endpoint into this file")
    ap.add_argument("--verbose", action="store_true", help="also show Ray's own log lines")
    return ap


def job_settings(config: Path | None, on_divergence: str | None) -> dict:
    """The job's whole config, which every node agent is handed (its ``cluster`` section is
    what the coordinator runs with)."""
    from rankscope.config.errors import ConfigError
    from rankscope.config.job import job_config
    try:
        return job_config(config, on_divergence)  # fail here, not inside the actor
    except ConfigError as exc:
        print(f"rankscope coordinator: --config {config}: {exc.reason if exc.field == 'config_path' else exc}",
              file=sys.stderr)
        raise SystemExit(2) from None  # a usage error, like argparse's


def curve_keys(secret: Path | None, allow_dir: Path | None) -> dict | None:
    if secret is None and allow_dir is None:
        return None
    if secret is None or allow_dir is None:
        raise SystemExit("rankscope coordinator: --curve-secret and --allow-dir go together")
    from rankscope.wire.transport import CurveKeys
    keys = CurveKeys.from_files(secret, allow_dir=allow_dir)
    return {"public": keys.public, "secret": keys.secret, "allow_dir": str(allow_dir.resolve())}


def connect_ray(address: str | None, namespace: str, detached: bool, verbose: bool = False) -> None:
    """Join ``address``, or start a private Ray. A detached coordinator needs a cluster
    that outlives this command, so then a Ray head is started with ``ray start --head``
    (on a free port) rather than inside this process."""
    import ray

    from rankscope.coordinator.server.client import quiet_ray
    quiet_ray(not verbose)
    if ray.is_initialized():
        return
    if address is None and detached:
        from rankscope.wire.ports import free_port
        port = free_port()
        ray_cli = Path(sys.executable).with_name("ray")
        subprocess.run([str(ray_cli), "start", "--head", f"--port={port}", "--include-dashboard=false",
                        "--disable-usage-stats"], check=True, stdout=subprocess.DEVNULL)
        address = f"127.0.0.1:{port}"
    from rankscope.coordinator.server.client import connect_ray as join
    join(address, namespace, verbose=verbose)


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    job = apply_shards(job_settings(args.config, args.on_divergence), args.shards)
    curve = curve_keys(args.curve_secret, args.allow_dir)
    from rankscope.coordinator.server.client import Coordinator, CoordinatorError, ray_address
    try:
        connect_ray(args.address, args.namespace, args.detached, args.verbose)
    except CoordinatorError as exc:
        print(f"rankscope coordinator: {exc}", file=sys.stderr)
        return 1
    # Ours, not Ray's (which exits at once): stop the actor cleanly. Installed before the
    # endpoint is announced, so a supervisor that signals right after sees a clean stop.
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    export_dir = args.export_dir.resolve()
    try:
        coord = Coordinator.start(str(export_dir), job["cluster"], name=args.name, namespace=args.namespace,
                                  bind=args.bind, detached=args.detached, job=args.job, curve=curve, config=job)
        endpoint = coord.endpoint()
        restored = coord.incidents()
    except CoordinatorError as exc:
        print(f"rankscope coordinator: {exc}", file=sys.stderr)
        return 1
    if args.endpoint_file is not None:
        args.endpoint_file.write_text(endpoint + "\n")
    from rankscope.coordinator.server import job_index
    listed = job_index.record(job_index.JobRecord(
        job=args.job or "*", address=ray_address() or "", namespace=args.namespace, name=args.name,
        pid=os.getpid(), export_dir=str(export_dir))) if not args.detached else None
    print(f"rankscope coordinator {args.namespace}/{args.name} listening on {endpoint} "
          f"(Ray {ray_address()})", flush=True)
    print(f"  export dir: {export_dir}; incidents on disk: {len(restored)}", flush=True)
    print(f"  node agents: rankscope agent --coordinator {endpoint} ...", flush=True)
    if args.detached:
        print(f"  detached: it keeps running; `rankscope status --address {ray_address()}` talks to it, "
              "`ray stop` ends it", flush=True)
        return 0
    try:
        while not stop.wait(2.0):
            if not coord.alive():
                print("rankscope coordinator: the coordinator actor is unreachable", file=sys.stderr)
                return 1
    finally:
        job_index.forget(listed)
        coord.stop()
    return 0
