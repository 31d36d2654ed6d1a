"""Local TrainingJobs: run a job's ranks with the one launcher, watch them, and fail over per its policy.

``LocalJob`` starts the ranks torchrun-style through ``vigil.run.launcher`` (the probe in every Python
rank, plus VIGIL_DEVICE and the checkpoint settings) and can restart them all from the latest
checkpoint, moving a failed rank to a spare device when the spec lists one. ``FailoverSupervisor``
watches an attempt with the same supervisor as ``vigil launch`` - exit codes, the probes' records,
the hang and mismatch triggers of ``vigil.detect.hang`` and the verdict of ``vigil.diagnose.hang`` -
so a hung or crashed job gets the same culprit whichever way it was launched; healthCheck metric
conditions come from the ranks' progress lines (``vigil.remedy.heartbeat``). What it sees becomes
Anomaly records, and it acts through the Remediator with ``LocalActuator``, so every restart is an
audited Action like any other.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from vigil.checkpoint.evaluation import CheckpointEvaluator, EvalConfig, EvalRecord, failure_incident
from vigil.config import settings
from vigil.diagnose.hang import HangDiagnosis
from vigil.model import Action, ActionKind, ActionStatus, Anomaly, Evidence, FaultLevel, job_id, rank_id
from vigil.precheck.baseline import Baselines, Verdict, hardware_key, verdicts
from vigil.precheck.runner import CheckOptions, run_local
from vigil.remedy.actuators.base import Actuator, OutboxActuator
from vigil.remedy.actuators.local import LocalActuator
from vigil.remedy.audit import AuditLog
from vigil.remedy.heartbeat import ProgressTracker
from vigil.remedy.jobspec import FAILOVER_ACTIONS, TrainingJob, load_jobspec
from vigil.remedy.lease import DEFAULT_LEASE_S, DEFAULT_RENEW_S, lease_of
from vigil.remedy.remediator import Remediator
from vigil.run.launcher import free_port, prepare_out_dir, probe_command, probe_env, start_rank, torchrun_env
from vigil.run.rank_procs import record_launched, signals_raise, stop_groups
from vigil.run.supervise import Supervisor, SupervisorConfig
from vigil.store.sql import Store, open_store

POLL_S = 0.1


class LocalJob:
    def __init__(self, spec: TrainingJob, run_dir: str | Path, *, env: dict[str, str] | None = None) -> None:
        self.spec = spec
        self.run_dir = Path(run_dir)
        self.entity = job_id(spec.name)
        self.env = dict(env or {})
        self.devices = spec.spec.initial_devices()
        self.spares = spec.spec.spare_devices()
        self.attempt = 0
        self.processes: list[subprocess.Popen[bytes]] = []
        self.started_at = 0.0
        checkpoint_dir = Path(spec.spec.checkpoint.dir)
        self.checkpoint_dir = checkpoint_dir if checkpoint_dir.is_absolute() else self.run_dir / checkpoint_dir

    def command(self) -> list[str]:
        """The spec's command; a Python one runs through the probe (the interpreter Vigil runs in)."""
        return probe_command(self.spec.spec.command)

    @property
    def probe_dir(self) -> Path:
        """Each attempt's probe records, diagnosis and timeline, kept for the post-mortem."""
        return self.run_dir / "probe" / f"attempt{self.attempt}"

    def log_path(self, rank: int) -> Path:
        return self.run_dir / "logs" / f"rank{rank}.attempt{self.attempt}.log"

    def start(self) -> None:
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        prepare_out_dir(self.probe_dir)
        port = free_port()
        checkpoint = self.spec.spec.checkpoint
        world = len(self.devices)
        extra = {
            **self.spec.spec.env,
            **self.env,
            "VIGIL_JOB": self.spec.name,
            "VIGIL_RESTART_COUNT": str(self.attempt),
            "VIGIL_RUN_DIR": str(self.run_dir),
            "VIGIL_CHECKPOINT_DIR": str(self.checkpoint_dir),
            "VIGIL_CHECKPOINT_EVERY": str(checkpoint.every_steps),
            "VIGIL_CHECKPOINT_KEEP_LAST": str(checkpoint.keep_last),
        }
        hang_timeout = self.spec.spec.health_check.hang_timeout_s
        self.started_at = time.time()
        self.processes = []
        for rank, device in enumerate(self.devices):
            env = torchrun_env(rank, world, port, extra={**extra, "VIGIL_DEVICE": device})
            env = probe_env(env, self.probe_dir, hang_timeout, flight_recorder=False)
            self.processes.append(start_rank(self.command(), env, self.log_path(rank)))
        record_launched(self.probe_dir, 0, dict(enumerate(self.processes)))

    def poll(self) -> list[int | None]:
        return [p.poll() for p in self.processes]

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM every rank's process group, SIGKILL what is left after ``grace_s``."""
        stop_groups(self.processes, grace_s)

    def restart(self, bad_rank: int | None = None, move_bad_rank: bool = False) -> str:
        """Stop all ranks and start them again; they resume from the latest complete checkpoint."""
        self.stop()
        moved = ""
        if move_bad_rank and bad_rank is not None and self.spares:
            old = self.devices[bad_rank]
            self.devices[bad_rank] = self.spares.pop(0)
            moved = f", rank {bad_rank} moved from {old} to {self.devices[bad_rank]}"
        self.attempt += 1
        self.start()
        return f"restarted {self.entity} (attempt {self.attempt}){moved}"


