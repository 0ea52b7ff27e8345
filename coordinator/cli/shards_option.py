"""``--shards K``: the coordinator's ingest shard count, one definition for every command
that starts a coordinator (``rankscope coordinator``, ``rankscope launch``).

Which count wins: the flag, else the config file's ``cluster.shards``, else
``RANKSCOPE_SHARDS`` (read where the coordinator starts:
:func:`rankscope.coordinator.server.actor.shards_from_env`), else 1.
"""
from __future__ import annotations

import argparse

from rankscope.wire.shards import MAX_SHARDS, check_shard_count

HELP = (f"ingest shard actors of the coordinator, 1-{MAX_SHARDS}: record kinds are dealt over K Ray actors "
        "and one verdict actor merges their findings (default: the config's cluster.shards, else "
        "RANKSCOPE_SHARDS, else 1)")


def shard_count(text: str) -> int:
    """argparse ``type``: the count, or an error naming what was wrong."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer from 1 to {MAX_SHARDS}, got {text!r}") from None
    try:
        return check_shard_count(value, "--shards")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_shards_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shards", type=shard_count, default=None, metavar="K", help=HELP)


def apply_shards(job: dict, shards: int | None) -> dict:
    """The job config with ``--shards`` (when given) over its cluster section's."""
    if shards is not None:
        job["cluster"] = {**job.get("cluster", {}), "shards": shards}
    return job
