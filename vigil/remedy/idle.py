"""The idle-worker policy: a job holding GPUs that sit idle is told first, and released after a grace period.

From a GPU waste report (``vigil.detect.waste``): for each job with idle GPUs,

1. no notice yet (or none since it last worked): an ``alert`` to the job, naming the idle GPUs;
2. a notice sent at least ``grace_s`` ago, and the GPUs idle ever since (the report's window reaches back to
   the notice): ``preempt`` the job (take its capacity back; the tidal scheduler's kind, which the Slurm and
   Kueue actuators carry out);
3. a notice within the grace period: nothing, the grace period runs.

Run it with a report window of at least twice the grace period, at least once per grace period.

A job no scheduler back end can release (an interactive or bare machine, or a scheduler Vigil was not given)
gets the same notice, and at the release step a *release request* instead: the same ``preempt`` action,
marked ``release_by: owner``, which ``actuators.release.ReleaseRequestActuator`` carries out by asking the
job's owner (through the outbox) to stop its work and free the GPUs, naming them and their machines. Each
sent notice also opens an incident (``idle_incident``), and the release step adds its evidence to it, so
the waste is in the incident list and not only in the outbox.

Every step is an Action through the Remediator - whitelist, dry-run unless asked, idempotency key, audit
record - and the notice a release waits for is found in that audit: only a notice that was really sent
(executed) starts the grace period, so a dry run never releases anything later.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass

from vigil.detect.waste import WasteReport
from vigil.model import (
    Action,
    ActionKind,
    ActionStatus,
    Evidence,
    FaultLevel,
    Incident,
    VigilInputError,
    job_id,
    node_id,
    parse_entity,
)
from vigil.remedy.audit import AuditLog

POLICY = "idle-workers"


@dataclass(frozen=True)
class IdleWorkerPolicy:
    grace_s: float = 1800.0
    min_idle_gpus: int = 1

    def __post_init__(self) -> None:
        if not self.grace_s > 0:
            raise VigilInputError(f"the grace period must be positive seconds, not {self.grace_s}")
        if self.min_idle_gpus < 1:
            raise VigilInputError(f"min_idle_gpus must be at least 1, not {self.min_idle_gpus}")


def _last_notice(audit: AuditLog, target: str) -> Action | None:
    notices = [
        a for a in audit.actions(target=target, kind=ActionKind.ALERT, status=ActionStatus.EXECUTED)
        if a.params.get("policy") == POLICY
    ]
    return notices[-1] if notices else None


def idle_worker_actions(
    report: WasteReport,
    audit: AuditLog,
    policy: IdleWorkerPolicy,
    now: float | None = None,
    bare_jobs: Collection[str] = (),
) -> list[Action]:
    """What the policy asks for now, per job of ``report`` (to be run through a Remediator).

    ``bare_jobs``: jobs no configured scheduler can release (interactive or bare machines); their release step
    is a release request to the owner (``release_by: owner``), not a preemption by a scheduler.
    """
    now = time.time() if now is None else now
    actions = []
    for row in report.summary("job"):
        if len(row.idle_gpus) < policy.min_idle_gpus:
            continue
        target = job_id(row.name)
        idle = sorted(row.idle_gpus)
        notice = _last_notice(audit, target)
        # A notice holds while the GPUs stayed idle since it was sent: the report's window reaches back to it.
        if notice is not None and report.start <= notice.ts:
            if now - notice.ts >= policy.grace_s:
                params: dict[str, object] = {
                    "policy": POLICY, "stage": "release", "idle_gpus": idle, "notice": notice.id,
                    "idempotency_key": f"{POLICY}:{notice.id}",
                }
                if row.name in bare_jobs:
                    params["release_by"] = "owner"
                    params["nodes"] = sorted({node_id(parse_entity(gpu)[1][0]) for gpu in idle})
                actions.append(Action(
                    ts=now, kind=ActionKind.PREEMPT, target=target,
                    reason=f"{len(idle)} GPUs idle since notice {notice.id} ({now - notice.ts:.0f} s ago)",
                    params=params,
                ))
            continue
        actions.append(Action(
            ts=now, kind=ActionKind.ALERT, target=target,
            reason=f"{len(idle)} of {row.allocated_gpus} allocated GPUs idle: {', '.join(idle[:16])}; "
                   f"released after {policy.grace_s:g} s unless they start working",
            params={"policy": POLICY, "stage": "notice", "idle_gpus": idle},
        ))
    return actions


def idle_incident_id(action: Action) -> str:
    """The incident of the notice an idle-policy step belongs to (a notice's own id, or the one it names)."""
    return f"inc-idle-{action.params.get('notice', action.id)}"[:64]


def idle_incident(action: Action, earlier: Incident | None = None) -> Incident:
    """The incident of one executed idle-policy step: opened by the notice, grown by the release step.

    Its id comes from the notice's action id, so the release step finds the notice's incident, and running the
    policy again adds nothing twice (evidence is keyed by the action).
    """
    evidence = Evidence(
        ref=f"ev-{action.id}"[:64], kind="event", entity=action.target, ts=action.ts,
        summary=f"{action.kind.value} ({action.params.get('stage', '')}): {action.reason}; {action.result}"[:4096],
        attrs={"action_id": action.id, "idle_gpus": list(action.params.get("idle_gpus", []))},
    )
    gpus = [str(g) for g in action.params.get("idle_gpus", [])]
    if earlier is not None:
        known = {e.ref for e in earlier.evidence}
        grown = earlier.model_copy(deep=True)
        if evidence.ref not in known:
            grown.evidence.append(evidence)
        grown.end = max(grown.end, action.ts)
        return grown
    return Incident(
        id=idle_incident_id(action), title=f"{len(gpus)} allocated GPUs idle in {action.target}",
        scope=action.target, entities=[action.target, *gpus], start=action.ts, end=action.ts,
        level=FaultLevel.OBSERVE, fault_types=["gpu_idle"], evidence=[evidence],
    )
