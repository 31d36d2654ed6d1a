"""The lease on an executing action and its renewal interval are settings (remedy_lease_s, remedy_lease_renew_s),
read where the rest of the remedy engine's are: `vigil serve`, `vigil engine` and `vigil mcp` build their
remediator with them; a renewal not shorter than the lease, or a value that is not a positive number, stops the
command with one line (exit 2)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from tests.remedy.claims import CountingActuator, FakeClock
from tests.remedy.claims import database as database
from tests.serve.conftest import postgres_url as postgres_url
from vigil.config import Settings
from vigil.model import Action, ActionKind, ActionStatus, Topology
from vigil.remedy.acting import remediator_for
from vigil.remedy.audit import AuditLog
from vigil.remedy.lifecycle import LifecycleStore
from vigil.remedy.remediator import Remediator
from vigil.store.schema import remedy_intents


def test_the_server_s_remediator_takes_its_lease_from_the_settings(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, execute_actions=True, remedy_lease_s=90.0, remedy_lease_renew_s=20.0)
    remediator = remediator_for("slurm", settings, Topology(), LifecycleStore(settings.database_url()), "vigil-api")
    assert remediator is not None and (remediator.lease_s, remediator.renew_s) == (90.0, 20.0)
    defaults = remediator_for("slurm", Settings(home=tmp_path), Topology(), LifecycleStore(settings.database_url()),
                              "vigil-api")
    assert defaults is not None and (defaults.lease_s, defaults.renew_s) == (30.0, 10.0)


def test_the_owner_renews_at_the_configured_interval(tmp_path: Path) -> None:
    """A 60 s lease renewed every 5 s: the claim taken at 1000 holds until 1060, and until 1065 after the renewal
    at 1005 (with the renewal every third of the lease, as before, it would still read 1060)."""
    database = f"sqlite:///{tmp_path / 'vigil.db'}"
    clock = FakeClock(1_000.0)
    leases: list[float | None] = []

    def drain_in_flight() -> None:
        leases.append(AuditLog(database).unfinished_runs()[0].lease_expires)
        clock.advance(5.0)
        leases.append(AuditLog(database).unfinished_runs()[0].lease_expires)

    runs: list[str] = []
    owner = Remediator([CountingActuator(runs, during=drain_in_flight)], AuditLog(database), dry_run=False,
                       clock=clock, wait=clock.wait, lease_s=60.0, renew_s=5.0)
    done = owner.execute(Action(ts=1_000.0, kind=ActionKind.DRAIN, target="node/n1", reason="Xid 79"))
    assert done.status is ActionStatus.EXECUTED and leases == [1_060.0, 1_065.0]


def test_a_remediator_refuses_a_renewal_not_shorter_than_its_lease(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="less than the lease"):
        Remediator([], AuditLog(f"sqlite:///{tmp_path / 'vigil.db'}"), lease_s=10.0, renew_s=10.0)


@pytest.mark.parametrize("verb, config, env, expected", [
    ("engine", "remedy_lease_s: 30\nremedy_lease_renew_s: 30\n", {}, "expected less than remedy_lease_s (30 s)"),
    ("serve", "remedy_lease_s: 20\nremedy_lease_renew_s: 25\n", {}, "expected less than remedy_lease_s (20 s)"),
    ("engine", "", {"VIGIL_REMEDY_LEASE_S": "-5"}, "remedy_lease_s"),
], ids=["engine-renewal-as-long-as-the-lease", "serve-renewal-longer", "engine-negative-lease-from-env"])
def test_bad_lease_settings_stop_the_command_with_one_line(tmp_path: Path, verb: str, config: str,
                                                           env: dict[str, str], expected: str) -> None:
    path = tmp_path / "vigil.yaml"
    path.write_text(f"home: {tmp_path}\n{config}")
    args = ["--once"] if verb == "engine" else ["--no-engine", "--port", "1"]
    proc = subprocess.run([sys.executable, "-m", "vigil", verb, "--config", str(path), *args], capture_output=True,
                          text=True, env={**os.environ, **env, "COLUMNS": "200"}, timeout=120)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    (line,) = proc.stderr.strip().splitlines()
    assert expected in line and "Traceback" not in proc.stderr, line


@pytest.fixture
def lease_of_600_s(monkeypatch: pytest.MonkeyPatch, database: str, tmp_path: Path) -> Iterator[str]:
    """The process's settings (VIGIL_*) on ``database``: a 600 s lease renewed every 60 s."""
    from vigil.config import settings

    for key, value in {"VIGIL_HOME": str(tmp_path / "home"), "VIGIL_DB_URL": database,
                       "VIGIL_REMEDY_LEASE_S": "600", "VIGIL_REMEDY_LEASE_RENEW_S": "60"}.items():
        monkeypatch.setenv(key, value)
    settings.cache_clear()
    yield database
    settings.cache_clear()


