"""The Slurm actuator against a fake ``scontrol`` on PATH that records its calls and keeps node states."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.remedy.conftest import calls
from vigil.model import Action, ActionKind, ActionStatus
from vigil.remedy.actuators.slurm import SlurmActuator
from vigil.remedy.audit import AuditLog
from vigil.remedy.remediator import Remediator


def act(kind: ActionKind, node: str = "gpu-017", reason: str = "Xid 79 'fallen off the bus'; rm -rf /") -> Action:
    return Action(ts=0.0, kind=kind, target=f"node/{node}", reason=reason)


def test_drain_resume_and_reboot_commands(fake_slurm: Path) -> None:
    slurm = SlurmActuator()
    assert not slurm.is_satisfied(act(ActionKind.DRAIN))
    slurm.execute(act(ActionKind.DRAIN))
    drain = calls(fake_slurm)[-1]
    assert drain[:3] == ["update", "nodename=gpu-017", "state=drain"]
    # No argv goes through a shell, but Slurm keeps the reason verbatim: quotes and ; are replaced.
    assert drain[3] == "reason=vigil: Xid 79 _fallen off the bus__ rm -rf /"
    assert slurm.is_satisfied(act(ActionKind.CORDON))
    slurm.execute(act(ActionKind.UNCORDON))
    assert calls(fake_slurm)[-1] == ["update", "nodename=gpu-017", "state=resume"]
    slurm.execute(act(ActionKind.REBOOT))
    assert calls(fake_slurm)[-1][:3] == ["reboot", "ASAP", "nextstate=resume"]
    assert calls(fake_slurm)[-1][-1] == "gpu-017"


def test_remediator_with_slurm_is_idempotent_and_audited(fake_slurm: Path, tmp_path: Path) -> None:
    audit = AuditLog(f"sqlite:///{tmp_path}/audit.db")
    remediator = Remediator([SlurmActuator()], audit, dry_run=False)
    statuses = [remediator.execute(act(ActionKind.DRAIN)).status for _ in range(3)]
    assert statuses == [ActionStatus.EXECUTED, ActionStatus.SKIPPED, ActionStatus.SKIPPED]
    assert sum(1 for c in calls(fake_slurm) if c[0] == "update") == 1
    failed = remediator.execute(act(ActionKind.DRAIN, node="ghost"))
    assert failed.status is ActionStatus.FAILED and "Invalid node name" in failed.result
    assert len(audit.actions()) == 4


def test_dry_run_runs_nothing(fake_slurm: Path, tmp_path: Path) -> None:
    remediator = Remediator([SlurmActuator()], AuditLog(f"sqlite:///{tmp_path}/audit.db"))
    proposed = remediator.execute(act(ActionKind.DRAIN))
    assert proposed.status is ActionStatus.PROPOSED
    assert "scontrol update nodename=gpu-017 state=drain" in proposed.result
    assert calls(fake_slurm) == []


def test_missing_scontrol_is_a_failed_action(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    remediator = Remediator([SlurmActuator()], AuditLog(f"sqlite:///{tmp_path}/audit.db"), dry_run=False)
    failed = remediator.execute(act(ActionKind.DRAIN))
    assert failed.status is ActionStatus.FAILED and "not found on PATH" in failed.result
