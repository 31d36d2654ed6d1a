"""`vigil engine` SIGKILLed while its resumed drain's scontrol runs (no exit handler runs): the next engine, taking the
run over once the lease lapsed, kills the scontrol's group (a drain: run again to the same end) before it drains
again - never two drains at once, nothing left running. Real processes on SQLite and PostgreSQL."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.remedy.claims import database as database
from tests.remedy.held_slurm import HeldSlurm, acting_env, crashed_drain_of, held_slurm, place_cluster
from tests.serve.conftest import REPO
from tests.serve.conftest import postgres_url as postgres_url
from vigil.model import ActionStatus
from vigil.remedy.audit import AuditLog
from vigil.remedy.commands import commands_of, start_time

pytestmark = pytest.mark.slow

LEASE = {"VIGIL_REMEDY_LEASE_S": "3", "VIGIL_REMEDY_LEASE_RENEW_S": "1"}


def engine(home: Path, database: str, slurm: HeldSlurm, err: list[str]) -> subprocess.Popen[str]:
    process = subprocess.Popen([sys.executable, "-m", "vigil", "engine"], cwd=REPO,
                               env=acting_env(home, database, slurm, **LEASE), stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    stderr = process.stderr
    assert stderr is not None
    threading.Thread(target=lambda: err.extend(iter(stderr.readline, "")), daemon=True).start()
    return process


def running(pid: int, started: int | None) -> bool:
    return started is not None and start_time(pid) == started


def test_a_sigkilled_engines_drain_is_killed_by_the_next_owner_before_it_drains_again(database: str,
                                                                                      tmp_path: Path) -> None:
    place_cluster(database)
    home = tmp_path / "home"
    home.mkdir()
    err: list[str] = []
    with held_slurm(tmp_path / "slurm") as slurm:
        crashed_drain_of(database, "n1")
        first = engine(home, database, slurm, err)
        second = None
        try:
            wait_for(lambda: slurm.draining("n1") or first.poll() is not None, 120, "the first engine's drain")
            assert first.poll() is None, err
            old = slurm.drain_pid("n1")
            old_started = start_time(old)
            first.kill()  # SIGKILL: no exit handler runs, the scontrol in its own session goes on
            first.wait(30)
            assert running(old, old_started), "the drain ended with the engine: nothing to take over"
            second = engine(home, database, slurm, err)
            wait_for(lambda: slurm.drain_pid("n1") != old or second.poll() is not None, 120,
                     "the second engine to take the run over and drain again")
            assert second.poll() is None, err
            assert not running(old, old_started), "the first engine's scontrol still runs beside the second's"
            slurm.release()
            audit = AuditLog(database)
            wait_for(lambda: [a.status for a in audit.actions()] == [ActionStatus.EXECUTED]
                     or second.poll() is not None, 60, "the resumed drain to be recorded")
        finally:
            for process in (first, second):
                if process is not None and process.poll() is None:
                    process.kill()  # the engines this test started
                    process.wait()
    calls = (slurm.state_dir / "calls.log").read_text()
    assert "overlap" not in calls, calls
    assert calls.count("update nodename=n1") == 2, calls
    [action] = AuditLog(database).actions()
    assert action.status is ActionStatus.EXECUTED, action
    [earlier] = action.params["earlier_commands"]
    assert (earlier["pid"], earlier["state"]) == (old, "killed"), earlier
    rows = commands_of(AuditLog(database).engine, "act-drain-n1")
    assert [r["state"] for r in rows if r["argv"][1] == "update"] == ["killed", "ended"], rows
    assert all(r["start_time"] is not None and r["host"] for r in rows if r["state"] != "starting"), rows
