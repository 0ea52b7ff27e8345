"""A debugger's link to its node agent: registering the rank, answering an export, and
saying what the rank sees of the job's parallel layout."""
from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from rankscope.probe.rank_env import env_int, resolve_dp_index, world_size
from rankscope.wire.layout_facts import WHAT as LAYOUT


def connect(dbg: Any, endpoint: str) -> None:
    """Register ``dbg``'s rank with the node agent at ``endpoint``; on an answer the rank
    takes the (possibly remapped) id it was given."""
    try:
        from rankscope.client.agent_client import AgentClient
        from rankscope.client.claim import RankClaim
    except ImportError:
        return  # the node-agent client is not part of this build
    from rankscope.probe import stack_signal
    from rankscope.probe.rank_env import dp_size_from_env
    client = AgentClient(endpoint, dbg.job, dbg.gate, on_export=lambda incident: export_bundle(dbg, incident),
                         sync=dbg.sync)
    dp_index, _ = resolve_dp_index(dbg.config.cluster.dp_index)
    claim = RankClaim(host=socket.gethostname(), pid=os.getpid(), claimed_rank=dbg.rank,
                      world_size=env_int("RANK_SIZE") or env_int("WORLD_SIZE") or world_size(),
                      dp_index=dp_index, dp_size=dp_size_from_env(), device_id=env_int("DEVICE_ID"),
                      local_rank=env_int("LOCAL_RANK"), label=dbg._label,  # noqa: SLF001
                      stacks_file=stack_signal.install(dbg.job) or "", layout=True)
    # 5 s, not 2: on a loaded node the agent's answer can take seconds, and a late
    # answer is still picked up at the next step end (see the debugger's _flush).
    assigned = client.register(claim, timeout=5.0)
    if assigned is not None:
        dbg.rank = assigned  # the node agent's (possibly remapped) id
    dbg.client = client
    dbg.sinks.append(client)


def export_bundle(dbg: Any, incident_id: str) -> list:
    """The coordinator asked for this rank's bundle: write it (the client sends it, then
    deletes this copy)."""
    from rankscope.client.transfers import export_scratch
    from rankscope.rdr.bundle import reserve_bundle_dir, write_bundle
    dbg.writer.pin_kept()  # the local dump around the incident stays for rankscope collect
    # Written only to be sent: the incident folder keeps the one copy.
    root = export_scratch(incident_id)
    label = dbg.rank if dbg.rank is not None else dbg._label  # noqa: SLF001
    directory = reserve_bundle_dir(root, label)
    _carry_replay(dbg, directory)
    bundle = write_bundle(root, label, reason=f"export for incident {incident_id}", steps=dbg.flight_recorder or (),
                          config=dbg.config.to_dict(), directory=directory)
    return [p for p in Path(bundle).rglob("*") if p.is_file()]


def _carry_replay(dbg: Any, directory: Path) -> None:
    """The record of the rank's latest re-run step goes out with its bundle (bounded by
    replay_files.MAX_BYTES), so ``rankscope rerun`` works from the incident folder alone.
    The bundle files already in the folder join its manifest."""
    from rankscope.files import replay_files
    if dbg.rank is None:
        return
    try:
        src = replay_files.newest(dbg.config.dump_path, int(dbg.rank))
        if src is not None:
            replay_files.carry(src, directory)
    except OSError as exc:  # the bundle goes out without it; rerun says the record is missing
        import sys
        print(f"[rankscope] the replay record could not join the bundle: {exc}", file=sys.stderr, flush=True)


def say_layout(dbg: Any) -> None:
    """At a step end, before the step leaves: the rank's layout facts, when they are new.
    The coordinator holds the rank's first step until they are in (REGISTER ``layout``)."""
    client, probe = dbg.client, dbg.layout
    if client is None or dbg.rank is None or not probe.due():
        return
    # Only compiled networks carry semi/auto-parallel parameter layouts.
    facts = probe.facts(dbg.graph.step_cells(), dbg.sentinels.trained_shapes())
    client.say_first("status", {"what": LAYOUT, "detail": {"rank": int(dbg.rank), "facts": facts}})


def say_dump(dbg: Any, final: bool = False) -> None:
    """What of the local dump stays on disk: once, when the retention first removes a step
    (in the rank's log too), and at the end (``final``: at close, or at the process's exit,
    before the node-agent client's own exit handler closes it)."""
    retention = dbg.writer.retention
    if retention is None or retention.removed == 0 or (dbg.dump_said and not final) or dbg.dump_final_said:
        return
    report = dbg.writer.retention_report()
    if not dbg.dump_said:
        dbg.dump_said = True
        import atexit
        import sys
        print(f"[rankscope] the local dump under {dbg.config.dump_path} {report['why']} (cluster.dump_keep_steps, "
              "dump_max_mb, dump_max_files)", file=sys.stderr, flush=True)
        atexit.register(say_dump, dbg, True)
    dbg.dump_final_said = final
    client = dbg.client
    if client is not None and dbg.rank is not None:
        try:
            client.state.outbox.put_nowait(("status", {"what": "dump", "detail": {"rank": int(dbg.rank), **report}}))
        except Exception:  # noqa: BLE001 - a full outbox: the log line stands
            pass
