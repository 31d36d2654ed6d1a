"""From a tidal plan to actions the actuators carry out (dry-run, guard and audit like every action).

Each round (once an interval):
- ``set_quota`` bounds tiers 3 and 4 to what the plan gives them now, so the scheduler starts no more;
- a running tier-3 job whose capacity the plan takes back within the notice lead gets a ``preempt_notice``
  (youngest first: it has the least work since its start to lose); tier 4 is preempted at once;
- a job whose notice has run out and that still runs is preempted (``preempt``: requeued), its checkpoint
  written in the grace its notice gave;
- a job Vigil preempted that waits inactive (a deactivated Kueue Workload) is resumed (``restart_job``), oldest
  first, when its tier has room again for the whole notice lead.

The scheduler's own preemption (Slurm QOS, Kueue) may take a job first; the actuators then find it no
longer running and skip the preempt.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from vigil.model import Action, ActionKind, ActionStatus, job_id
from vigil.remedy.tide.planner import TidePlan, lead_intervals
from vigil.remedy.tide.tiers import TierPolicy

NOTICE_SIGNAL = "USR1"


@dataclass(frozen=True)
class TierJob:
    """A running job of a preemptible tier and the units (GPUs) it holds; ``started`` orders youngest first."""

    id: str
    name: str
    tier: int
    units: int
    started: str


@dataclass(frozen=True)
class Notice:
    """A preempt_notice already given: the job must be gone by ``effective_ts``."""

    job: str
    effective_ts: float


def given_notices(actions: Iterable[Action]) -> list[Notice]:
    """The notices that reached their jobs (executed), from the audit log's preempt_notice records."""
    return [
        Notice(a.target.removeprefix("job/"), float(a.params["effective_ts"]))
        for a in actions
        if a.kind is ActionKind.PREEMPT_NOTICE and a.status is ActionStatus.EXECUTED and "effective_ts" in a.params
    ]


def _youngest_covering(jobs: Sequence[TierJob], units: int) -> list[TierJob]:
    chosen: list[TierJob] = []
    for job in sorted(jobs, key=lambda j: j.started, reverse=True):
        if units <= 0:
            break
        chosen.append(job)
        units -= job.units
    return chosen


def tide_actions(
    plan: TidePlan,
    policy: TierPolicy,
    jobs: Sequence[TierJob],
    notices: Sequence[Notice],
    now: float,
    *,
    cluster: str,
    queues: dict[int, str],
    resource: str = "gres/gpu",
    waiting: Sequence[TierJob] = (),
) -> list[Action]:
    """The actions that carry out the plan's first interval on the scheduler; ``queues`` names each tier's queue
    (Slurm QOS, Kueue ClusterQueue), ``resource`` what its quota counts."""
    if not plan.intervals:
        return []
    actions = [
        Action(ts=now, kind=ActionKind.SET_QUOTA, target=f"cluster/{cluster}", requested_by="vigil-tide",
               reason=f"tidal plan: tier {tier} holds at most {plan.intervals[0].tiers[tier]} GPUs this interval",
               params={"tier": tier, "queue": queues[tier], "resource": resource,
                       "units": plan.intervals[0].tiers[tier]})
        for tier in (3, 4)
    ]
    running = {job.id for job in jobs}
    noticed = {n.job: n for n in notices if n.job in running}
    for notice in noticed.values():
        if notice.effective_ts <= now:
            actions.append(Action(ts=now, kind=ActionKind.PREEMPT, target=job_id(notice.job), requested_by="vigil-tide",
                                  reason="tidal plan: the preemption notice ran out; the checkpoint is written"))
    lead = lead_intervals(policy)
    for tier in (3, 4):
        spec = policy.tier(tier)
        # the least this tier holds from now to the end of its notice lead: what it must be down to by then
        window = plan.intervals[: lead + 1] if tier == 3 else plan.intervals[:1]
        allowed = min(a.tiers[tier] for a in window)
        held = [j for j in jobs if j.tier == tier and j.id not in noticed]
        excess = sum(j.units for j in held) - allowed
        # capacity needed already this interval (a burst past the forecast) leaves only the grace period
        urgent = sum(j.units for j in held) > plan.intervals[0].tiers[tier]
        for job in _youngest_covering(held, excess):
            if spec.notice_lead_s > 0:
                effective = now + (spec.grace_period_s if urgent else spec.notice_lead_s)
                actions.append(Action(
                    ts=now, kind=ActionKind.PREEMPT_NOTICE, target=job_id(job.id), requested_by="vigil-tide",
                    reason=f"tidal plan: tier {tier} gives back {job.units} GPUs; checkpoint now",
                    params={"signal": NOTICE_SIGNAL, "effective_ts": effective, "tier": tier, "units": job.units}))
            else:
                actions.append(Action(ts=now, kind=ActionKind.PREEMPT, target=job_id(job.id), requested_by="vigil-tide",
                                      reason=f"tidal plan: tier {tier} gives back {job.units} GPUs at once"))
        room = allowed - sum(j.units for j in jobs if j.tier == tier)
        for job in sorted((j for j in waiting if j.tier == tier), key=lambda j: j.started):
            if job.units <= room:
                room -= job.units
                actions.append(Action(ts=now, kind=ActionKind.RESTART_JOB, target=job_id(job.id),
                                      requested_by="vigil-tide",
                                      reason=f"tidal plan: tier {tier} has room for {job.units} GPUs again"))
    return actions
