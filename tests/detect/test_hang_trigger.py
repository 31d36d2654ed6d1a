"""Hang triggers on hand-made rank snapshots: progress without op records, adaptive step limits,
and the long pauses that are not hangs (checkpoint, evaluation, warm-up, a finished rank)."""

from __future__ import annotations

import inspect

from vigil.detect.hang import HangTrigger
from vigil.sources.probe.records import OpRecord, RankSnapshot

T0 = 1000.0


def snap(rank: int, *, last_step: float | None, steps: int = 5, step_time: float = 0.5,
         last_compute: float | None = None, last_eval: float | None = None, finished: bool = False,
         ops: list[OpRecord] | None = None, activity: dict[str, object] | None = None) -> RankSnapshot:
    return RankSnapshot(rank=rank, world_size=3, pid=100 + rank, host="h", heartbeat=T0 + 100, started=T0,
                        steps=steps, last_step=last_step, step_times=[step_time] * 4, last_compute=last_compute,
                        last_eval=last_eval, finished=finished, ops=ops or [], activity=activity or {})


def test_steps_stop_and_peers_idle_is_a_hang_without_any_op_record() -> None:
    trigger = HangTrigger(hang_timeout_s=3.0)
    now = T0 + 60
    snaps = {0: snap(0, last_step=now - 10, last_compute=now - 9.5),
             1: snap(1, last_step=now - 10, last_compute=now - 0.1),
             2: snap(2, last_step=now - 10, last_compute=now - 9.5)}
    reason = trigger.stall(snaps, {0, 1, 2}, now)
    assert reason is not None and "rank(s) [0, 2] neither compute nor communicate" in reason


def test_step_limit_adapts_to_the_jobs_step_times() -> None:
    trigger = HangTrigger(hang_timeout_s=3.0)
    now = T0 + 60
    slow = {r: snap(r, last_step=now - 10, last_compute=now - 9.5, step_time=4.0) for r in range(3)}
    assert trigger.step_timeout(slow) == 16.0
    assert trigger.stall(slow, {0, 1, 2}, now) is None
    assert trigger.stall(slow, {0, 1, 2}, now + 7) is not None


def test_evaluation_checkpoint_warmup_and_finished_ranks_are_not_hangs() -> None:
    trigger = HangTrigger(hang_timeout_s=3.0, startup_grace_s=60.0)
    now = T0 + 60
    waiting = OpRecord(record_id=7, group="0", group_ranks=[0, 1, 2], kind="collective", seq=9, op="barrier",
                       state="started", t_start=now - 20, timeout_s=3.0)
    evaluating = {0: snap(0, last_step=now - 20, last_eval=now - 0.2, last_compute=now - 0.2),
                  1: snap(1, last_step=now - 20, last_compute=now - 19, ops=[waiting]),
                  2: snap(2, last_step=now - 20, last_compute=now - 19, ops=[waiting])}
    assert trigger.stall(evaluating, {0, 1, 2}, now) is None
    # Forwards seconds apart (a validation loader taking 2.5 s a batch): still evaluating, within the timeout.
    slow_batches = {**evaluating, 0: snap(0, last_step=now - 20, last_eval=now - 2.5, last_compute=now - 2.5)}
    assert trigger.stall(slow_batches, {0, 1, 2}, now) is None
    done_evaluating = {**evaluating, 0: snap(0, last_step=now - 20, last_eval=now - 3.5, last_compute=now - 3.5)}
    assert trigger.stall(done_evaluating, {0, 1, 2}, now) is not None
    saving = dict(evaluating)
    saving[0] = snap(0, last_step=now - 20, activity={"kind": "checkpoint", "since": now - 19})
    assert trigger.stall(saving, {0, 1, 2}, now) is None
    warming_up = {r: snap(r, last_step=None, steps=0, ops=[waiting] if r else []) for r in range(3)}
    assert trigger.stall(warming_up, {0, 1, 2}, T0 + 30) is None
    assert trigger.stall(warming_up, {0, 1, 2}, T0 + 101) is not None  # 60 s grace past the last op
    done = {r: snap(r, last_step=now - 20, finished=True) for r in range(3)}
    assert trigger.stall(done, {0, 1, 2}, now) is None


