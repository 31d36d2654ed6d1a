"""The local failover path end to end: real gloo ranks, real faults, real restarts from checkpoints."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.remedy.failover_jobs import tiny_job
from vigil.model import ActionKind, ActionStatus
from vigil.remedy.audit import AuditLog
from vigil.remedy.jobspec import TrainingJob
from vigil.run.failover import FailoverSupervisor, LocalJob


def final_loss(run_dir: Path) -> str:
    return str(json.loads((run_dir / "result.json").read_text())["final_loss_hex"])


@pytest.fixture(scope="module")
def reference_loss(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("reference")
    report = FailoverSupervisor(LocalJob(tiny_job("clean"), root / "run"), AuditLog(f"sqlite:///{root}/a.db")).run()
    assert report.succeeded and report.attempts == 1 and not report.actions
    return final_loss(root / "run")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fault", "fault_type", "culprit"),
    [
        ("kill:rank=1:step=12", "rank_exit", "job/faulty/rank/1"),
        ("hang:rank=1:step=17", "training_hang", "job/faulty/rank/1"),
    ],
)
def test_fault_is_detected_restarted_and_final_loss_is_bit_identical(
    tmp_path: Path, reference_loss: str, fault: str, fault_type: str, culprit: str | None
) -> None:
    audit = AuditLog(f"sqlite:///{tmp_path}/remedy.db")
    job = LocalJob(tiny_job("faulty"), tmp_path / "run", env={"VIGIL_INJECT_FAULT": fault})
    report = FailoverSupervisor(job, audit).run()

    assert report.succeeded, report.detail
    assert report.attempts == 2
    assert [a.fault_type for a in report.anomalies] == [fault_type]
    if culprit is not None:
        assert report.anomalies[0].entity == culprit
    assert len(report.recoveries) == 1
    recovery = report.recoveries[0]
    assert recovery["detected"] <= recovery["restarted"] <= recovery["resumed"]
    # The restart resumed from a checkpoint, not from step 0.
    starts = [
        json.loads(line)["step"]
        for line in (tmp_path / "run" / "progress-rank0.jsonl").read_text().splitlines()
        if '"start"' in line
    ]
    assert starts[0] == 0 and starts[1] in (5, 10, 15)
    assert final_loss(tmp_path / "run") == reference_loss

    actions = audit.actions()
    assert [(a.kind, a.status, a.dry_run) for a in actions] == [(ActionKind.RESTART_JOB, ActionStatus.EXECUTED, False)]
    assert actions[0].target == "job/faulty" and fault_type in actions[0].reason
    # excludeFailedDevice (default): the culprit rank restarted on the spare device.
    assert "rank 1 moved from cpu:1 to cpu:2" in actions[0].result


def test_retries_exhausted_ends_with_an_alert(tmp_path: Path) -> None:
    spec = TrainingJob.from_dict(
        {
            "metadata": {"name": "doomed"},
            "spec": {
                "replicas": 1,
                "command": [sys.executable, "-c", "import sys; sys.exit(3)"],
                "failoverPolicy": {"maxRetries": 1},
            },
        }
    )
    audit = AuditLog(f"sqlite:///{tmp_path}/remedy.db")
    report = FailoverSupervisor(LocalJob(spec, tmp_path / "run"), audit).run()
    assert not report.succeeded
    assert report.attempts == 2
    kinds = [(a.kind, a.status) for a in audit.actions()]
    assert kinds == [
        (ActionKind.RESTART_JOB, ActionStatus.EXECUTED),
        (ActionKind.ALERT, ActionStatus.EXECUTED),
    ]
    assert "maxRetries=1 exhausted" in audit.actions()[-1].reason
    alerts = (tmp_path / "run" / "alerts.jsonl").read_text().splitlines()
    assert json.loads(alerts[0])["target"] == "job/doomed"


FLAT_GRADIENTS = """
import json, os, time
path = os.path.join(os.environ["VIGIL_RUN_DIR"], "progress-rank0.jsonl")
with open(path, "a") as out:
    out.write(json.dumps({"event": "start", "step": 0, "ts": time.time()}) + "\\n")
    for step in range(1, 9):
        out.write(json.dumps({"step": step, "ts": time.time(), "grad_norm": 0.001}) + "\\n")
        out.flush()
        time.sleep(0.1)
    out.write(json.dumps({"event": "done", "step": 8, "ts": time.time()}) + "\\n")
