"""The Slurm actuator against a fake ``scontrol`` on PATH that records its calls and keeps node states."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.remedy.conftest import calls
from vigil.model import Action, ActionKind, ActionStatus, Node, Topology
from vigil.remedy.actuators.base import ActuatorError
from vigil.remedy.actuators.slurm import SlurmActuator
from vigil.remedy.audit import AuditLog
from vigil.remedy.guard import BlastRadiusGuard
from vigil.remedy.remediator import Remediator
from vigil.sources.collect.slurm import job_fields


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


RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "remedy" / "slurm"


def recorded_job(state_dir: Path, job: str, name: str, **replace: str) -> None:
    """Put a recorded ``scontrol show job -o`` line where the fake answers for ``job``, with fields replaced."""
    text = (RECORDED / name).read_text()
    for key, value in replace.items():
        text = re.sub(rf"(^|\s){key}=\S*", rf"\g<1>{key}={value}", text)
    (state_dir / f"job-{job}.txt").write_text(text)


def migrate(job: str = "4242", nodes: list[str] | None = None) -> Action:
    return Action(ts=0.0, kind=ActionKind.MIGRATE_JOB, target=f"job/{job}", reason="Xid 79 on gpu/vm/1",
                  params={"nodes": nodes} if nodes is not None else {})


def test_job_fields_read_the_recorded_lines() -> None:
    text = (RECORDED / "show-job-running.txt").read_text()
    running = job_fields(text)
    migration = {"JobState": "RUNNING", "Reason": "None", "Requeue": "1", "Restarts": "0", "BatchFlag": "1",
                 "ExcNodeList": "", "NodeList": "vm"}
    assert {key: running.get(key) for key in migration} == migration
    assert (running["ExitCode"], running["TRES"], running["AllocNode:Sid"], running["Power"]) == (
        "0:0", "cpu=1,node=1,billing=1", "localhost:13640", "")
    # a job's own words cannot stand for Slurm's: Command (after Requeue in the line) keeps its own field
    tricked = job_fields(text.replace("Command=/tmp/jobacts_job.sh", "Command=/tmp/run.sh Requeue=0 JobState=FAILED"))
    assert (tricked["Requeue"], tricked["JobState"]) == ("1", "RUNNING")
    held = job_fields((RECORDED / "show-job-requeue-held.txt").read_text())
    assert (held["JobState"], held["Reason"], held["Restarts"], held["NodeList"]) == (
        "PENDING", "job_requeued_in_held_state", "1", "")


def test_migrate_drains_the_named_node_then_requeues_held_excludes_and_releases(fake_slurm: Path) -> None:
    recorded_job(fake_slurm, "4242", "show-job-running.txt", NodeList="gpu-[017-018]", ExcNodeList="gpu-020")
    result = SlurmActuator().execute(migrate(nodes=["node/gpu-017"]))
    steps = [c for c in calls(fake_slurm) if c[0] != "show"]
    assert steps == [
        ["update", "nodename=gpu-017", "state=drain", "reason=vigil: Xid 79 on gpu/vm/1"],
        ["requeuehold", "4242"],
        ["update", "jobid=4242", "excnodelist=gpu-020,gpu-017"],  # the job's own exclusion is kept
        ["release", "4242"],
    ]
    assert "job 4242 requeued with excnodelist=gpu-020,gpu-017, drained gpu-017" in result


def test_migrate_without_a_named_node_moves_off_the_nodes_slurm_holds_drained(fake_slurm: Path) -> None:
    recorded_job(fake_slurm, "4242", "show-job-running.txt")
    (fake_slurm / "node-vm.txt").write_text((RECORDED / "show-node-draining.txt").read_text())  # MIXED+DRAIN
    SlurmActuator().execute(migrate())
    assert [c for c in calls(fake_slurm) if c[0] != "show"] == [
        ["requeuehold", "4242"], ["update", "jobid=4242", "excnodelist=vm"], ["release", "4242"]]


def test_migrate_refuses_with_one_line_what_it_cannot_move(fake_slurm: Path) -> None:
    recorded_job(fake_slurm, "77", "show-job-no-requeue.txt")
    with pytest.raises(ActuatorError, match=r"^job 77 cannot be migrated: Slurm will not requeue it \(Requeue=0"):
        SlurmActuator().execute(migrate("77", nodes=["node/vm"]))
    recorded_job(fake_slurm, "4242", "show-job-running.txt")  # on vm, which is idle: which node is bad?
    with pytest.raises(ActuatorError, match="none is drained or down: name the bad node"):
        SlurmActuator().execute(migrate())
    assert [c for c in calls(fake_slurm) if c[0] != "show"] == []  # nothing changed before the refusal


def test_a_malformed_bad_node_from_a_plan_fails_the_action_in_one_line(fake_slurm: Path, tmp_path: Path) -> None:
    # params.nodes comes from a diagnosis plan as well as from --node: a malformed id is the action's failure, not
    # an exception out of the Remediator
    recorded_job(fake_slurm, "4242", "show-job-running.txt")
    for dry_run in (True, False):
        remediator = Remediator([SlurmActuator()], AuditLog(f"sqlite:///{tmp_path}/audit-{dry_run}.db"),
                                dry_run=dry_run)
        failed = remediator.execute(migrate(nodes=["gpu-017"]))
        assert failed.status is ActionStatus.FAILED, failed
        assert failed.result.startswith("slurm: migrate_job params.nodes holds 'gpu-017', not a node/<name> id")
    # behind the blast-radius guard too: the id is the mistake, not the guard's "not in the topology"
    guard = BlastRadiusGuard(Topology(nodes=[Node(name="gpu-017"), Node(name="gpu-018")]), max_share=0.5)
    guarded = Remediator([SlurmActuator()], AuditLog(f"sqlite:///{tmp_path}/audit-guard.db"), guard=guard)
    failed = guarded.execute(migrate(nodes=["gpu-017"]))
    assert failed.status is ActionStatus.FAILED and "not a node/<name> id" in failed.result, failed
    assert guard.admit("node/gpu-018").admitted  # nothing was left reserved
    assert [c for c in calls(fake_slurm) if c[0] != "show"] == []


def test_a_migration_cut_short_while_held_is_resumed_not_requeued_twice(fake_slurm: Path) -> None:
    recorded_job(fake_slurm, "4242", "show-job-requeue-held.txt")
    SlurmActuator().execute(migrate(nodes=["node/vm"]))
    assert [c for c in calls(fake_slurm) if c[0] != "show"] == [
        ["update", "nodename=vm", "state=drain", "reason=vigil: Xid 79 on gpu/vm/1"],
        ["update", "jobid=4242", "excnodelist=vm"], ["release", "4242"]]


def test_migrate_dry_run_prints_the_commands_and_the_guard_admits_the_node_first(
    fake_slurm: Path, tmp_path: Path
) -> None:
    topology = Topology(nodes=[Node(name=f"gpu-{i:03d}") for i in range(10, 30)])
    audit = AuditLog(f"sqlite:///{tmp_path}/audit.db")
    guard = BlastRadiusGuard(topology, max_share=0.05)  # one node of 20 may be out
    remediator = Remediator([SlurmActuator()], audit, guard=guard)
    proposed = remediator.execute(migrate(nodes=["node/gpu-017"]))
    assert proposed.status is ActionStatus.PROPOSED
    assert ("scontrol update nodename=gpu-017 state=drain reason=vigil: Xid 79 on gpu/vm/1; scontrol requeuehold "
            "4242; scontrol update jobid=4242 excnodelist=gpu-017,<its ExcNodeList and drained or down nodes>; "
            "scontrol release 4242") in proposed.result
    refused = remediator.execute(migrate(nodes=["node/gpu-018"]))
    assert refused.status is ActionStatus.REFUSED and "blast radius" in refused.result
    assert calls(fake_slurm) == [] and len(audit.actions()) == 2