def test_checkpoint_save_that_stopped_writing_is_a_hang() -> None:
    trigger = HangTrigger(hang_timeout_s=3.0)
    now = T0 + 60
    waiting = OpRecord(record_id=7, group="0", group_ranks=[0, 1, 2], kind="collective", seq=9, op="barrier",
                       state="started", t_start=now - 20, timeout_s=3.0)
    peers = {r: snap(r, last_step=now - 20, last_compute=now - 19, ops=[waiting]) for r in (1, 2)}
    writing = {"kind": "checkpoint", "since": now - 19, "progress_at": now - 1.0, "written": 1 << 20}
    assert trigger.stall({0: snap(0, last_step=now - 20, activity=writing), **peers}, {0, 1, 2}, now) is None
    stuck = {**writing, "progress_at": now - 3.5}
    reason = trigger.stall({0: snap(0, last_step=now - 20, activity=stuck), **peers}, {0, 1, 2}, now)
    assert reason is not None and "barrier #9" in reason
    # A record without write progress (an older probe) keeps the whole allowance.
    legacy = {"kind": "checkpoint", "since": now - 19}
    assert trigger.stall({0: snap(0, last_step=now - 20, activity=legacy), **peers}, {0, 1, 2}, now) is None


def test_op_past_its_timeout_while_the_job_is_still_names_the_op() -> None:
    trigger = HangTrigger(hang_timeout_s=3.0)
    now = T0 + 60
    waiting = OpRecord(record_id=7, group="0", group_ranks=[0, 1], kind="collective", seq=9, op="all_reduce",
                       state="started", t_start=now - 4, timeout_s=3.0)
    snaps = {0: snap(0, last_step=now - 5, last_compute=now - 4.5, ops=[waiting]),
             1: snap(1, last_step=now - 5, last_compute=now - 0.1)}
    reason = trigger.stall(snaps, {0, 1}, now)
    assert reason is not None and "rank 0 has waited 4.0 s in all_reduce #9" in reason


def test_the_default_timeout_outlasts_a_real_jobs_pause_and_still_catches_a_hang() -> None:
    """Rank 0 spends 90 s on something the probe does not mark (copying a checkpoint off the node, writing
    evaluation results) while its peers wait in a barrier: with the default timeout that is a pause, not a
    hang; the same silence past the default (5 min) is one. The launcher, the CLI and the probe share it."""
    from vigil.faces.cli.launch import script_command
    from vigil.run.launcher import launch
    from vigil.sources.probe.probe import Probe
    from vigil.sources.probe.records import DEFAULT_HANG_TIMEOUT_S

    trigger = HangTrigger()
    assert trigger.hang_timeout_s == DEFAULT_HANG_TIMEOUT_S == 300.0
    for function, name in ((script_command, "hang_timeout"), (launch, "hang_timeout"), (Probe, "hang_timeout_s")):
        assert inspect.signature(function).parameters[name].default == DEFAULT_HANG_TIMEOUT_S, function

    def paused(now: float, silent_s: float) -> dict[int, RankSnapshot]:
        waiting = OpRecord(record_id=7, group="0", group_ranks=[0, 1, 2], kind="collective", seq=9, op="barrier",
                           state="started", t_start=now - silent_s + 1)
        return {r: RankSnapshot(rank=r, world_size=3, pid=100 + r, host="h", heartbeat=now, started=T0, steps=50,
                                last_step=now - silent_s, step_times=[0.5] * 4, last_compute=now - silent_s + 1,
                                ops=[waiting] if r else [])
                for r in range(3)}

    now = T0 + 1000
    assert trigger.stall(paused(now, 90.0), {0, 1, 2}, now) is None
    reason = trigger.stall(paused(now, 360.0), {0, 1, 2}, now)
    assert reason is not None and "barrier #9" in reason
