"""The ``cluster`` section a coordinator runs with, from ``--config`` and the command line."""
from __future__ import annotations

import os

from rankscope.config.cluster import parse_cluster
from rankscope.config.file import read_config_file
from rankscope.config.msprobe import config_from_dict


def job_cluster_section(config_path: str | os.PathLike | None, on_divergence: str | None = None) -> dict:
    """The ``cluster`` section a coordinator runs with: the file's (every section of the
    file checked, since the ranks read it too), ``on_divergence`` overriding it."""
    section: dict = {}
    if config_path is not None:
        raw = read_config_file(config_path)
        config_from_dict(raw)
        section = dict(raw.get("cluster") or {})
    if on_divergence:
        section["on_divergence"] = on_divergence
    section.setdefault("on_divergence", "pause")
    parse_cluster(section)
    return section
