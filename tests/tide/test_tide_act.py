"""From a tidal plan to actions: quotas, notices a lead ahead (youngest job first), preemption once a notice
runs out; the Slurm actuator's command lines for them and its refusal of bad parameters."""

from __future__ import annotations

import pytest

from tests.tide.tide_inputs import plan_of
from vigil.model import Action, ActionKind, ActionStatus
from vigil.remedy.actuators.base import ActuatorError
from vigil.remedy.actuators.slurm import SlurmActuator
from vigil.remedy.tide.act import Notice, TierJob, given_notices, tide_actions
from vigil.remedy.tide.slurm import qos_commands, qos_names
from vigil.remedy.tide.tiers import load_tier_policy

POLICY = load_tier_policy()  # 5 min intervals, tier 3 notice lead 15 min (3 intervals), grace 5 min
QOS = qos_names(POLICY)


def jobs(*specs: tuple[str, int, int, str]) -> list[TierJob]:
    return [TierJob(job, f"train-spot-{job}", tier, units, started) for job, tier, units, started in specs]


def test_quota_follows_the_plan_and_nothing_is_preempted_when_it_fits() -> None:
    actions = tide_actions(plan_of([64, 64, 64, 64]), POLICY, jobs(("1", 3, 32, "T1"), ("2", 3, 32, "T2")), [], 0.0,
                           cluster="c1", queues=QOS)
    assert [(a.kind, a.params["queue"], a.params["units"]) for a in actions] == [
        (ActionKind.SET_QUOTA, "spot-training", 64), (ActionKind.SET_QUOTA, "offline-inference", 0)]


def test_a_shrink_inside_the_lead_notices_the_youngest_jobs_a_lead_ahead() -> None:
    running = jobs(("old", 3, 32, "2026-01-01T00:00:00"), ("mid", 3, 32, "2026-01-01T01:00:00"),
                   ("new", 3, 32, "2026-01-01T02:00:00"))
    # 96 held; the plan keeps 96 now and drops to 40 in three intervals: two youngest jobs must go
    actions = tide_actions(plan_of([96, 96, 96, 40, 40]), POLICY, running, [], 1000.0, cluster="c1", queues=QOS)
    notices = [a for a in actions if a.kind is ActionKind.PREEMPT_NOTICE]
    assert [a.target for a in notices] == ["job/new", "job/mid"]
    assert all(a.params["effective_ts"] == 1000.0 + 900.0 and a.params["signal"] == "USR1" for a in notices)
    # a shrink beyond the lead is not told yet
    later = tide_actions(plan_of([96, 96, 96, 96, 40]), POLICY, running, [], 1000.0, cluster="c1", queues=QOS)
    assert not [a for a in later if a.kind is ActionKind.PREEMPT_NOTICE]


def test_a_burst_gives_only_the_grace_period_and_tier4_goes_at_once() -> None:
    running = jobs(("s", 3, 32, "T1"), ("b1", 4, 8, "T1"), ("b2", 4, 8, "T2"))
    actions = tide_actions(plan_of([0, 0], [8, 8]), POLICY, running, [], 50.0, cluster="c1", queues=QOS)
    (notice,) = [a for a in actions if a.kind is ActionKind.PREEMPT_NOTICE]
    assert notice.target == "job/s" and notice.params["effective_ts"] == 50.0 + 300.0
    assert [a.target for a in actions if a.kind is ActionKind.PREEMPT] == ["job/b2"]


def test_a_notice_that_ran_out_preempts_and_is_not_given_twice() -> None:
    running = jobs(("a", 3, 32, "T1"))
    given = [Notice("a", 900.0), Notice("gone", 100.0)]
    before = tide_actions(plan_of([0, 0, 0, 0]), POLICY, running, given, 899.0, cluster="c1", queues=QOS)
    assert [a.kind for a in before] == [ActionKind.SET_QUOTA] * 2
    after = tide_actions(plan_of([0, 0, 0, 0]), POLICY, running, given, 900.0, cluster="c1", queues=QOS)
    assert [(a.kind, a.target) for a in after][2:] == [(ActionKind.PREEMPT, "job/a")]


