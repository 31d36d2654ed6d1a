"""The remediator a server or an engine acts through, built the same way for both from the settings.

``vigil serve --actuator slurm`` executes approved actions through it; ``vigil engine --actuator slurm``
builds it to finish, at start, what a killed predecessor left half done (``Remediator.recover``).
"""

from __future__ import annotations

from vigil.config import Settings
from vigil.model import Topology, VigilInputError
from vigil.remedy.actuators.base import Actuator, OutboxActuator
from vigil.remedy.audit import AuditLog
from vigil.remedy.guard import BlastRadiusGuard
from vigil.remedy.lifecycle import LifecycleStore
from vigil.remedy.remediator import Remediator

ACTUATORS = ("none", "kubernetes", "slurm")


def remediator_for(actuator: str, settings: Settings, topology: Topology, lifecycle: LifecycleStore,
                   requested_by: str) -> Remediator | None:
    """Blast-radius guard, node lifecycle and audit log in front of the chosen back end; alerts, tickets and
    diagnostics go to <home>/outbox.jsonl. None when nothing is executed (``actuator`` none, or
    ``execute_actions`` off)."""
    if actuator not in ACTUATORS:
        raise VigilInputError(f"--actuator {actuator!r}: expected none, kubernetes or slurm")
    if actuator == "none" or not settings.execute_actions:
        return None
    backends: list[Actuator] = [OutboxActuator(settings.home / "outbox.jsonl")]
    if actuator == "kubernetes":
        from vigil.remedy.actuators.kubernetes import KubernetesActuator

        backends.append(KubernetesActuator())
    else:
        from vigil.remedy.actuators.slurm import SlurmActuator

        backends.append(SlurmActuator())
    guard = BlastRadiusGuard(topology, lifecycle, max_share=settings.max_cordon_share,
                             max_share_per_switch=settings.max_cordon_share_per_switch)
    return Remediator(backends, AuditLog(settings.database_url()), lifecycle=lifecycle, guard=guard,
                      dry_run=False, requested_by=requested_by)
