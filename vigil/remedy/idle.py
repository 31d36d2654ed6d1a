"""The idle-worker policy: a job holding GPUs that sit idle is told first, and released after a grace period.

From a GPU waste report (``vigil.detect.waste``): for each job with idle GPUs,

1. no notice yet (or none since it last worked): an ``alert`` to the job, naming the idle GPUs;
2. a notice sent at least ``grace_s`` ago, and the GPUs idle ever since (the report's window reaches back to
   the notice): ``preempt`` the job (take its capacity back; the tidal scheduler's kind, which the Slurm and
   Kueue actuators carry out);
3. a notice within the grace period: nothing, the grace period runs.

Run it with a report window of at least twice the grace period, at least once per grace period.

Every step is an Action through the Remediator - whitelist, dry-run unless asked, idempotency key, audit
record - and the notice a release waits for is found in that audit: only a notice that was really sent
(executed) starts the grace period, so a dry run never releases anything later.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from vigil.detect.waste import WasteReport
from vigil.model import Action, ActionKind, ActionStatus, VigilInputError, job_id
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
    report: WasteReport, audit: AuditLog, policy: IdleWorkerPolicy, now: float | None = None
) -> list[Action]:
    """What the policy asks for now, per job of ``report`` (to be run through a Remediator)."""
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
                actions.append(Action(
                    ts=now, kind=ActionKind.PREEMPT, target=target,
                    reason=f"{len(idle)} GPUs idle since notice {notice.id} ({now - notice.ts:.0f} s ago)",
                    params={"policy": POLICY, "stage": "release", "idle_gpus": idle, "notice": notice.id,
                            "idempotency_key": f"{POLICY}:{notice.id}"},
                ))
            continue
        actions.append(Action(
            ts=now, kind=ActionKind.ALERT, target=target,
            reason=f"{len(idle)} of {row.allocated_gpus} allocated GPUs idle: {', '.join(idle[:16])}; "
                   f"released after {policy.grace_s:g} s unless they start working",
            params={"policy": POLICY, "stage": "notice", "idle_gpus": idle},
        ))
    return actions
