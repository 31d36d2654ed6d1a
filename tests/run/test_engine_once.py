"""`vigil engine --once` as a real process on a real store (SQLite, PostgreSQL) after servers died mid-drain: it
resumes the drain left started at start, the one a peer left meanwhile in its tick's round, and exits 0 once that
round has ended - not while the round's drain is still evicting."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.remedy.claims import database as database
from tests.remedy.held_slurm import acting_env, crashed_drain_of, held_slurm, place_cluster
from tests.serve.conftest import REPO
from tests.serve.conftest import postgres_url as postgres_url
from vigil.model import ActionStatus
from vigil.remedy.audit import AuditLog

pytestmark = pytest.mark.slow


def test_engine_once_resumes_runs_left_started_and_exits_after_its_round(database: str, tmp_path: Path) -> None:
    """A killed server's drain of n1 is resumed at start (the engine's start waits for it); while it evicts, another
    killed server's drain of n2 appears, which the tick's round on its own thread takes over. The process is still
    there while that drain evicts, and exits 0 with the tick's report once it ends, both runs closed executed."""
    place_cluster(database)
    crashed_drain_of(database, "n1")
    home = tmp_path / "home"
    home.mkdir()
    with held_slurm(tmp_path / "slurm") as slurm:
        engine = subprocess.Popen([sys.executable, "-m", "vigil", "engine", "--once"], cwd=REPO,
                                  env=acting_env(home, database, slurm), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        try:
            wait_for(lambda: slurm.draining("n1") or engine.poll() is not None, 120, "the start to resume n1")
            assert engine.poll() is None, engine.communicate()
            crashed_drain_of(database, "n2")  # read by no round yet: the start read the journal before
            slurm.release()
            wait_for(lambda: slurm.draining("n2") or engine.poll() is not None, 60, "the tick's round to resume n2")
            assert engine.poll() is None, engine.communicate()
            with pytest.raises(subprocess.TimeoutExpired):
                engine.wait(timeout=1.0)
            slurm.release()
            out, err = engine.communicate(timeout=60)
        finally:
            if engine.poll() is None:
                engine.kill()
                engine.communicate()
    assert engine.returncode == 0, err
    assert "resumed 1 interrupted action(s)" in err
    assert out.startswith("events 0, pushes 0, anomalies 0"), out
    audit = AuditLog(database)
    assert audit.unfinished() == []
    records = {a.id: a for a in audit.actions()}
    assert {k: a.status for k, a in records.items()} == {"act-drain-n1": ActionStatus.EXECUTED,
                                                         "act-drain-n2": ActionStatus.EXECUTED}
    assert all(a.params["taken_over_from"] == "vigil-api-killed" for a in records.values())
