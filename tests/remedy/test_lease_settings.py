"""The lease on an executing action and its renewal interval are settings (remedy_lease_s, remedy_lease_renew_s),
read where the rest of the remedy engine's are: `vigil serve`, `vigil engine` and `vigil mcp` build their
remediator with them; a renewal not shorter than the lease, or a value that is not a positive number, stops the
command with one line (exit 2)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.remedy.test_resume_claim import CountingActuator, FakeClock
from vigil.config import Settings
from vigil.model import Action, ActionKind, ActionStatus, Topology
from vigil.remedy.acting import remediator_for
from vigil.remedy.audit import AuditLog
from vigil.remedy.lifecycle import LifecycleStore
from vigil.remedy.remediator import Remediator


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
