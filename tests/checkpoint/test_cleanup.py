"""`vigil checkpoint clean`: proposals with du's sizes, dry-run by default, every removal an audited action
that the actuator checks again before it deletes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.checkpoint.checkpoint_dirs import HOUR, make_checkpoints
from tests.conftest import require_binary
from vigil.checkpoint.cleanup import propose_cleanup
from vigil.faces.cli.main import app
from vigil.model import ActionStatus, new_id
from vigil.remedy.actuators.checkpoint import CheckpointCleanupActuator
from vigil.remedy.audit import AuditLog
from vigil.remedy.remediator import Remediator


def du_bytes(path: Path) -> int:
    out = subprocess.run([require_binary("du"), "-s", "-B1", str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout.split("\t", 1)[0])


def test_proposals_name_retention_and_orphans_with_du_sizes(tmp_path: Path) -> None:
    ckpt = make_checkpoints(tmp_path)
    proposals = propose_cleanup(ckpt, keep_last=2, partial_age_s=HOUR)
    assert [(p.step, p.reason) for p in proposals] == [
        (1, "beyond retention"), (2, "beyond retention"), (3, "beyond retention"), (4, "beyond retention"),
        (5, "orphaned partial save"),
    ]  # 6 and 7 are the newest two; 8 is the save in flight
    for proposal in proposals:
        assert proposal.bytes == du_bytes(Path(proposal.path))
    assert [p.step for p in propose_cleanup(ckpt, keep_last=2, partial_age_s=3 * HOUR)] == [1, 2, 3, 4]


def test_clean_is_a_dry_run_until_executed_and_audited_either_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vigil.config import settings

    monkeypatch.setenv("VIGIL_HOME", str(tmp_path / "home"))
    settings.cache_clear()
    try:
        ckpt = make_checkpoints(tmp_path)
        before = sorted(p.name for p in ckpt.iterdir())
        dry = CliRunner().invoke(app, ["checkpoint", "clean", str(ckpt), "--keep-last", "2", "--json"])
        assert dry.exit_code == 0, dry.output
        proposed = json.loads(dry.stdout)
        assert [a["params"]["step"] for a in proposed] == [1, 2, 3, 4, 5]
        assert all(a["kind"] == "delete_checkpoint" and a["target"] == "job/j7" and a["dry_run"] for a in proposed)
        assert all(a["result"].startswith("dry-run: would rm -r") for a in proposed)
        assert sorted(p.name for p in ckpt.iterdir()) == before  # nothing deleted
        done = CliRunner().invoke(app, ["checkpoint", "clean", str(ckpt), "--keep-last", "2", "--execute", "--json"])
        assert done.exit_code == 0, done.output
        assert {a["status"] for a in json.loads(done.stdout)} == {"executed"}
        assert sorted(p.name for p in ckpt.iterdir()) == [f"step-{s:09d}" for s in (6, 7, 8)]
        audited = AuditLog().actions(target="job/j7")
        assert [a.status for a in audited].count(ActionStatus.EXECUTED) == 5
        assert [a.status for a in audited].count(ActionStatus.PROPOSED) == 5  # the dry run's records
    finally:
        settings.cache_clear()


def test_the_actuator_checks_again_and_stays_inside_its_root(tmp_path: Path) -> None:
    ckpt = make_checkpoints(tmp_path)
    keep = propose_cleanup(ckpt, keep_last=2)[0].action("j7", keep_last=2, partial_age_s=HOUR)
    remediator = Remediator([CheckpointCleanupActuator([ckpt])], AuditLog(f"sqlite:///{tmp_path / 'a.db'}"),
                            dry_run=False)
    # An action edited to point at a checkpoint the rule keeps (the newest) deletes nothing.
    kept = str(ckpt / "step-000000007")
    newest = keep.model_copy(update={"id": new_id("act"), "params": {**keep.params, "path": kept}})
    refused = remediator.execute(newest)
    assert refused.status is ActionStatus.FAILED and "no longer removable" in refused.result
    assert (ckpt / "step-000000007").is_dir()
    # Outside the directory the command was given: no actuator takes it.
    elsewhere = tmp_path / "other" / "step-000000001"
    elsewhere.mkdir(parents=True)
    outside = keep.model_copy(update={"id": new_id("act"), "params": {**keep.params, "path": str(elsewhere)}})
    assert remediator.execute(outside).status is ActionStatus.REFUSED and elsewhere.is_dir()
    done = remediator.execute(keep)
    assert done.status is ActionStatus.EXECUTED and not Path(keep.params["path"]).exists()
