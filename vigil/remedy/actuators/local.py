"""Restart or migrate local jobs that this process supervises (``vigil launch job``).

The jobs themselves are started by the one local launcher in ``vigil.run``; this actuator only needs
what the ``RestartableJob`` protocol names, so acting stays in remedy and launching in run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from vigil.model import Action, ActionKind
from vigil.remedy.actuators.base import Actuator, ActuatorError


class RestartableJob(Protocol):
    entity: str
    devices: list[str]
    checkpoint_dir: Path
    attempt: int

    def restart(self, bad_rank: int | None = None, move_bad_rank: bool = False) -> str: ...


class LocalActuator(Actuator):
    """Restarts (or migrates to spare devices) local jobs this process supervises."""

    name = "local"
    kinds = frozenset({ActionKind.RESTART_JOB, ActionKind.MIGRATE_JOB})
    target_kinds = frozenset({"job"})

    def __init__(self) -> None:
        self.jobs: dict[str, RestartableJob] = {}

    def register(self, job: RestartableJob) -> None:
        self.jobs[job.entity] = job

    def _job(self, action: Action) -> RestartableJob:
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