def test_given_notices_reads_only_executed_notices() -> None:
    def notice(status: ActionStatus) -> Action:
        return Action(ts=0.0, kind=ActionKind.PREEMPT_NOTICE, target="job/7", status=status,
                      params={"effective_ts": 60.0})
    assert given_notices([notice(ActionStatus.EXECUTED), notice(ActionStatus.PROPOSED),
                          notice(ActionStatus.FAILED)]) == [Notice("7", 60.0)]


def test_qos_commands_preempt_downward_and_requeue_the_preemptible_tiers() -> None:
    commands = {argv[4]: argv[5:] for argv in qos_commands(POLICY)}
    assert list(commands) == ["offline-inference", "spot-training", "high-priority-training", "online-inference"]
    assert "Preempt=spot-training,offline-inference" in commands["online-inference"]
    assert "Preempt=offline-inference" in commands["spot-training"]
    assert {"PreemptMode=requeue", "GraceTime=300"} <= set(commands["spot-training"])
    assert not any(s.startswith("PreemptMode") for s in commands["high-priority-training"])
    assert "GrpTRES=gres/gpu=200" in commands["high-priority-training"]


def test_slurm_actuator_command_lines_and_bad_parameters() -> None:
    slurm = SlurmActuator()
    notice = Action(ts=0.0, kind=ActionKind.PREEMPT_NOTICE, target="job/42", params={"signal": "SIGUSR2"})
    assert slurm.accepts(notice) and slurm.command(notice) == ["scancel", "--signal=USR2", "--full", "42"]
    assert slurm.command(Action(ts=0.0, kind=ActionKind.PREEMPT, target="job/42")) == ["scontrol", "requeue", "42"]
    quota = Action(ts=0.0, kind=ActionKind.SET_QUOTA, target="cluster/c1",
                   params={"queue": "spot-training", "resource": "gres/gpu", "units": 96})
    assert slurm.accepts(quota)
    assert slurm.command(quota)[-1] == "GrpTRES=gres/gpu=96"
    assert not slurm.accepts(Action(ts=0.0, kind=ActionKind.SET_QUOTA, target="node/n1"))
    for params in ({"queue": "spot; rm -rf /", "units": 1}, {"queue": "spot", "units": -1},
                   {"queue": "spot", "units": 1, "resource": "gres/gpu=1,cpu"}):
        with pytest.raises(ActuatorError):
            slurm.command(Action(ts=0.0, kind=ActionKind.SET_QUOTA, target="cluster/c1", params=params))
    with pytest.raises(ActuatorError, match="notice signal"):
        slurm.command(notice.model_copy(update={"params": {"signal": "KILL"}}))


def test_a_preempted_job_resumes_oldest_first_when_its_tier_has_room_for_the_lead() -> None:
    running = jobs(("a", 3, 32, "T1"))
    waiting = jobs(("old", 3, 32, "T0"), ("new", 3, 32, "T5"), ("big", 3, 96, "T0"))
    # room for 64 more over the whole lead: 'big' does not fit, 'old' does, then 'new'
    actions = tide_actions(plan_of([96, 96, 96, 96]), POLICY, running, [], 0.0, cluster="c1", queues=QOS,
                           waiting=waiting)
    assert [(a.kind, a.target) for a in actions][2:] == [(ActionKind.RESTART_JOB, "job/old"),
                                                         (ActionKind.RESTART_JOB, "job/new")]
    # a shrink inside the lead leaves no room: nothing resumes
    shrinking = tide_actions(plan_of([96, 96, 32, 32]), POLICY, running, [], 0.0, cluster="c1", queues=QOS,
                             waiting=waiting)
    assert not [a for a in shrinking if a.kind is ActionKind.RESTART_JOB]
