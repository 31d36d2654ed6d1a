"""`vigil launch job job.yaml`: run a TrainingJob spec under the failover supervisor.

The spec's failoverPolicy decides what a crash or hang leads to (restart from the latest checkpoint,
migrate the failed rank to a spare device, or alert and stop), its healthCheck which metric
conditions raise an alert or a restart; every action lands in the audit log.
"""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from vigil.remedy.audit import AuditLog
from vigil.remedy.jobspec import load_jobspec
from vigil.remedy.local import FailoverReport, FailoverSupervisor, LocalJob


def run_job(
    spec_path: Path, out_dir: Path, *, db_url: str | None = None, console: Console | None = None
) -> FailoverReport:
    spec = load_jobspec(spec_path)
    console = console or Console(stderr=True)
    job = LocalJob(spec, out_dir)
    with console.status(f"running {spec.name}: {spec.spec.replicas} ranks") as status:

        def on_event(message: str) -> None:
            console.log(message)
            status.update(message)

        return FailoverSupervisor(job, AuditLog(db_url), on_event=on_event).run()


def report_json(report: FailoverReport) -> str:
    return json.dumps(
        {
            "job": report.job,
            "succeeded": report.succeeded,
            "attempts": report.attempts,
            "detail": report.detail,
            "anomalies": [a.model_dump(mode="json") for a in report.anomalies],
            "actions": [a.model_dump(mode="json") for a in report.actions],
            "recoveries": report.recoveries,
        },
        indent=2,
    )


def print_report(report: FailoverReport, console: Console) -> None:
    style = "green" if report.succeeded else "bold red"
    console.print(
        f"[{style}]{report.job}: {'finished' if report.succeeded else 'failed'}[/] after "
        f"{report.attempts} attempt(s): {report.detail}"
    )
    for anomaly, action in zip(report.anomalies, report.actions, strict=False):
        console.print(
            f"  {anomaly.fault_type} on {anomaly.entity} -> {action.kind.value} [{action.status.value}] {action.result}"
        )
    for recovery in report.recoveries:
        console.print(f"  resumed training {recovery['resumed'] - recovery['detected']:.1f}s after detection")
