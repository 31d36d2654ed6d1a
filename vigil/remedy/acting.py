"""The remediator a server or an engine acts through, built the same way for both from the settings.

``vigil serve --actuator slurm`` executes approved actions through it; ``vigil engine --actuator slurm``
builds it to finish, at start, what a killed predecessor left half done (``Remediator.recover``).
"""

from __future__ import annotations

from typing import get_args

from vigil.config import RemedyBackend, Settings
from vigil.model import Topology, VigilInputError
from vigil.remedy.actuators.base import Actuator, OutboxActuator
from vigil.remedy.audit import AuditLog
from vigil.remedy.guard import BlastRadiusGuard
from vigil.remedy.lifecycle import LifecycleStore
from vigil.remedy.remediator import Remediator

ACTUATORS: tuple[str, ...] = get_args(RemedyBackend)


def check_actuator(actuator: str) -> None:
    """``--actuator`` names a back end there is, or the command stops with one line."""
    if actuator not in ACTUATORS:
        raise VigilInputError(f"--actuator {actuator!r}: expected {', '.join(ACTUATORS[:-1])} or {ACTUATORS[-1]}")


def scheduler_actuator(backend: str) -> Actuator | None:
    """The actuator of a scheduler back end (``kubernetes``, ``slurm``); None for ``none``."""
    if backend == "kubernetes":
        from vigil.remedy.actuators.kubernetes import KubernetesActuator

        return KubernetesActuator()
    if backend == "slurm":
        from vigil.remedy.actuators.slurm import SlurmActuator

        return SlurmActuator()
    return None


def remediator_for(actuator: str, settings: Settings, topology: Topology, lifecycle: LifecycleStore,
                   requested_by: str) -> Remediator | None:
    """Blast-radius guard, node lifecycle and audit log in front of the chosen back end; alerts, tickets and
    diagnostics go to <home>/outbox.jsonl. None when nothing is executed (``actuator`` none, or
    ``execute_actions`` off)."""
    check_actuator(actuator)
    if actuator == "none" or not settings.execute_actions:
        return None
    backends: list[Actuator] = [OutboxActuator(settings.home / "outbox.jsonl")]
    scheduler = scheduler_actuator(actuator)
    if scheduler is not None:
        backends.append(scheduler)
    guard = BlastRadiusGuard(topology, lifecycle, max_share=settings.max_cordon_share,
                             max_share_per_switch=settings.max_cordon_share_per_switch)
    return Remediator(backends, AuditLog(settings.database_url()), lifecycle=lifecycle, guard=guard,
                      dry_run=False, requested_by=requested_by)
