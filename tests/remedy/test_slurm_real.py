"""Against a real one-node Slurm (slurm-wlm + munge started by the fixture): the actuator drains and resumes
the node, job discovery reads squeue, a failed batch job is requeued per its failover policy, and a running job
is migrated off its bad node by `vigil remedy act migrate_job`."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import wait_for
from tests.slurm_cluster import SlurmCluster
from vigil.config import settings
from vigil.faces.cli.remedy import app
from vigil.model import Action, ActionKind, ActionStatus, Gpu, Node, Topology, node_id
from vigil.remedy.actuators.slurm import SlurmActuator
from vigil.remedy.audit import AuditLog
from vigil.remedy.failover import failover_action, policy_from_comment
from vigil.remedy.remediator import Remediator
from vigil.sources.collect.slurm import SlurmJobs, job_fields, placement

pytestmark = pytest.mark.slow


def test_actuator_drains_and_resumes_the_real_node(on_path: SlurmCluster, tmp_path: Path) -> None:
    remediator = Remediator([SlurmActuator()], AuditLog(f"sqlite:///{tmp_path / 'audit.db'}"), dry_run=False)
    drain = Action(ts=time.time(), kind=ActionKind.DRAIN, target=node_id(on_path.node), reason="Xid 79 on gpu 1")
    done = remediator.execute(drain)
    assert done.status is ActionStatus.EXECUTED, done.result
    assert on_path.node_state() in ("drained", "draining")
    assert "vigil: Xid 79 on gpu 1" in on_path.run("sinfo", "-h", "-R", "-o", "%E")
    again = remediator.execute(Action(ts=time.time(), kind=ActionKind.DRAIN, target=drain.target, reason="repeat"))
    assert again.status is ActionStatus.SKIPPED  # already drained: idempotent
    resumed = remediator.execute(Action(ts=time.time(), kind=ActionKind.UNCORDON, target=node_id(on_path.node)))
    assert resumed.status is ActionStatus.EXECUTED, resumed.result
    wait_for(lambda: on_path.node_state() == "idle", 30, "the node to be idle again")


def test_failed_job_is_discovered_and_requeued_per_its_failover_policy(on_path: SlurmCluster, tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\necho step 1\nexit 3\n")
    job = on_path.run("sbatch", "--parsable", "--requeue", "-o", str(tmp_path / "out-%j.txt"),
                      "--comment=failoverPolicy: {maxRetries: 1, action: restart}", "-J", "train", str(script)).strip()
    source = SlurmJobs()
    wait_for(lambda: any(j.id == job and j.failed for j in source.jobs()), 60, "the job to fail")
    (found,) = [j for j in source.jobs() if j.id == job]
    assert found.name == "train" and found.state == "FAILED" and found.nodes == (on_path.node,)
    topology = Topology(nodes=[Node(name=on_path.node, gpus=[Gpu(node=on_path.node, index=i) for i in range(2)])])
    assert placement(found, topology).placement == [f"gpu/{on_path.node}/0", f"gpu/{on_path.node}/1"]

    (event,) = [e for e in source.collect(time.time()).events if e.entity == f"job/{job}"]
    assert event.attrs["reason"] == "crashed" and event.attrs["restarts"] == 0
    assert "exit code 3" in event.attrs["exit_reason"]
    policy = policy_from_comment(event.attrs["comment"])
    assert policy.max_retries == 1
    action = failover_action(job, event.attrs["restarts"], policy, time.time(), event.message)
    assert action.kind is ActionKind.RESTART_JOB
    remediator = Remediator([SlurmActuator()], AuditLog(f"sqlite:///{tmp_path / 'audit.db'}"), dry_run=False)
    assert remediator.execute(action).status is ActionStatus.EXECUTED

    # Requeued: back in the queue (Slurm holds a requeued job back a while before it may start again) with
    # the restart counted - which spends this policy's one retry.
    wait_for(lambda: source.details(job).get("Restarts") == "1", 30, "Slurm to count the restart")
    (requeued,) = [j for j in source.jobs() if j.id == job]
    assert requeued.state in ("PENDING", "REQUEUED", "RUNNING", "CONFIGURING")
    restarts = int(source.details(job)["Restarts"])
    assert failover_action(job, restarts, policy, time.time()).kind is ActionKind.ALERT


def test_engine_reads_slurm_jobs_and_a_failure_becomes_an_incident(on_path: SlurmCluster, tmp_path: Path) -> None:
    from vigil.config import Settings
    from vigil.run.engine import Engine
    from vigil.store.sql import Store

    settings = Settings(home=tmp_path, slurm_poll_s=0.5)
    store = Store(settings.database_url())
    store.register_node(Node(name=on_path.node, gpus=[Gpu(node=on_path.node, index=i) for i in range(2)]))
    engine = Engine(store, settings, notifiers=[])
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\nsleep 3\nexit 1\n")
    job = on_path.run("sbatch", "--parsable", "-o", str(tmp_path / "out.txt"), "-J", "pretrain", str(script)).strip()

    def placed() -> bool:
        engine.tick()
        topology = store.topology()
        return topology is not None and [j.placement for j in topology.jobs if j.id == job] == [
            [f"gpu/{on_path.node}/0", f"gpu/{on_path.node}/1"]]

    wait_for(placed, 60, "the running job's placement in the topology")

    def crashed() -> bool:
        engine.tick()
        return any(i.scope == f"job/{job}" for i in store.incidents())

    wait_for(crashed, 60, "a crash incident on the job")
    (incident,) = [i for i in store.incidents() if i.scope == f"job/{job}"]
    assert incident.fault_types == ["job_crash"]


def test_migrate_job_requeues_a_running_job_off_its_bad_node(
    on_path: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`vigil remedy act migrate_job` as a plan prints it, plus --node: dry-run first, a job Slurm will not requeue
    refused before anything changes, then the real migration - node drained, job requeued held, the node
    excluded, released - observed in scontrol."""
    monkeypatch.setenv("VIGIL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("VIGIL_DB_URL", f"sqlite:///{tmp_path}/vigil.db")
    monkeypatch.setenv("VIGIL_MAX_CORDON_SHARE", "1.0")  # a one-node cluster: the node may go out
    settings.cache_clear()
    topology = tmp_path / "topology.json"
    topology.write_text(Topology(nodes=[Node(name=on_path.node)]).to_json())
    script, crash = tmp_path / "train.sh", tmp_path / "crash.sh"
    script.write_text("#!/bin/sh\nsleep 600\n")
    crash.write_text("#!/bin/sh\nexit 3\n")

    def fields(job_id: str) -> dict[str, str]:
        return job_fields(on_path.run("scontrol", "show", "job", job_id, "-o"))

    # a job whose ranks died with the node (its plan's case): failed, on the node, requeueable
    crashed = on_path.run("sbatch", "--parsable", "--requeue", "-o", "/dev/null", "-J", "sft", str(crash)).strip()
    wait_for(lambda: fields(crashed)["JobState"] == "FAILED", 60, "the job to fail")
    job = on_path.run("sbatch", "--parsable", "--requeue", "-o", "/dev/null", "-J", "pretrain", str(script)).strip()
    pinned = on_path.run("sbatch", "--parsable", "--no-requeue", "-o", "/dev/null", "-J", "eval", str(script)).strip()
    runner = CliRunner()
    node, migrate = node_id(on_path.node), ["act", "migrate_job", f"job/{job}", "--backend", "slurm", "--json"]
    try:
        wait_for(lambda: fields(job)["JobState"] == fields(pinned)["JobState"] == "RUNNING", 60, "both jobs to run")
        dry = runner.invoke(app, [*migrate, "--node", node])
        assert dry.exit_code == 0, dry.output
        assert json.loads(dry.stdout)["status"] == "proposed"
        assert f"scontrol requeuehold {job}" in json.loads(dry.stdout)["result"]
        assert fields(job)["JobState"] == "RUNNING" and fields(job)["Restarts"] == "0"

        refused = runner.invoke(app, ["act", "migrate_job", f"job/{pinned}", "--node", node, "--backend", "slurm",
                                      "--execute", "--topology", str(topology), "--json"])
        assert refused.exit_code == 1
        assert f"job {pinned} cannot be migrated: Slurm will not requeue it (Requeue=0" in json.loads(
            refused.stdout)["result"]
        assert "drain" not in on_path.node_state() and fields(pinned)["JobState"] == "RUNNING"

        live = runner.invoke(app, [*migrate, "--node", node, "--execute", "--topology", str(topology)])
        assert live.exit_code == 0, live.output
        assert json.loads(live.stdout)["status"] == "executed"
        # requeued (Slurm counted the restart) and kept off the bad node; pending once its step is cleaned up
        # (COMPLETING), and not started again on the excluded node
        wait_for(lambda: fields(job)["JobState"] == "PENDING", 60, "the requeued job to be pending")
        moved = fields(job)
        assert (moved["Restarts"], moved["ExcNodeList"]) == ("1", on_path.node)
        assert moved["Reason"] != "job_requeued_in_held_state"  # released again
        assert on_path.node_state() in ("draining", "drained", "mixed+drain", "drng")
        assert "vigil: " in on_path.run("sinfo", "-h", "-R", "-o", "%E")
        states = json.loads(runner.invoke(app, ["lifecycle", "--json"]).stdout)
        assert [(s["node"], s["state"]) for s in states] == [(node, "cordoned")]
        # the plan's command as printed, no --node: the node is drained now, so it is the bad one
        printed = runner.invoke(app, ["act", "migrate_job", f"job/{crashed}", "--backend", "slurm", "--execute",
                                      "--topology", str(topology), "--json"])
        assert printed.exit_code == 0, printed.output
        wait_for(lambda: fields(crashed)["JobState"] == "PENDING", 60, "the failed job to be pending")
        requeued = fields(crashed)
        assert (requeued["Restarts"], requeued["ExcNodeList"]) == ("1", on_path.node)
        audit = json.loads(runner.invoke(app, ["audit", "--json"]).stdout)
        assert [(a["target"], a["status"]) for a in audit] == [
            (f"job/{job}", "proposed"), (f"job/{pinned}", "failed"), (f"job/{job}", "executed"),
            (f"job/{crashed}", "executed")]
    finally:
        on_path.run("scancel", job, pinned, crashed)
        on_path.run("scontrol", "update", f"nodename={on_path.node}", "state=resume")
        settings.cache_clear()
    wait_for(lambda: on_path.node_state() == "idle", 60, "the node to be idle again")