@dataclass
class FailoverReport:
    job: str
    succeeded: bool
    attempts: int
    anomalies: list[Anomaly] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    # (fault detected, ranks restarted, first step after resume) wall-clock times per recovery
    recoveries: list[dict[str, float]] = field(default_factory=list)
    detail: str = ""
    # the spec's eval: every checkpoint's evaluation (step, state, attempts, scalars, message)
    evaluations: list[dict[str, object]] = field(default_factory=list)


class FailoverSupervisor:
    """Runs a LocalJob to completion, detecting faults and failing over as its spec says."""

    def __init__(
        self,
        job: LocalJob,
        audit: AuditLog,
        *,
        outbox: Path | None = None,
        on_event: Callable[[str], None] | None = None,
        timeout_s: float = 3600.0,
        startup_grace_s: float = 120.0,
        lease_s: float = DEFAULT_LEASE_S,
        renew_s: float = DEFAULT_RENEW_S,
    ) -> None:
        """``lease_s`` / ``renew_s``: how long its remediator's claim on a run holds, renewed how often (``lease_of``
        the settings `vigil launch job` runs under)."""
        self.job = job
        self.policy = job.spec.spec.failover_policy
        self.health = job.spec.spec.health_check
        self.local = LocalActuator()
        self.local.register(job)
        actuators: list[Actuator] = [self.local, OutboxActuator(outbox or job.run_dir / "alerts.jsonl")]
        # Launching a job with a failoverPolicy is the consent to restart it: this remediator acts.
        self.remediator = Remediator(actuators, audit, dry_run=False, requested_by="vigil-failover", lease_s=lease_s,
                                     renew_s=renew_s)
        self.tracker = ProgressTracker(job.run_dir, len(job.devices))
        self.on_event = on_event or (lambda _message: None)
        self.timeout_s = timeout_s
        self.startup_grace_s = startup_grace_s

    def run(self) -> FailoverReport:
        report = FailoverReport(job=self.job.entity, succeeded=False, attempts=1)
        if self.job.spec.spec.precheck.enabled:
            refusal = self._precheck(report)
            if refusal is not None:
                report.actions.append(refusal)
                report.detail = f"not started: {refusal.reason}"
                return report
        self.job.start()
        watch = self._supervisor()
        self.on_event(f"started {self.job.entity}: {len(self.job.devices)} ranks")
        deadline = time.time() + self.timeout_s
        fired_conditions: set[str] = set()
        pending_resume: dict[str, float] | None = None
        try:
            while time.time() < deadline:
                time.sleep(POLL_S)
                self.tracker.update()
                if pending_resume is not None and self._resumed():
                    pending_resume["resumed"] = time.time()
                    report.recoveries.append(pending_resume)
                    self.on_event(
                        f"training resumed {pending_resume['resumed'] - pending_resume['detected']:.1f}s "
                        "after the fault was detected"
                    )
                    pending_resume = None
                verdict = watch.step()
                if verdict is not None and verdict.verdict in ("ok", "slow"):
                    report.succeeded, report.detail = True, f"all ranks finished ({verdict.summary})"
                    return report
                anomaly = self._from_verdict(verdict) if verdict is not None else self._health(fired_conditions)
                if anomaly is None:
                    continue
                report.anomalies.append(anomaly)
                self.on_event(f"detected {anomaly.fault_type} on {anomaly.entity}")
                detected = time.time()
                action = self._respond(anomaly, report)
                report.actions.append(action)
                if action.kind is ActionKind.ALERT and anomaly.level < FaultLevel.DRAIN:
                    continue  # a health-check alert: the job keeps running
                if action.status is not ActionStatus.EXECUTED or action.kind is ActionKind.ALERT:
                    report.detail = f"gave up: {action.result}"
                    return report
                report.attempts += 1
                fired_conditions.clear()
                self.tracker.reset_attempt()
                watch = self._supervisor()
                pending_resume = {"detected": detected, "restarted": time.time()}
                self.on_event(action.result)
            report.detail = f"timed out after {self.timeout_s:g}s"
            return report
        finally:
            self.job.stop()

    def _precheck(self, report: FailoverReport) -> Action | None:
        """Run PreCheck on the job's rank count; a bad machine gets an alert and the job does not start."""
        spec = self.job.spec.spec.precheck
        ranks = len(self.job.devices)
        self.on_event(f"PreCheck on {ranks} ranks")
        per_rank = run_local(ranks, CheckOptions(allreduce_mb=2.0, memcpy_mb=16.0, matmul_n=256, repeats=3))
        baselines = Baselines.load(spec.baseline or settings().home / "precheck-baselines.json")
        machines = verdicts(per_rank, baselines.entries.get(hardware_key(ranks), {}), spec.tolerance)
        bad = [m for m in machines if m.verdict is Verdict.BAD]
        if not bad:
            unjudged = [m.host for m in machines if m.verdict is Verdict.NO_BASELINE]
            # A missing baseline does not keep a job off its machines (NVML health was still judged); it is said.
            self.on_event(f"PreCheck: no baseline for {', '.join(unjudged)}, performance not judged (record one with "
                          "`vigil precheck --record-baseline`); NVML health good" if unjudged
                          else "PreCheck: every machine good")
            return None
        for machine in bad:
            anomaly = machine.to_anomaly(time.time())
            if anomaly is not None:
                report.anomalies.append(anomaly)
        reason = "PreCheck failed on " + "; ".join(f"{m.host} ({', '.join(m.failing)})" for m in bad)
        action = Action(
            ts=time.time(),
            kind=ActionKind.ALERT,
            target=self.job.entity,
            reason=reason,
            params={"precheck": [m.to_dict() for m in bad]},
        )
        return self.remediator.execute(action)

    def _resumed(self) -> bool:
        return all(r.start_step is not None and r.last_step > r.start_step for r in self.tracker.ranks)

    def _supervisor(self) -> Supervisor:
        """The supervisor of `vigil launch`, on this attempt's ranks: one hang verdict path for both."""
        hang_timeout = self.health.hang_timeout_s
        config = SupervisorConfig(
            hang_timeout_s=hang_timeout,
            checkpoint_timeout_s=max(600.0, 10 * hang_timeout),
            startup_grace_s=self.startup_grace_s,
            flight_recorder=False,
            job=self.job.spec.name,
        )
        procs = dict(enumerate(self.job.processes))
        logs = {rank: self.job.log_path(rank) for rank in procs}
        return Supervisor(procs, self.job.probe_dir, config, self.on_event, log_paths=logs)

    def _from_verdict(self, diagnosis: HangDiagnosis) -> Anomaly:
        """A crash, hang or mismatch verdict as the anomaly the failover policy answers."""
        fault_type = {"crash": "rank_exit", "hang": "training_hang", "mismatch": "collective_mismatch"}[
            diagnosis.verdict
        ]
        # One culprit is a rank to move off its device; several (or none) blame the job.
        rank = diagnosis.culprit_ranks[0] if len(diagnosis.culprit_ranks) == 1 else None
        code = next((row.exit_code for row in diagnosis.ranks if row.rank == rank), None)
        return self._anomaly(
            fault_type, rank, diagnosis.summary, verdict=diagnosis.verdict, hang_kind=diagnosis.hang_kind,
            culprit_ranks=diagnosis.culprit_ranks, code=code, diagnosis=str(self.job.probe_dir / "diagnosis.json"),
        )

    def _health(self, fired: set[str]) -> Anomaly | None:
        now = time.time()
        for condition in self.health.metrics:
            if condition.name in fired:
                continue
            values = self.tracker.window(condition.metric, condition.window_s, now)
            if condition.holds(values):
                fired.add(condition.name)
                anomaly = self._anomaly(
                    f"health_check:{condition.name}",
                    None,
                    f"{condition.aggregation}({condition.metric}) over {condition.window_s:g}s "
                    f"{condition.op} {condition.threshold:g}",
                    level=FaultLevel.DEGRADED if condition.action == "alert" else FaultLevel.DRAIN,
                )
                anomaly.evidence[0].attrs["action"] = condition.action
                return anomaly
        return None

    def _anomaly(
        self,
        fault_type: str,
        rank: int | None,
        summary: str,
        level: FaultLevel = FaultLevel.DRAIN,
        **attrs: object,
    ) -> Anomaly:
        entity = rank_id(self.job.spec.name, rank) if rank is not None else self.job.entity
        now = time.time()
        evidence = Evidence(
            kind="detector",
            entity=entity,
            ts=now,
            summary=summary,
            attrs={"attempt": self.job.attempt, "rank": rank, **attrs},
        )
        return Anomaly(
            entity=entity,
            start=now,
            end=now,
            detector="failover-supervisor",
            fault_type=fault_type,
            level=level,
            evidence=[evidence],
        )

    def _respond(self, anomaly: Anomaly, report: FailoverReport) -> Action:
        restarts = report.attempts - 1
        requested = anomaly.evidence[0].attrs.get("action")
        kind = FAILOVER_ACTIONS[str(requested)] if requested else self.policy.action_kind
        reason = f"{anomaly.fault_type} on {anomaly.entity}: {anomaly.evidence[0].summary}"
        if kind is not ActionKind.ALERT and restarts >= self.policy.max_retries:
            kind = ActionKind.ALERT
            reason = f"failoverPolicy.maxRetries={self.policy.max_retries} exhausted; {reason}"
        action = Action(
            ts=time.time(),
            kind=kind,
            target=self.job.entity,
            reason=reason,
            params={
                "anomaly": anomaly.id,
                "fault_type": anomaly.fault_type,
                "attempt": self.job.attempt,
                "bad_rank": anomaly.evidence[0].attrs.get("rank"),
                "exclude_failed_device": self.policy.exclude_failed_device,
            },
        )
        return self.remediator.execute(action)


