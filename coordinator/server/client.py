"""``Coordinator``: the one handle every command uses on a running coordinator.

The commands (launch, coordinator, status and the control verbs, bench) never call Ray
themselves: they connect (:func:`connect_ray`), start or find a coordinator and call
plain methods whose failures are :class:`CoordinatorError` with one readable line, not a
remote traceback.
"""
from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import tempfile
from typing import Any, Iterator

from rankscope.coordinator.server.actor import DEFAULT_NAME, DEFAULT_NAMESPACE

log = logging.getLogger(__name__)


class CoordinatorError(RuntimeError):
    """A coordinator call failed; the message is one line for a terminal."""


def connect_ray(address: str | None, namespace: str = DEFAULT_NAMESPACE, *, num_cpus: int | None = None,
                verbose: bool = False) -> bool:
    """Join the Ray cluster at ``address`` or, with ``None``, start a private local one.

    Returns whether this process started the cluster (and so must shut it down). Never
    joins a cluster it was not told about: a local Ray found by chance belongs to
    another job. Ray's own log lines are shown only when ``verbose``.
    """
    import ray
    quiet_ray(not verbose)
    if ray.is_initialized():
        return False
    opts: dict[str, Any] = dict(namespace=namespace, log_to_driver=False, configure_logging=False)
    if address is None:
        # "local", not None: None would join whatever cluster RAY_ADDRESS or Ray's
        # last-started record points at, i.e. another job's.
        with _ray_output(verbose):
            ray.init(address="local", include_dashboard=False, num_cpus=num_cpus, **opts)
        return True
    _token_auth_if_available()
    unreachable = _unreachable(address)
    if unreachable:
        # Ray itself would retry for minutes, printing its own warnings meanwhile.
        raise CoordinatorError(f"no Ray cluster at {address!r}: {unreachable}")
    try:
        with _ray_output(verbose):
            ray.init(address=address, **opts)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise CoordinatorError(f"no Ray cluster at {address!r}: {str(exc).splitlines()[0] if str(exc) else exc!r}") \
            from None
    return False


def _token_auth_if_available() -> None:
    """A local Ray started by ``ray.init()`` (as launch does) requires the token Ray saved
    in ~/.ray/auth_token; Ray itself only presents it when it found the cluster on its own
    (address None/"auto"), not for an address given. Present it whenever one exists:
    a cluster without token auth accepts the connection all the same."""
    if os.environ.get("RAY_AUTH_MODE"):
        return  # the user chose
    try:  # Ray's own switch (it also refreshes Ray's cached config, which the variable alone does not)
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )
    except ImportError:  # a Ray without token auth
        return
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def _unreachable(address: str, timeout_s: float = 5.0) -> str | None:
    """Why nothing answers at a ``host:port`` address (None if something does, or if the
    address is one only Ray can interpret, such as ``auto``)."""
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    if not host or not port.isdigit():
        return None
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        return exc.strerror or str(exc) or type(exc).__name__
    return None


@contextlib.contextmanager
def _ray_output(verbose: bool) -> Iterator[None]:
    """Ray's C++ side writes its connection retries straight to file descriptor 2: while
    it starts, that goes to a file unless ``verbose``. (Processes it starts then inherit
    the file, not the terminal; they log to Ray's session folder anyway.)"""
    if verbose:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def quiet_ray(quiet: bool = True) -> None:
    """Ray's warnings (token authentication, start-up notes) are about Ray, not about the
    job: a user of these commands sees them only when asking for them."""
    logging.getLogger("ray").setLevel(logging.ERROR if quiet else logging.NOTSET)


def disconnect_ray() -> None:
    import ray
    if ray.is_initialized():
        ray.shutdown()


def ray_address() -> str | None:
    import ray
    try:
        return ray.get_runtime_context().gcs_address
    except Exception:  # noqa: BLE001 - only used for messages
        return None


