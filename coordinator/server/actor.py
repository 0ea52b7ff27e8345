"""The coordinator as a named Ray actor: a thin shell around CoordinatorService.

As ``ray.util.queue.Queue`` wraps ``_QueueActor``, the class here only forwards:
the logic lives in ``rankscope.coordinator.logic`` (pure), the socket loop and incident
actions in ``rankscope.coordinator.server.service`` / ``frontend`` / ``incident_actions`` (plain
Python). The actor runs with ``max_concurrency`` > 1 so a long ``drain`` does not
block ``status``; every call crosses into the front end's loop thread, which is
the only thread touching the core.
"""
from __future__ import annotations

import logging
from typing import Any

import ray

DEFAULT_NAME = "rankscope"
DEFAULT_NAMESPACE = "rankscope"
#: How often Ray brings a dead coordinator back before giving up on it.
MAX_RESTARTS = 5

log = logging.getLogger(__name__)


class _CoordinatorActor:
    def __init__(self, export_dir: str, cluster: dict, bind: str, job: str | None,
                 curve: dict | None = None, config: dict | None = None) -> None:
        from rankscope.coordinator.server.service import CoordinatorService
        keys = None
        if curve:
            from rankscope.wire.transport import CurveKeys
            keys = CurveKeys(**curve)
        from rankscope.config.cluster import parse_cluster
        count = parse_cluster(cluster).shards
        link = None
        if count > 1:
            from rankscope.coordinator.server.shards import ShardLink, start_shards
            me = ray.get_runtime_context().current_actor
            handles = start_shards(count, cluster, job, me, bind, curve)
            link = ShardLink(handles, ray.get([h.endpoint.remote() for h in handles], timeout=60))
        self._svc = CoordinatorService(export_dir, cluster, bind=bind, job=job, curve=keys,
                                       ray_metrics=True, config=config, link=link, pace_gc=True)
        self._endpoint = self._svc.start()

    def shard_findings(self, findings: dict) -> None:
        self._svc.shard_findings(findings)

    def shard_restarted(self, index: int) -> None:
        self._svc.shard_restarted(index)

    def endpoint(self) -> str:
        return self._endpoint

    def status(self, brief: bool = False) -> dict:
        return self._svc.status(brief)

    def control(self, command: str, args: dict | None = None) -> dict:
        return self._svc.control(command, args)

    def incidents(self) -> list[dict]:
        return self._svc.incidents()

    def console(self, what: str, args: dict | None = None) -> Any:
        return self._svc.console(what, args)

    def drain(self, timeout_s: float = 30.0) -> list[dict]:
        return self._svc.drain(timeout_s)

    def shutdown(self) -> bool:
        """Stop the front end and flush incident files; the actor process itself is
        ended by the caller (``ray.kill``) or with its driver."""
        self._svc.stop()
        if self._svc.link is not None:
            self._svc.link.stop()
        return True

    def ping(self) -> bool:
        return self._svc.frontend.alive


def start_coordinator(export_dir: str, cluster: dict, *, name: str = DEFAULT_NAME,
                      namespace: str = DEFAULT_NAMESPACE, bind: str = "tcp://127.0.0.1:0",
                      detached: bool = False, job: str | None = None, curve: dict | None = None,
                      config: dict | None = None) -> "ray.actor.ActorHandle":
    """Start the named coordinator actor, or join it if one of that name is already
    running (then ``export_dir``/``cluster``/``bind`` of the running one apply).

    Returns the actor handle once its front end is bound (``endpoint()`` answers).
    ``detached`` keeps it alive past this driver. ``curve``: CurveKeys fields
    (public, secret, allow_dir) for a non-loopback ``bind``. ``config``: the job's whole
    config (``rankscope.config.job.job_config``), handed to every node agent.
    """
    if not ray.is_initialized():
        ray.init(namespace=namespace, include_dashboard=False)
    cluster = shards_from_env(cluster)
    try:
        handle = ray.get_actor(name, namespace=namespace)
        log.info("joining running coordinator %s/%s", namespace, name)
    except ValueError:
        # Ray restarts a dead coordinator (its process killed, its node lost) with the same
        # arguments: on a concrete port it binds the endpoint the agents already know, and
        # they reconnect and replay what it did not confirm.
        bind = concrete_bind(bind)
        opts: dict[str, Any] = dict(name=name, namespace=namespace, max_concurrency=8, num_cpus=0,
                                    get_if_exists=True, max_restarts=MAX_RESTARTS, max_task_retries=2)
        if detached:
            opts["lifetime"] = "detached"
        handle = ray.remote(_CoordinatorActor).options(**opts).remote(
            str(export_dir), dict(cluster or {}), bind, job, curve, config)
    ray.get(handle.endpoint.remote())  # surfaces a bind or settings error here, not later
    return handle


def shards_from_env(cluster: dict | None) -> dict:
    """The cluster section with ``shards`` from the environment when it does not say."""
    import os

    from rankscope.wire.shards import SHARDS_ENV
    cluster = dict(cluster or {})
    if "shards" not in cluster and os.environ.get(SHARDS_ENV):
        try:
            cluster["shards"] = int(os.environ[SHARDS_ENV])
        except ValueError:
            raise ValueError(f"{SHARDS_ENV}={os.environ[SHARDS_ENV]!r}: expected a shard count") from None
    return cluster


def concrete_bind(bind: str) -> str:
    """``tcp://host:0`` with a free port filled in (other endpoints unchanged)."""
    if not (bind.startswith("tcp://") and bind.rsplit(":", 1)[-1] in ("0", "*")):
        return bind
    import socket
    host = bind[len("tcp://"):].rsplit(":", 1)[0]
    with socket.socket(socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET) as s:
        s.bind((host.strip("[]") if host != "*" else "", 0))
        return f"tcp://{host}:{s.getsockname()[1]}"


def get_coordinator(name: str = DEFAULT_NAME, namespace: str = DEFAULT_NAMESPACE) -> "ray.actor.ActorHandle":
    """The running coordinator actor; ValueError naming it when there is none."""
    try:
        return ray.get_actor(name, namespace=namespace)
    except ValueError:
        raise ValueError(f"no coordinator actor named {name!r} in Ray namespace {namespace!r}; "
                         "start one with `rankscope coordinator` or `rankscope launch`") from None


def stop_coordinator(handle: "ray.actor.ActorHandle", timeout_s: float = 30.0) -> None:
    """Let the actor close its sockets and flush incident state, then kill it.

    Never raises: it runs in ``finally`` blocks, where the actor may already be gone.
    """
    try:
        ray.get(handle.shutdown.remote(), timeout=timeout_s)
    except Exception:  # noqa: BLE001 - already dead or unreachable: kill it anyway
        pass
    try:
        ray.kill(handle)
    except Exception:  # noqa: BLE001
        pass