"""


def test_health_check_alert_keeps_the_job_running(tmp_path: Path) -> None:
    spec = TrainingJob.from_dict(
        {
            "metadata": {"name": "flat"},
            "spec": {
                "replicas": 1,
                "command": [sys.executable, "-c", FLAT_GRADIENTS],
                "healthCheck": {
                    "metrics": [
                        {
                            "name": "vanishing-gradient",
                            "metric": "grad_norm",
                            "aggregation": "avg",
                            "window": "5m",
                            "op": "<",
                            "threshold": 0.01,
                            "action": "alert",
                        }
                    ]
                },
            },
        }
    )
    audit = AuditLog(f"sqlite:///{tmp_path}/remedy.db")
    report = FailoverSupervisor(LocalJob(spec, tmp_path / "run"), audit).run()
    assert report.succeeded and report.attempts == 1
    assert [a.fault_type for a in report.anomalies] == ["health_check:vanishing-gradient"]
    assert [(a.kind, a.status) for a in audit.actions()] == [(ActionKind.ALERT, ActionStatus.EXECUTED)]


SLOW_STARTER = """
import json, os, time
rank = int(os.environ["RANK"])
if rank == 1:
    time.sleep(3)  # a slow import / rendezvous: start-up, not a hang
path = os.path.join(os.environ["VIGIL_RUN_DIR"], f"progress-rank{rank}.jsonl")
with open(path, "a") as out:
    out.write(json.dumps({"event": "start", "step": 0, "ts": time.time()}) + "\\n")
    for step in range(1, 6):
        out.write(json.dumps({"step": step, "ts": time.time()}) + "\\n")
        out.flush()
        time.sleep(0.2)
    out.write(json.dumps({"event": "done", "step": 5, "ts": time.time()}) + "\\n")
"""


def test_slow_start_is_not_a_hang(tmp_path: Path) -> None:
    spec = TrainingJob.from_dict(
        {
            "metadata": {"name": "slowstart"},
            "spec": {
                "replicas": 2,
                "command": [sys.executable, "-c", SLOW_STARTER],
                "healthCheck": {"hangTimeout": "1s"},
            },
        }
    )
    audit = AuditLog(f"sqlite:///{tmp_path}/remedy.db")
    report = FailoverSupervisor(LocalJob(spec, tmp_path / "run"), audit, startup_grace_s=30).run()
    assert report.succeeded and report.anomalies == [], report.detail


@pytest.mark.slow
def test_precheck_keeps_a_job_off_a_bad_machine(tmp_path: Path) -> None:
    from vigil.precheck.baseline import hardware_key

    def spec(baseline: dict[str, float]) -> TrainingJob:
        path = tmp_path / f"baseline-{len(list(tmp_path.glob('baseline-*')))}.json"
        path.write_text(json.dumps({hardware_key(1): baseline}))
        return TrainingJob.from_dict(
            {
                "metadata": {"name": "checked"},
                "spec": {
                    "replicas": 1,
                    "command": [sys.executable, "-c", "pass"],
                    "precheck": {"enabled": True, "baseline": str(path)},
                },
            }
        )

    audit = AuditLog(f"sqlite:///{tmp_path}/remedy.db")
    # A baseline no machine here reaches (a far faster GPU type): the job must not start.
    refused = FailoverSupervisor(LocalJob(spec({"matmul_gflops": 1e9}), tmp_path / "bad"), audit).run()
    assert not refused.succeeded and "PreCheck failed" in refused.detail and "matmul_gflops" in refused.detail
    assert not (tmp_path / "bad" / "logs").exists()  # no rank was ever started
    assert [a.fault_type for a in refused.anomalies] == ["precheck:matmul_gflops"]
    # A baseline every machine meets: the job runs.
    ran = FailoverSupervisor(LocalJob(spec({"matmul_gflops": 1e-6}), tmp_path / "good"), audit).run()
    assert ran.succeeded
    assert [(a.kind, a.target) for a in audit.actions()] == [(ActionKind.ALERT, "job/checked")]


def test_job_without_heartbeats_outliving_the_hang_timeout_is_not_a_hang(tmp_path: Path) -> None:
    spec = TrainingJob.from_dict(
        {
            "metadata": {"name": "silent"},
            "spec": {
                "replicas": 1,
                "command": [sys.executable, "-c", "import time; time.sleep(2.5)"],
                "healthCheck": {"hangTimeout": "1s"},
            },
        }
    )
    audit = AuditLog(f"sqlite:///{tmp_path}/remedy.db")
    report = FailoverSupervisor(LocalJob(spec, tmp_path / "run"), audit, startup_grace_s=0.5).run()
    assert report.succeeded and report.anomalies == []


def test_heartbeat_lines_and_no_op_outside_a_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vigil.remedy.heartbeat import Heartbeat

    monkeypatch.delenv("VIGIL_RUN_DIR", raising=False)
    Heartbeat().step(1, loss=0.5)  # nothing to write to, nothing written, no error
    monkeypatch.setenv("VIGIL_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "3")
    beat = Heartbeat()
    beat.start(10)
    beat.step(11, loss=0.25)
    beat.done(11)
    lines = [json.loads(line) for line in (tmp_path / "progress-rank3.jsonl").read_text().splitlines()]
    assert [line.get("event", "step") for line in lines] == ["start", "step", "done"]
    assert lines[1]["loss"] == 0.25 and lines[1]["step"] == 11
