"""Local jobs: run a TrainingJob's ranks as processes, watch them, and fail over per its policy.

``LocalJob`` starts the ranks torchrun-style (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, plus
VIGIL_DEVICE and the checkpoint settings) and can restart them all from the latest checkpoint,
moving a failed rank to a spare device when the spec lists one. ``FailoverSupervisor`` watches the
ranks - exit codes, heartbeat (the per-rank progress files), healthCheck metric conditions - turns
what it sees into Anomaly records, and acts through the Remediator with ``LocalActuator``, so every
restart is an audited Action like any other.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from vigil.model import Action, ActionKind, ActionStatus, Anomaly, Evidence, FaultLevel, job_id, rank_id
from vigil.remedy.actuators.base import Actuator, ActuatorError, OutboxActuator
from vigil.remedy.audit import AuditLog
from vigil.remedy.heartbeat import progress_path
from vigil.remedy.jobspec import FAILOVER_ACTIONS, TrainingJob
from vigil.remedy.remediator import Remediator

POLL_S = 0.1


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class RankProgress:
    offset: int = 0
    last_ts: float | None = None
    last_step: int = 0
    start_step: int | None = None
    done: bool = False
    metrics: list[tuple[float, dict[str, float]]] = field(default_factory=list)


class ProgressTracker:
    """Tails ``progress-rank<r>.jsonl`` (vigil.remedy.heartbeat): each line a step, a start or a done."""

    def __init__(self, run_dir: Path, world_size: int) -> None:
        self.run_dir = run_dir
        self.ranks = [RankProgress() for _ in range(world_size)]
        # Whether this job has ever sent a heartbeat: only then does silence mean a hang.
        self.heard = False

    def reset_attempt(self) -> None:
        for rank in self.ranks:
            rank.start_step, rank.done, rank.last_ts = None, False, None

    def update(self) -> None:
        for r, rank in enumerate(self.ranks):
            path = progress_path(self.run_dir, r)
            if not path.exists():
                continue
            with path.open() as stream:
                stream.seek(rank.offset)
                chunk = stream.read()
            complete = chunk[: chunk.rfind("\n") + 1]
            rank.offset += len(complete.encode())
            for line in complete.splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue
                rank.last_ts = time.time()
                self.heard = True
                if record.get("event") == "start":
                    rank.start_step = rank.last_step = int(record["step"])
                elif record.get("event") == "done":
                    rank.done = True
                else:
                    rank.last_step = int(record["step"])
                    values = {k: float(v) for k, v in record.items() if k not in ("step", "ts")}
                    rank.metrics.append((float(record["ts"]), values))

    def window(self, metric: str, seconds: float, now: float) -> list[float]:
        """Every rank's values of ``metric`` from the last ``seconds``."""
        return [
            values[metric]
            for rank in self.ranks
            for ts, values in rank.metrics
            if ts >= now - seconds and metric in values
        ]


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
        self._logs: list[IO[bytes]] = []
        checkpoint_dir = Path(spec.spec.checkpoint.dir)
        self.checkpoint_dir = checkpoint_dir if checkpoint_dir.is_absolute() else self.run_dir / checkpoint_dir

    def command(self) -> list[str]:
        argv = list(self.spec.spec.command)
        if argv[0] in ("python", "python3"):
            argv[0] = sys.executable  # the interpreter Vigil runs in, with torch and vigil importable
        return argv

    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "logs").mkdir(exist_ok=True)
        port = free_port()
        checkpoint = self.spec.spec.checkpoint
        self.processes = []
        self.started_at = time.time()
        for rank, device in enumerate(self.devices):
            env = {
                **os.environ,
                **self.spec.spec.env,
                **self.env,
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(len(self.devices)),
                "LOCAL_WORLD_SIZE": str(len(self.devices)),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "VIGIL_JOB": self.spec.name,
                "VIGIL_DEVICE": device,
                "VIGIL_RESTART_COUNT": str(self.attempt),
                "VIGIL_RUN_DIR": str(self.run_dir),
                "VIGIL_CHECKPOINT_DIR": str(self.checkpoint_dir),
                "VIGIL_CHECKPOINT_EVERY": str(checkpoint.every_steps),
                "VIGIL_CHECKPOINT_KEEP_LAST": str(checkpoint.keep_last),
            }
            log = (self.run_dir / "logs" / f"rank{rank}.attempt{self.attempt}.log").open("wb")
            self._logs.append(log)
            self.processes.append(
                subprocess.Popen(self.command(), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            )

    def poll(self) -> list[int | None]:
        return [p.poll() for p in self.processes]

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM every rank's process group, SIGKILL what is left after ``grace_s``."""
        for proc in self.processes:
            if proc.poll() is None:
                _signal_group(proc, signal.SIGTERM)
        deadline = time.time() + grace_s
        for proc in self.processes:
            try:
                proc.wait(timeout=max(0.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
        for log in self._logs:
            log.close()
        self._logs.clear()

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


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


def culprits_from_stacks(pids: dict[int, int], timeout_s: float = 10.0) -> list[int] | None:
    """Ranks of a hung job whose main thread is outside torch.distributed while the others wait inside.

    The basic case of hang localization: the ranks that reached the collective wait in it; the one
    that never arrived is elsewhere. Stacks come from ``py-spy dump`` (works while a rank holds the
    GIL); None when they cannot be read or do not single anyone out.
    """
    from vigil.sources.probe.pyspy import dump_all

    dumps = dump_all(pids, timeout_s=timeout_s)
    if dumps.errors or len(dumps.dumps) != len(pids):
        return None
    in_collective = {}
    for rank, threads in dumps.dumps.items():
        main = next((t for t in threads if t.get("os_thread_id") == t.get("pid")), threads[0] if threads else None)
        frames = main.get("frames", []) if isinstance(main, dict) else []
        in_collective[rank] = any("torch/distributed" in str(f.get("filename", "")) for f in frames)
    outside = sorted(r for r, inside in in_collective.items() if not inside)
    return outside if 0 < len(outside) < len(in_collective) else None


class LocalActuator(Actuator):
    """Restarts (or migrates to spare devices) local jobs this process supervises."""

    name = "local"
    kinds = frozenset({ActionKind.RESTART_JOB, ActionKind.MIGRATE_JOB})
    target_kinds = frozenset({"job"})

    def __init__(self) -> None:
        self.jobs: dict[str, LocalJob] = {}

    def register(self, job: LocalJob) -> None:
        self.jobs[job.entity] = job

    def _job(self, action: Action) -> LocalJob:
        job = self.jobs.get(action.target)
        if job is None:
            raise ActuatorError(f"{action.target} is not a local job supervised here")
        return job

    def accepts(self, action: Action) -> bool:
        return super().accepts(action) and action.target in self.jobs

    def describe(self, action: Action) -> str:
        job = self._job(action)
        return f"stop the {len(job.devices)} ranks of {job.entity} and restart them from {job.checkpoint_dir}"

    def is_satisfied(self, action: Action) -> bool:
        # The fault was seen in attempt N; once the job is past N, this restart has already happened.
        return self._job(action).attempt > int(action.params.get("attempt", -1))

    def execute(self, action: Action) -> str:
        job = self._job(action)
        bad_rank = action.params.get("bad_rank")
        move = action.kind is ActionKind.MIGRATE_JOB or bool(action.params.get("exclude_failed_device"))
        return job.restart(int(bad_rank) if bad_rank is not None else None, move_bad_rank=move)


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
    ) -> None:
        self.job = job
        self.policy = job.spec.spec.failover_policy
        self.health = job.spec.spec.health_check
        self.local = LocalActuator()
        self.local.register(job)
        actuators: list[Actuator] = [self.local, OutboxActuator(outbox or job.run_dir / "alerts.jsonl")]
        # Launching a job with a failoverPolicy is the consent to restart it: this remediator acts.
        self.remediator = Remediator(actuators, audit, dry_run=False, requested_by="vigil-failover")
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
                codes = self.job.poll()
                if all(code == 0 for code in codes):
                    report.succeeded, report.detail = True, "all ranks finished"
                    return report
                anomaly = self._detect(codes) or self._health(fired_conditions)
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
                pending_resume = {"detected": detected, "restarted": time.time()}
                self.on_event(action.result)
            report.detail = f"timed out after {self.timeout_s:g}s"
            return report
        finally:
            self.job.stop()

    def _precheck(self, report: FailoverReport) -> Action | None:
        """Run PreCheck on the job's rank count; a bad machine gets an alert and the job does not start."""
        from vigil.config import settings
        from vigil.precheck.baseline import Baselines, hardware_key, verdicts
        from vigil.precheck.runner import CheckOptions, run_local

        spec = self.job.spec.spec.precheck
        ranks = len(self.job.devices)
        self.on_event(f"PreCheck on {ranks} ranks")
        per_rank = run_local(ranks, CheckOptions(allreduce_mb=2.0, memcpy_mb=16.0, matmul_n=256, repeats=3))
        baselines = Baselines.load(spec.baseline or settings().home / "precheck-baselines.json")
        machines = verdicts(per_rank, baselines.entries.get(hardware_key(ranks), {}), spec.tolerance)
        bad = [m for m in machines if m.verdict == "bad"]
        if not bad:
            self.on_event("PreCheck: every machine good")
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

    def _detect(self, codes: list[int | None]) -> Anomaly | None:
        now = time.time()
        failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            # The first rank to die is the suspect; the others usually fail because it vanished.
            # A rank killed by a signal (negative code) beats one that exited because its peer vanished.
            rank, code = min(failed, key=lambda rc: (rc[1] >= 0, self.tracker.ranks[rc[0]].last_ts or 0.0))
            return self._anomaly("rank_exit", rank, f"rank {rank} exited with code {code}", code=code)
        if not self.tracker.heard:
            return None  # a job without heartbeats is watched for crashes only
        if all(p.last_ts is None for p in self.tracker.ranks):
            if now - self.job.started_at > max(self.startup_grace_s, self.health.hang_timeout_s):
                return self._anomaly("training_hang", None, "no rank reported progress after start")
            return None
        # A rank that has not reported since this attempt started is still starting up (imports,
        # rendezvous, checkpoint load): it gets the start-up grace, not the hang timeout.
        startup_limit = max(self.startup_grace_s, self.health.hang_timeout_s)
        stalled = [
            r
            for r, p in enumerate(self.tracker.ranks)
            if not p.done
            and codes[r] is None
            and (
                now - p.last_ts > self.health.hang_timeout_s
                if p.last_ts is not None
                else now - self.job.started_at > startup_limit
            )
        ]
        if stalled:
            # A rank behind all others is the culprit: the rest wait for it in a collective. When
            # several stopped at the same step, their stacks tell: the culprit is the one not inside
            # a collective. If that is unclear too, the job is blamed and no device is excluded.
            steps = {r: p.last_step for r, p in enumerate(self.tracker.ranks)}
            lowest = min(steps.values())
            behind = [r for r, step in steps.items() if step == lowest]
            if len(behind) > 1:
                behind = culprits_from_stacks({r: self.job.processes[r].pid for r in behind}) or behind
            culprit = behind[0] if len(behind) == 1 else None
            where = (
                f"rank {culprit} stuck after step {lowest}" if culprit is not None else f"all ranks at step {lowest}"
            )
            return self._anomaly("training_hang", culprit, f"no progress for {self.health.hang_timeout_s:g}s; {where}")
        return None

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