def journalled_leases(database: str) -> list[float]:
    """How long each run in the execution journal was claimed for when it began."""
    c = remedy_intents.c
    with AuditLog(database).engine.connect() as conn:
        return [row.lease_expires - row.started for row in conn.execute(select(c.started, c.lease_expires))]


def test_the_failover_supervisor_holds_its_runs_for_the_configured_lease(lease_of_600_s: str, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """`vigil launch job`'s failover supervisor (built by run_job, the command's body) claims a run for
    remedy_lease_s, as the server and the engine do (before: 30 s whatever the settings, so a peer could take a long
    restart over after 30 s). The supervisor's run is one alert here: the job itself is test_failover.py's."""
    from tests.remedy.failover_jobs import tiny_job
    from vigil.remedy.jobspec import TrainingJob
    from vigil.run.failover import FailoverReport, FailoverSupervisor, run_job

    seen: list[tuple[float, float]] = []

    def one_alert(supervisor: FailoverSupervisor) -> FailoverReport:
        seen.append((supervisor.remediator.lease_s, supervisor.remediator.renew_s))
        done = supervisor.remediator.execute(Action(ts=0.0, kind=ActionKind.ALERT, target="job/leased",
                                                    reason="failover retries spent"))
        return FailoverReport(job="leased", succeeded=done.status is ActionStatus.EXECUTED, attempts=1)

    monkeypatch.setattr(FailoverSupervisor, "run", one_alert)
    monkeypatch.setattr("vigil.run.failover.load_jobspec", lambda _path: tiny_job("leased"))
    assert isinstance(tiny_job("leased"), TrainingJob)
    report = run_job(tmp_path / "job.yaml", tmp_path / "run")
    assert report.succeeded and seen == [(600.0, 60.0)]
    assert journalled_leases(lease_of_600_s) == [600.0]


def test_checkpoint_clean_holds_its_runs_for_the_configured_lease(lease_of_600_s: str, tmp_path: Path) -> None:
    """`vigil checkpoint clean --execute` claims each deletion's run for remedy_lease_s (before: 30 s)."""
    from tests.checkpoint.checkpoint_dirs import make_checkpoints
    from vigil.faces.cli.main import app

    ckpt = make_checkpoints(tmp_path)
    done = CliRunner().invoke(app, ["checkpoint", "clean", str(ckpt), "--keep-last", "2", "--execute", "--json"])
    assert done.exit_code == 0, done.output
    assert journalled_leases(lease_of_600_s) == [600.0] * 5


def test_a_remediator_given_no_lease_reads_no_settings(lease_of_600_s: str) -> None:
    """The lease is its caller's to pass (``lease_of`` the settings it runs under): a remediator given none holds its
    runs for the settings' defaults, 30 s renewed every 10 s, whatever the process's settings say (600 s here) - it
    read the process's settings itself before, a global no caller saw."""
    remediator = Remediator([CountingActuator([])], AuditLog(lease_of_600_s), dry_run=False)
    assert (remediator.lease_s, remediator.renew_s) == (30.0, 10.0)
    done = remediator.execute(Action(ts=0.0, kind=ActionKind.DRAIN, target="node/n1", reason="Xid 79"))
    assert done.status is ActionStatus.EXECUTED
    assert journalled_leases(lease_of_600_s) == [30.0]


def test_self_check_holds_its_runs_for_the_configured_lease(lease_of_600_s: str) -> None:
    """`vigil remedy self-check --failed --execute`, the repairs spent: the vendor ticket goes out through a remediator
    holding its run for remedy_lease_s, passed in from the settings."""
    from vigil.faces.cli.main import app
    from vigil.remedy.lifecycle import Trigger

    LifecycleStore(lease_of_600_s).apply("node/n1", Trigger.CORDON, "Xid 79")
    LifecycleStore(lease_of_600_s).apply("node/n1", Trigger.REPAIR, "Xid 79")
    for _ in range(2):  # the lifecycle's max_repairs
        done = CliRunner().invoke(app, ["remedy", "self-check", "node/n1", "--failed", "--execute"])
        assert done.exit_code == 0, done.output
    assert "vendor_repair" in done.output
    assert journalled_leases(lease_of_600_s) == [600.0]
