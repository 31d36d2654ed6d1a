"""Pick the right reader for a path given to `vigil diagnose`: probe run directory or FR dumps.

For a probe directory of a job that is still running on this host (a torchrun job that installed the
probe itself), the ranks' stacks are read live with py-spy, as `vigil launch` would have.
"""

from __future__ import annotations

import socket
from pathlib import Path

import psutil

from vigil.diagnose.hang import HangDiagnosis, RunEvidence, diagnose, load_run
from vigil.diagnose.stacks import from_pyspy
from vigil.model import VigilInputError
from vigil.probe.records import RUN_FILE


def diagnose_path(path: Path) -> HangDiagnosis:
    if not path.exists():
        raise VigilInputError(f"{path} does not exist")
    if path.is_dir() and ((path / RUN_FILE).exists() or any(path.glob("rank*.json"))):
        run = load_run(path)
        if not (path / RUN_FILE).exists():
            read_live_stacks(run)
        return diagnose(run)
    from vigil.diagnose.flight_recorder import diagnose_dumps

    return diagnose_dumps(path)


def read_live_stacks(run: RunEvidence) -> None:
    """py-spy the ranks that still run here; keeps the probe's own stacks where py-spy cannot read."""
    from vigil.probe.pyspy import dump_all

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