def run_job(
    spec_path: Path, out_dir: Path, *, db_url: str | None = None, console: Console | None = None
) -> FailoverReport:
    """`vigil launch job job.yaml`: run a TrainingJob spec under the failover supervisor.

    The spec's failoverPolicy decides what a crash or hang leads to (restart from the latest
    checkpoint, migrate the failed rank to a spare device, or alert and stop), its healthCheck which
    metric conditions raise an alert or a restart; every action lands in the audit log."""
    spec = load_jobspec(spec_path)
    console = console or Console(stderr=True)
    job = LocalJob(spec, out_dir)
    with console.status(f"running {escape(spec.name)}: {spec.spec.replicas} ranks") as status:

        def on_event(message: str) -> None:
            console.log(message, markup=False)
            status.update(escape(message))

        watcher = CheckpointWatcher(job, db_url, on_event) if spec.spec.eval is not None else None
        try:
            with signals_raise():
                report = FailoverSupervisor(job, AuditLog(db_url), on_event=on_event, **lease_of(settings())).run()
        finally:
            if watcher is not None:
                watcher.finish()
        if watcher is not None:
            report.evaluations = watcher.evaluations
        return report


class CheckpointWatcher:
    """The spec's ``eval``: a thread that evaluates each complete checkpoint of the job as it appears (the
    ``vigil checkpoint watch`` machinery: once each, asynchronously, restart-safe), and once the job has ended
    evaluates what is left before the report is written. A failed evaluation is an incident."""

    def __init__(self, job: LocalJob, db_url: str | None, on_event: Callable[[str], None]) -> None:
        assert job.spec.spec.eval is not None
        spec = job.spec.spec.eval
        command = [sys.executable if i == 0 and part in ("python", "python3") else part
                   for i, part in enumerate(spec.command)]
        logdir = Path(spec.logdir) if spec.logdir else None
        self.config = EvalConfig(
            command=command,
            max_parallel=spec.max_parallel,
            devices=spec.devices,
            retries=spec.retries,
            timeout_s=spec.timeout_s,
            logdir=logdir if logdir is None or logdir.is_absolute() else job.run_dir / logdir,
        )
        self.job = job
        self.db_url = db_url
        self.on_event = on_event
        self.interval_s = spec.interval_s
        self.evaluations: list[dict[str, object]] = []
        self.error: BaseException | None = None
        self.stop = threading.Event()
        job.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        self.thread = threading.Thread(target=self._run, name=f"vigil-eval-{job.spec.name}", daemon=True)
        self.thread.start()

    def finish(self) -> None:
        """The job has ended: evaluate what is left, then stop."""
        self.stop.set()
        self.thread.join()
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        # The evaluator's ledger is a SQLite connection, used only from this thread.
        try:
            evaluator = CheckpointEvaluator(
                self.job.checkpoint_dir, self.config, on_failure=self._failed, on_done=self._done
            )
            try:
                evaluator.run(interval_s=self.interval_s, stop=self.stop.is_set)
                evaluator.run(interval_s=min(self.interval_s, 0.5), until_idle=True)
                self.evaluations = [dataclasses.asdict(r) for r in evaluator.ledger.records()]
            finally:
                evaluator.close()
        except BaseException as err:  # handed to the main thread by finish()
            self.error = err

    def _done(self, record: EvalRecord) -> None:
        scalars = ", ".join(f"{k}={v:.6g}" for k, v in sorted(record.metrics.items()))
        self.on_event(f"evaluated checkpoint step {record.step}: {scalars}")

    def _failed(self, record: EvalRecord) -> None:
        incident = failure_incident(self.job.spec.name, record)
        store = Store(self.db_url) if self.db_url else open_store()
        try:
            if store.incident(incident.id) is None:
                store.upsert_incident(incident)
        finally:
            store.close()
        self.on_event(incident.evidence[0].summary)


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
            "evaluations": report.evaluations,
        },
        indent=2,
    )


def print_report(report: FailoverReport, console: Console) -> None:
    style = "green" if report.succeeded else "bold red"
    console.print(
        f"[{style}]{escape(report.job)}: {'finished' if report.succeeded else 'failed'}[/] after "
        f"{report.attempts} attempt(s): {escape(report.detail)}"
    )
    for anomaly, action in zip(report.anomalies, report.actions, strict=False):
        console.print(
            f"  {anomaly.fault_type} on {anomaly.entity} -> {action.kind.value} [{action.status.value}] "
            f"{action.result}",
            markup=False,
        )
    for recovery in report.recoveries:
        console.print(f"  resumed training {recovery['resumed'] - recovery['detected']:.1f}s after detection")