class Coordinator:
    """A running coordinator actor. Methods block up to ``timeout`` seconds."""

    def __init__(self, handle: Any, name: str, namespace: str) -> None:
        self.handle, self.name, self.namespace = handle, name, namespace

    # --- finding one ------------------------------------------------------------------
    @classmethod
    def start(cls, export_dir: str, cluster: dict, *, name: str = DEFAULT_NAME,
              namespace: str = DEFAULT_NAMESPACE, bind: str = "tcp://127.0.0.1:0", detached: bool = False,
              job: str | None = None, curve: dict | None = None, config: dict | None = None) -> "Coordinator":
        """Start the named coordinator (or join the running one of that name)."""
        from rankscope.coordinator.server.actor import start_coordinator
        try:
            handle = start_coordinator(export_dir, cluster, name=name, namespace=namespace, bind=bind,
                                       detached=detached, job=job, curve=curve, config=config)
        except Exception as exc:  # noqa: BLE001 - a bind or settings error inside the actor
            raise CoordinatorError(f"the coordinator did not start: {_cause(exc)}") from None
        return cls(handle, name, namespace)

    @classmethod
    def find(cls, name: str | None = None, namespace: str = DEFAULT_NAMESPACE, job: str | None = None) -> "Coordinator":
        """The coordinator named ``name``, or the one serving ``job``, or the only one there
        is; CoordinatorError naming the candidates when that is ambiguous."""
        import ray
        if name is not None:
            try:
                return cls(ray.get_actor(name, namespace=namespace), name, namespace)
            except ValueError:
                raise CoordinatorError(f"no coordinator named {name!r} in Ray namespace {namespace!r}; "
                                       "start one with `rankscope coordinator` or `rankscope launch`") from None
        found = sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                       if a.get("namespace") == namespace and a["name"].startswith("rankscope"))
        if job is not None and f"rankscope-{job}" in found:
            found = [f"rankscope-{job}"]
        if len(found) != 1:
            if not found:
                raise CoordinatorError(f"no rankscope coordinator in Ray namespace {namespace!r}")
            raise CoordinatorError(f"several coordinators in Ray namespace {namespace!r} "
                                   f"({', '.join(found)}): pick one with --name or --job")
        return cls(ray.get_actor(found[0], namespace=namespace), found[0], namespace)

    # --- calls ------------------------------------------------------------------------
    def _call(self, method: str, *args: Any, timeout: float = 30.0) -> Any:
        import ray
        try:
            return ray.get(getattr(self.handle, method).remote(*args), timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise CoordinatorError(f"the coordinator did not answer {method} within {timeout:g} s") from None
        except ray.exceptions.RayActorError:
            raise CoordinatorError(f"the coordinator {self.name!r} is gone (its actor died)") from None
        except ray.exceptions.RayTaskError as exc:
            cause = _cause(exc)
            if isinstance(getattr(exc, "cause", None), ValueError):
                raise ValueError(cause) from None  # the coordinator refused the arguments
            raise CoordinatorError(f"{method} failed in the coordinator: {cause}") from None

    def endpoint(self, timeout: float = 30.0) -> str:
        return self._call("endpoint", timeout=timeout)

    def status(self, timeout: float = 30.0, brief: bool = False) -> dict:
        """``brief``: without the per-rank rows (cheap to poll on a large job)."""
        return self._call("status", brief, timeout=timeout)

    def control(self, command: str, args: dict | None = None, timeout: float = 30.0) -> dict:
        """ValueError when the coordinator refuses the command or its arguments."""
        return self._call("control", command, dict(args or {}), timeout=timeout)

    def console(self, what: str, args: dict | None = None, timeout: float = 30.0) -> Any:
        """What the live console reads or sets (service_console.QUERIES); ValueError when
        the coordinator refuses the arguments."""
        return self._call("console", what, dict(args or {}), timeout=timeout)

    def incidents(self, timeout: float = 30.0) -> list[dict]:
        return self._call("incidents", timeout=timeout)

    def drain(self, within_s: float = 30.0, timeout: float = 120.0) -> list[dict]:
        """Judge everything pending, let open incidents finish (up to ``within_s``)."""
        return self._call("drain", within_s, timeout=timeout)

    def alive(self, timeout: float = 30.0) -> bool:
        try:
            return bool(self._call("ping", timeout=timeout))
        except CoordinatorError:
            return False

    def stop(self, timeout_s: float = 30.0) -> None:
        """Close its sockets, flush incident state, end the actor. Never raises."""
        from rankscope.coordinator.server.actor import stop_coordinator
        stop_coordinator(self.handle, timeout_s=timeout_s)


def _cause(exc: BaseException) -> str:
    """The innermost error's own message, without a remote traceback or colour codes."""
    cause = getattr(exc, "cause", None) or exc
    text = str(cause).strip().splitlines()
    line = text[-1] if text else type(cause).__name__
    return line.replace("\x1b[31m", "").replace("\x1b[39m", "").strip()
