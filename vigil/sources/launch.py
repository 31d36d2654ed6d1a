"""What `vigil launch` reports (``LaunchReport``) as the store's records: the job and its placement for the
topology, step telemetry as ``vigil_job_*`` samples, rank exits and the supervisor's verdict as events, and
the ``rank_log`` events the launch decoded from its ranks' log lines as they are.

The records say what the launch saw; judging them (a crash, a hang, a loss spike) is the rules' work in
``vigil.detect.rules``, so a verdict reported here and one read from Slurm become incidents the same way.
"""

from __future__ import annotations

import signal

from vigil.knowledge.faults import fault_level
from vigil.model import (
    Event,
    FaultLevel,
    Job,
    LaunchReport,
    Sample,
    StepTelemetry,
    VigilInputError,
    gpu_id,
    job_id,
    node_id,
    rank_id,
)

SOURCE = "vigil-launch"
# The job's end, by verdict, as the reason of a ``job`` event (the rules' vocabulary, shared with Slurm).
VERDICT_REASON = {"ok": "completed", "slow": "completed", "crash": "crashed", "hang": "hung", "mismatch": "hung"}
# Reasons after which the job runs no more: its telemetry stops and must not read as a stall.
JOB_ENDED = frozenset({"completed", "crashed", "hung", "failed", "cancelled"})


def report_job(report: LaunchReport, known: Job | None = None) -> Job | None:
    """The job with every rank placed on its GPU (or on its node, for a rank without one); None until the
    report places all ``world_size`` ranks."""
    if not report.placement:
        return None
    by_rank = {p.rank: p for p in report.placement}
    if sorted(by_rank) != list(range(report.world_size)):
        return None
    placement = [node_id(p.node) if p.gpu is None else gpu_id(p.node, p.gpu)
                 for p in (by_rank[r] for r in range(report.world_size))]
    start = known.start if known is not None else report.ts
    return Job(id=report.job, name=report.job, placement=placement, start=start, source="launch")


def report_samples(report: LaunchReport) -> list[Sample]:
    """Step telemetry as the job's ``vigil_job_*`` samples (the metric catalogue's names)."""
    entity = job_id(report.job)
    out: list[Sample] = []
    for step in report.steps:
        for metric, value in _metrics(step):
            out.append(Sample(ts=step.ts, entity=entity, metric=metric, value=value))
    return out


def _metrics(step: StepTelemetry) -> list[tuple[str, float]]:
    values: list[tuple[str, float | None]] = [
        ("vigil_job_steps_total", float(step.steps)),
        ("vigil_job_step_time_seconds", step.step_time_s),
        ("vigil_job_loss", step.loss),
        ("vigil_job_grad_norm", step.grad_norm),
        ("vigil_job_tokens_per_second", step.tokens_per_s),
        ("vigil_job_checkpoint_in_progress", 1.0 if step.checkpointing else 0.0),
    ]
    return [(metric, value) for metric, value in values if value is not None]


def report_logs(report: LaunchReport) -> list[Event]:
    """The ``rank_log`` events the launch decoded from its ranks' log lines; a launch speaks only for its own
    job's ranks, so an event of another kind or entity refuses the report."""
    ranks = {rank_id(report.job, r) for r in range(report.world_size)} if report.logs else set()
    for event in report.logs:
        if event.kind != "rank_log" or event.entity not in ranks:
            raise VigilInputError(f"launch report of job {report.job!r}: logs hold only rank_log events on its "
                                  f"{report.world_size} ranks, got {event.kind!r} on {event.entity!r}")
    return list(report.logs)


def report_events(report: LaunchReport) -> list[Event]:
    """Rank exits (with the signal that killed the rank, when one did) and the verdict as ``job`` events."""
    job = job_id(report.job)
    where = {p.rank: p for p in report.placement}
    events = []
    for state in report.ranks:
        if state.exit_code is None:
            continue
        attrs: dict[str, object] = {"rank": state.rank, "exit_code": state.exit_code}
        if state.rank in where:
            attrs["node"] = where[state.rank].node
        if state.exit_code < 0:
            attrs["signal"] = _signal_name(-state.exit_code)
        how = f"killed by {attrs['signal']}" if "signal" in attrs else f"exited with status {state.exit_code}"
        events.append(Event(ts=report.ts, entity=rank_id(report.job, state.rank), kind="rank_exit", source=SOURCE,
                            message=f"rank {state.rank} {how}", attrs=attrs,
                            level=FaultLevel.OBSERVE if state.exit_code == 0 else FaultLevel.DEGRADED))
    verdict = report.verdict
    if verdict is None:
        return events
    reason = VERDICT_REASON[verdict.verdict]
    message = (verdict.summary or verdict.verdict)[:8192]
    if reason == "completed" or not verdict.culprit_ranks:
        level = FaultLevel.OBSERVE if reason == "completed" else fault_level("job_crash")
        events.append(Event(ts=report.ts, entity=job, kind="job", source=SOURCE, message=message, level=level,
                            attrs={"reason": reason, "verdict": verdict.verdict,
                                   "exit_reason": verdict.root_error or verdict.summary}))
        return events
    fault = "job_crash" if reason == "crashed" else "job_hang"
    exit_codes = {**verdict.exit_codes, **{s.rank: s.exit_code for s in report.ranks if s.exit_code is not None}}
    for rank in verdict.culprit_ranks:
        attrs = {"reason": reason, "verdict": verdict.verdict, "rank": rank,
                 "exit_reason": verdict.root_error or verdict.summary}
        if verdict.hang_kind:
            attrs["hang_kind"] = verdict.hang_kind
        if rank in where:
            attrs["node"] = where[rank].node
            if where[rank].gpu is not None:
                attrs["gpu"] = where[rank].gpu
        if exit_codes.get(rank) is not None:
            attrs["exit_code"] = exit_codes[rank]
        events.append(Event(ts=report.ts, entity=job, kind="job", source=SOURCE, message=message,
                            level=fault_level(fault), attrs=attrs))
    return events


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
