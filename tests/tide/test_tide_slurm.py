"""The tiers acting through a real one-node Slurm with accounting (slurm-wlm, slurmdbd, MariaDB, munge, all
started by the fixture): QOS from the tier policy, a spot job told to checkpoint ahead of time, requeued by
Vigil once its notice runs out and resumed from its checkpoint, then preempted and requeued by Slurm itself
when an online-inference job needs the node."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, wait_for
from tests.slurm_cluster import SlurmCluster
from tests.tide.tide_inputs import write_policy
from vigil.checkpoint.manager import complete_steps
from vigil.model import Action, ActionKind, ActionStatus, job_id
from vigil.remedy.actuators.slurm import SlurmActuator
from vigil.remedy.audit import AuditLog
from vigil.remedy.remediator import Remediator
from vigil.remedy.tide.act import given_notices, tide_actions
from vigil.remedy.tide.planner import Allotment, TidePlan
from vigil.remedy.tide.slurm import qos_commands, qos_names, running_tier_jobs
from vigil.remedy.tide.tiers import load_tier_policy

pytestmark = pytest.mark.slow
SLURM_ACCOUNTING = True  # QOS and preemption need slurmdbd
CPUS = os.cpu_count() or 1

# A spot training job on Vigil's checkpoint manager: it checkpoints (torch.distributed.checkpoint) on the notice
# (SIGUSR1) and on Slurm's SIGTERM, exits after the latter, and starts from its latest checkpoint.
SPOT_JOB = """#!{python}
import os, signal, sys, time
sys.path.insert(0, {root!r})
import torch
from vigil.checkpoint.manager import CheckpointManager
from vigil.checkpoint.notice import PreemptionNotice, checkpoint_on_notice
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
manager = CheckpointManager(os.environ["CKPT"], async_save=False)
restored = manager.restore_latest(model, optimizer)
step = restored.step + 1 if restored else 0
notice = PreemptionNotice().install()
print("start", step, "restarts", os.environ.get("SLURM_RESTART_COUNT", "0"), flush=True)
while True:
    loss = model(torch.randn(4, 8)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if checkpoint_on_notice(notice, manager, step, model, optimizer):
        print("checkpoint", step, "signal", int(notice.received), flush=True)
        if notice.received == signal.SIGTERM:
            manager.close()
            sys.exit(0)
    step += 1
    time.sleep(0.05)
"""


def _checkpoints(out: Path, signum: int) -> list[int]:
    return [int(line.split()[1]) for line in out.read_text().splitlines()
            if line.startswith("checkpoint") and line.endswith(f"signal {signum}")]


def _job(cluster: SlurmCluster, job: str) -> dict[str, str]:
    text = cluster.run("scontrol", "show", "job", job, "-o")
    return dict(field.split("=", 1) for field in text.split() if "=" in field)


def _plan(spot_now: int, spot_next: int) -> TidePlan:
    rows = [(0.0, spot_now), (300.0, spot_next)]
    return TidePlan(interval_s=300.0, healthy_gpus=CPUS, intervals=[
        Allotment(start, 0.0, 0, {1: 0, 2: 0, 3: spot, 4: 0}) for start, spot in rows])


def test_spot_job_checkpoints_on_notice_and_is_requeued_by_vigil_then_by_slurm(on_path: SlurmCluster,
                                                                               tmp_path: Path) -> None:
    policy = load_tier_policy(write_policy(tmp_path / "tiers.yaml", t3_gracePeriod="3s", t3_noticeLead="6s"))
    names = qos_names(policy)
    for argv in qos_commands(policy, tres="cpu"):
        on_path.run(*argv)
    on_path.run("sacctmgr", "-i", "modify", "user", "root", "set", "qos+=" + ",".join(names.values()))
    shown = on_path.run("sacctmgr", "-n", "-P", "show", "qos", "format=Name,Preempt,PreemptMode,GraceTime")
    qos = {row.split("|")[0]: row.split("|")[1:] for row in shown.splitlines()}
    assert qos["spot-training"] == ["offline-inference", "requeue", "00:00:03"]
    assert set(qos["online-inference"][0].split(",")) == {"spot-training", "offline-inference"}

    script = tmp_path / "spot.py"
    script.write_text(SPOT_JOB.format(python=sys.executable, root=str(REPO)))
    script.chmod(0o755)
    ckpt, out = tmp_path / "ckpt", tmp_path / "spot.out"
    job = on_path.run("sbatch", "--parsable", "--requeue", "--qos=spot-training", "-n", str(CPUS), "-o", str(out),
                      "--open-mode=append", f"--export=ALL,CKPT={ckpt}", "-J", "train-spot-sweep",
                      str(script)).strip()
    wait_for(lambda: out.exists() and "start 0" in out.read_text(), 180, "the spot job to start")
    (found,) = running_tier_jobs(policy, tres="cpu")
    assert (found.id, found.tier, found.units) == (job, 3, CPUS)

    # The plan takes tier 3's CPUs back next interval, inside the notice lead: a notice now, nothing else.
    audit = AuditLog(f"sqlite:///{tmp_path / 'audit.db'}")
    remediator = Remediator([SlurmActuator()], audit, dry_run=False, requested_by="vigil-tide")
    now = time.time()
    first = remediator.execute_all(tide_actions(_plan(CPUS, 0), policy, [found], [], now, cluster="vigiltest",
                                                queues=names, resource="cpu"))
    assert [(a.kind, a.status) for a in first] == [
        (ActionKind.SET_QUOTA, ActionStatus.EXECUTED), (ActionKind.SET_QUOTA, ActionStatus.EXECUTED),
        (ActionKind.PREEMPT_NOTICE, ActionStatus.EXECUTED)], [a.result for a in first]
    assert f"cpu={CPUS}" in on_path.run("sacctmgr", "-n", "-P", "show", "qos", "spot-training", "format=GrpTRES")
    wait_for(lambda: bool(_checkpoints(out, 10)), 60, "the checkpoint on notice")
    (noticed_step,) = _checkpoints(out, 10)
    assert noticed_step in complete_steps(ckpt)
    assert _job(on_path, job)["JobState"] == "RUNNING"  # a notice is not a preemption

    # Before the notice runs out nothing more happens; after it, Vigil requeues the job.
    notices = given_notices(audit.actions(kind=ActionKind.PREEMPT_NOTICE))
    assert notices and notices[0].effective_ts == pytest.approx(now + 6.0)
    early = tide_actions(_plan(CPUS, 0), policy, running_tier_jobs(policy, tres="cpu"), notices, now + 1,
                         cluster="vigiltest", queues=names, resource="cpu")
    assert [a.kind for a in early] == [ActionKind.SET_QUOTA] * 2
    late = tide_actions(_plan(0, 0), policy, running_tier_jobs(policy, tres="cpu"), notices, now + 7,
                        cluster="vigiltest", queues=names, resource="cpu")
    (preempt,) = [remediator.execute(a) for a in late if a.kind is ActionKind.PREEMPT]
    assert preempt.target == job_id(job) and preempt.status is ActionStatus.EXECUTED, preempt.result
    wait_for(lambda: _job(on_path, job)["Restarts"] == "1" and _job(on_path, job)["JobState"] == "PENDING", 60,
          "Slurm to requeue the job")
    # Slurm holds a requeued job back a while; the capacity came back, so release it now.
    on_path.run("scontrol", "update", f"JobId={job}", "StartTime=now")
    wait_for(lambda: "restarts 1" in out.read_text(), 180, f"the spot job to restart ({_job(on_path, job)})")
    resumed = int(out.read_text().split("restarts 1")[0].split("start")[-1])
    assert resumed == complete_steps(ckpt)[-1] + 1 and resumed > noticed_step > 0, out.read_text()

    # Slurm's own preemption by QOS: an online-inference job needs the node; the spot job gets SIGTERM,
    # checkpoints inside its 3 s grace and goes back to the queue; Vigil's preempt then finds nothing to do.
    serve = on_path.run("sbatch", "--parsable", "--qos=online-inference", "-n", str(CPUS), "-J", "serve-llm",
                        "-o", str(tmp_path / "serve.out"), "--wrap", "sleep 2").strip()
    wait_for(lambda: _job(on_path, job)["Restarts"] == "2" and _job(on_path, job)["JobState"] == "PENDING", 90,
          "Slurm to preempt and requeue the spot job")
    assert _checkpoints(out, 15) and _checkpoints(out, 15)[-1] == complete_steps(ckpt)[-1] > resumed
    assert "DUE TO PREEMPTION" in out.read_text()
    again = remediator.execute(Action(ts=time.time(), kind=ActionKind.PREEMPT, target=job_id(job)))
    assert again.status is ActionStatus.SKIPPED, again.result
    wait_for(lambda: _job(on_path, serve)["JobState"] == "COMPLETED", 60, "the online job to run")


def test_apply_is_a_dry_run_by_default_and_audited(on_path: SlurmCluster, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    lines = [f"2023-11-16 18:{m:02d}:{s:02d}.5000000" for m in range(30) for s in range(0, 60, 3)]
    trace = tmp_path / "trace.csv"
    trace.write_text("TIMESTAMP\n" + "\n".join(lines) + "\n")
    env = dict(os.environ, PYTHONPATH=str(REPO), VIGIL_HOME=str(tmp_path / "home"),
               VIGIL_DB_URL=f"sqlite:///{tmp_path}/vigil.db", SLURM_CONF=on_path.env["SLURM_CONF"])
    done = subprocess.run([sys.executable, "-m", "vigil", "tide", "apply", "--trace", str(trace), "--gpus", "400",
                           "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    actions = json.loads(done.stdout)
    assert [a["kind"] for a in actions][:2] == ["set_quota", "set_quota"]
    assert all(a["status"] == "proposed" and a["result"].startswith("dry-run: would run sacctmgr") for a in actions)
    monkeypatch.setenv("VIGIL_DB_URL", env["VIGIL_DB_URL"])
    assert len(AuditLog(env["VIGIL_DB_URL"]).actions(kind=ActionKind.SET_QUOTA)) == 2
