"""The job's config: the one ``--config`` every rank of a job takes its settings from.

``rankscope launch --config X`` (or ``rankscope coordinator --config X`` on several nodes)
is the one place a job is configured. :func:`job_config` is that file as the job runs it
(checked whole, ``--on-divergence`` applied, launch's defaults where no file was given);
launch writes it where every rank's ``RANKSCOPE_CONFIG`` points, and the coordinator
hands it to every node agent (``rankscope.wire.job_config``), so a rank under
``launch --agent`` reads the very same settings.

A rank whose code names its own config (``PrecisionDebugger(config_path=...)``) keeps it,
as in msProbe, except for the :data:`CLUSTER_WIDE` settings: those are the job's,
because the coordinator acts on the job's. :func:`disagreements` says where the two differ.
"""
from __future__ import annotations

import copy
import dataclasses
import os
from typing import Any, Mapping

from rankscope.config.cluster import ClusterSettings, parse_cluster
from rankscope.config.file import read_config_file
from rankscope.config.msprobe import DebuggerConfig, config_from_dict

#: What a rank under launch captures when no config file was given: per-layer (Cell)
#: statistics, so a verdict names a layer, plus the sentinels (on by default).
LAUNCH_DEFAULTS: dict[str, Any] = {"level": "L0"}

#: Settings one job has one value of: how ranks are grouped and judged and what happens
#: at a verdict. A rank's own config cannot change them; the job's are in force.
CLUSTER_WIDE = ("groups", "layout", "on_divergence", "on_terminate", "deadline_s", "max_pending_steps", "max_pending_mb",
                "pause_timeout_s", "export_timeout_s", "hang_timeout_s", "failure_settle_s",
                "teardown_window_s", "detectors", "watchpoints")


def job_config(config_path: str | os.PathLike | None, on_divergence: str | None = None) -> dict:
    """The whole config the job runs with: the file's every section (checked, since the
    ranks read it), or :data:`LAUNCH_DEFAULTS` without one; ``on_divergence`` overriding
    the file's (``pause`` when neither says)."""
    raw: dict = dict(LAUNCH_DEFAULTS) if config_path is None else read_config_file(config_path)
    return with_cluster(raw, on_divergence)


def with_cluster(raw: dict, on_divergence: str | None = None) -> dict:
    """``raw`` checked, with its cluster section's ``on_divergence`` settled."""
    raw = copy.deepcopy(raw)
    section = dict(raw.get("cluster") or {})
    if on_divergence:
        section["on_divergence"] = on_divergence
    section.setdefault("on_divergence", "pause")
    raw["cluster"] = section
    config_from_dict(raw)
    return raw


def checked_job_config(config: Any) -> dict | None:
    """``config`` if it is a job config this process can run, else None (and why, logged):
    a node agent older than its coordinator keeps what it had rather than guess."""
    import logging

    from rankscope.config.errors import ConfigError
    if config is None:
        return None
    try:
        config_from_dict(config)
    except (ConfigError, TypeError) as exc:
        logging.getLogger(__name__).error("the job config received cannot be used here: %s", exc)
        return None
    return config


def job_cluster_section(config_path: str | os.PathLike | None, on_divergence: str | None = None) -> dict:
    """The ``cluster`` section a coordinator runs with (see :func:`job_config`)."""
    return dict(job_config(config_path, on_divergence)["cluster"])


def disagreements(own: ClusterSettings, job: ClusterSettings) -> list[tuple[str, Any, Any]]:
    """(setting, the rank's value, the job's value) for every cluster-wide setting that
    differs (defaults count: a rank silent on one agrees only with the job's default)."""
    return [(key, getattr(own, key), getattr(job, key)) for key in CLUSTER_WIDE
            if getattr(own, key) != getattr(job, key)]


def in_force(own: ClusterSettings, job: ClusterSettings) -> ClusterSettings:
    """The rank's cluster settings with the job's cluster-wide ones put in."""
    keys = [k for k in CLUSTER_WIDE if getattr(own, k) != getattr(job, k)]
    if not keys:
        return own
    section = dict(own.section)
    for key in keys:
        if key in job.section:
            section[key] = job.section[key]
        else:
            section.pop(key, None)
    return dataclasses.replace(own, section=section, **{k: getattr(job, k) for k in keys})


def cluster_of(raw: dict) -> ClusterSettings:
    return parse_cluster(raw.get("cluster"))


def say_value(value: Any) -> str:
    """A setting's value as a user wrote it."""
    if hasattr(value, "value") and isinstance(value.value, str):
        return repr(value.value)
    return repr(value) if isinstance(value, str) else str(value)


def rank_config(config_path: str | os.PathLike | None = None, *, task: str | None = None,
                dump_path: str | None = None, level: str | None = None, step: list | None = None,
                env: Mapping[str, str] | None = None) -> tuple[DebuggerConfig, str | None]:
    """The config a rank's PrecisionDebugger runs with, and what to tell the user about it.

    Arguments win, as in msProbe. Under launch (``RANKSCOPE_CONFIG``) a debugger given no
    config file reads the job's, and dumps under the export folder (``RANKSCOPE_DUMP_PATH``)
    unless its code or its own config file names a dump path. A rank's own config file
    keeps its capture settings, but the :data:`CLUSTER_WIDE` ones are the job's: where they
    differ, the second value says so and which value is in force."""
    from rankscope.wire.job_config import CONFIG_ENV, DUMP_PATH_ENV
    env = os.environ if env is None else env
    job_path = env.get(CONFIG_ENV) or None
    own = config_path is not None and (job_path is None or not _same_file(config_path, job_path))
    path = config_path if config_path is not None else job_path
    raw = read_config_file(path) if path is not None else {}
    if dump_path is None and env.get(DUMP_PATH_ENV) and not (own and raw.get("dump_path")):
        dump_path = env[DUMP_PATH_ENV]
    cfg = config_from_dict(raw, task=task, dump_path=dump_path, level=level, step=step)
    if not own or job_path is None:
        return cfg, None
    try:
        job = cluster_of(read_config_file(job_path))
    except Exception as exc:  # noqa: BLE001 - the rank's own config still works
        return cfg, f"the job's config {job_path} cannot be read ({exc}): this rank's own cluster settings apply"
    # Said only for what the rank's file sets: one silent on a setting (an msProbe config
    # has no cluster section) overrides nothing the user wrote, and takes the job's quietly.
    written = set(raw.get("cluster") or {})
    diffs = [d for d in disagreements(cfg.cluster, job) if d[0] in written]
    cfg.cluster = in_force(cfg.cluster, job)
    if not diffs:
        return cfg, None
    said = "; ".join(f"{key}: {say_value(mine)} here, {say_value(theirs)} for the job"
                     if key not in ("detectors", "watchpoints") else f"{key}: not the same"
                     for key, mine, theirs in diffs)
    return cfg, (f"this rank's config {os.fspath(config_path)} disagrees with the job's "
                 f"(rankscope launch/coordinator --config) on {said}. The job's values are in force: "
                 "the coordinator judges every rank by them")


def _same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)
