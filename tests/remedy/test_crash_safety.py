"""kill -9 in the middle of an action, then restart: the half-done drain is resumed, and no action runs to
completion twice (the idempotency key in the execution journal)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.remedy.killed_drain import SCONTROL, kill_mid_drain, scontrol_updates
from vigil.model import Action, ActionKind, ActionStatus
from vigil.remedy.actuators.slurm import SlurmActuator
from vigil.remedy.audit import AuditLog
from vigil.remedy.remediator import Remediator


def test_kill_9_mid_drain_then_restart_resumes_once(tmp_path: Path) -> None:
    scontrol = tmp_path / "scontrol"
    url = f"sqlite:///{tmp_path / 'vigil.db'}"
    kill_mid_drain(tmp_path, scontrol, url)

    audit = AuditLog(url)
    assert [a.id for a in audit.unfinished()] == ["act-drain-n1"] and audit.actions() == []
    restarted = Remediator([SlurmActuator(scontrol=str(scontrol))], audit, dry_run=False)
    (resumed,) = restarted.recover()
    assert resumed.status is ActionStatus.EXECUTED and resumed.result.startswith("resumed after an interrupted run")
    assert audit.unfinished() == [] and scontrol_updates(tmp_path) == 2  # the killed call and the one that completed

    # A retry of the same intent (a new action record, the same idempotency key) does not run again.
    retry = Action(id="act-drain-n1-retry", ts=1.0, kind=ActionKind.DRAIN, target="node/n1",
                   params={"idempotency_key": "act-drain-n1"})
    again = restarted.execute(retry)
    assert again.status is ActionStatus.SKIPPED and "idempotency key" in again.result
    assert scontrol_updates(tmp_path) == 2
    assert [(a.id, a.status) for a in audit.actions()] == [("act-drain-n1", ActionStatus.EXECUTED),
                                                           ("act-drain-n1-retry", ActionStatus.SKIPPED)]


def test_serve_resumes_interrupted_actions_when_it_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vigil.config import Settings
    from vigil.faces.cli.serve import _resumed
    from vigil.model import Node, Topology
    from vigil.remedy.acting import remediator_for
    from vigil.remedy.lifecycle import LifecycleStore
    from vigil.store.sql import Store

    (tmp_path / "scontrol").write_text(SCONTROL.format(state=tmp_path))
    (tmp_path / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    settings = Settings(home=tmp_path, execute_actions=True)
    audit = AuditLog(settings.database_url())
    audit.begin("act-cordon-n2", Action(id="act-cordon-n2", ts=0.0, kind=ActionKind.CORDON, target="node/n2"))
    store = Store(settings.database_url())
    store.save_topology(Topology(nodes=[Node(name=f"n{i}", switch="s0") for i in range(20)]))
    lifecycle = LifecycleStore(settings.database_url())
    _resumed(remediator_for("slurm", settings.model_copy(update={"execute_actions": False}),
                            store.topology() or Topology(), lifecycle, "vigil-api"))
    assert len(audit.unfinished()) == 1 and scontrol_updates(tmp_path) == 0  # dry-run: nothing resumed
    _resumed(remediator_for("slurm", settings, store.topology() or Topology(), lifecycle, "vigil-api"))
    assert audit.unfinished() == [] and scontrol_updates(tmp_path) == 1
