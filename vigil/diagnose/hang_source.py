"""Pick the right reader for a path given to `vigil diagnose`: probe run directory, FR dumps, or a JSON
file of NCCL proxy states.

For a probe directory of a job that is still running on this host (a torchrun job that installed the
probe itself), the ranks' stacks are read live with py-spy, as `vigil launch` would have.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import psutil

from vigil.diagnose.hang import HangDiagnosis, RunEvidence, diagnose, load_run
from vigil.diagnose.p2p import analyse, states_from_nccl_proxy
from vigil.diagnose.stacks import from_pyspy
from vigil.model import Evidence, VigilInputError, rank_id
from vigil.sources.probe.records import RUN_FILE


def diagnose_path(path: Path) -> HangDiagnosis:
    if not path.exists():
        raise VigilInputError(f"{path} does not exist")
    if path.is_file() and path.suffix == ".json":
        return diagnose_proxy_states(path)
    if path.is_dir() and ((path / RUN_FILE).exists() or any(path.glob("rank*.json"))):
        run = load_run(path)
        if not (path / RUN_FILE).exists():
            read_live_stacks(run)
        return diagnose(run)
    from vigil.diagnose.flight_recorder import diagnose_dumps

    return diagnose_dumps(path)


def diagnose_proxy_states(path: Path) -> HangDiagnosis:
    """A JSON list of NCCL proxy sub-op counters (one object per rank, peer, channel and op)."""
    try:
        records = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise VigilInputError(f"{path} is not valid JSON: {err.msg} at line {err.lineno}") from None
    if isinstance(records, dict):
        records = records.get("nccl_proxy")
    if not isinstance(records, list):
        raise VigilInputError(f"{path}: expected a list of NCCL proxy states (or {{'nccl_proxy': [...]}})")
    states = states_from_nccl_proxy(records)
    analysis = analyse(states)
    world = max((max(s.rank, s.peer) for s in states), default=-1) + 1
    if not analysis.links:
        return HangDiagnosis(verdict="ok", summary="every send and recv made progress", world_size=world)
    reasons = "; ".join(link.reason for link in analysis.links)
    rings = ", ".join(f"channel {c}: {' -> '.join(map(str, order))}" for c, order in sorted(analysis.rings.items()))
    return HangDiagnosis(
        verdict="hang",
        hang_kind="p2p",
        culprit_ranks=analysis.culprit_ranks,
        culprit_links=analysis.culprit_links,
        summary=f"hang in point-to-point traffic: {reasons} (rings {rings})",
        world_size=world,
        evidence=[
            Evidence(kind="hang", entity=rank_id("local", link.culprit if link.culprit is not None else link.src),
                     ts=time.time(), summary=link.reason, attrs=link.to_dict())
            for link in analysis.links
        ],
    )


def read_live_stacks(run: RunEvidence) -> None:
    """py-spy the ranks that still run here; keeps the probe's own stacks where py-spy cannot read."""
    from vigil.sources.probe.pyspy import dump_all

    host = socket.gethostname()
    live = {
        rank: snap.pid
        for rank, snap in run.snapshots.items()
        if snap.host == host and not snap.finished and psutil.pid_exists(snap.pid)
    }
    if not live:
        return
    dumps = dump_all(live)
    if dumps.dumps:
        for rank, dump in dumps.dumps.items():
            run.stacks[rank] = from_pyspy(dump)
        run.stack_source = "py-spy"
