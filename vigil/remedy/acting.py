"""The remediator a server or an engine acts through, built the same way for both from the settings.

The back end is ``--actuator`` when given, else the setting ``remedy_backend`` (``VIGIL_REMEDY_BACKEND``), the same
one `vigil remedy act` uses. ``vigil serve`` executes approved actions through it (``POST
/actions/{id}/execute?dry_run=false``) and its engine, like ``vigil engine``, finishes at start what a killed
predecessor left half done (``Remediator.recover``). Execution stays opt-in: with ``execute_actions`` off the
remediator is a dry-run one (it only says what it would run) and nothing is resumed.
"""

from __future__ import annotations

from typing import get_args

from vigil.config import RemedyBackend, Settings
from vigil.model import Topology, VigilInputError
from vigil.remedy.actuators.base import Actuator, OutboxActuator
from vigil.remedy.audit import AuditLog
from vigil.remedy.guard import BlastRadiusGuard
from vigil.remedy.lease import lease_of
from vigil.remedy.lifecycle import LifecycleStore
from vigil.remedy.remediator import Remediator

ACTUATORS: tuple[str, ...] = get_args(RemedyBackend)


def chosen_actuator(given: str | None, settings: Settings) -> str:
    """``--actuator`` when given, else the configured ``remedy_backend``; checked."""
    actuator = given if given is not None else settings.remedy_backend
    check_actuator(actuator)
    return actuator


def acting_line(actuator: str, execute: bool) -> str:
    """What a server or engine says at start about the back end it acts through."""
    if execute:
        return f"remedy backend {actuator}: execute_actions on, approved actions run through it"
    return f"remedy backend {actuator}: dry-run, nothing runs through it (execute_actions off)"


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
    diagnostics go to <home>/outbox.jsonl. None for ``actuator`` none; a dry-run remediator while
    ``execute_actions`` is off, whose dry runs hold no node in the guard (the process runs for long, and
    nothing it only proposes comes back into service)."""
    check_actuator(actuator)
    if actuator == "none":
        return None
    backends: list[Actuator] = [OutboxActuator(settings.home / "outbox.jsonl")]
    scheduler = scheduler_actuator(actuator)
    if scheduler is not None:
        backends.append(scheduler)
    guard = BlastRadiusGuard(topology, lifecycle, max_share=settings.max_cordon_share,
                             max_share_per_switch=settings.max_cordon_share_per_switch)
    return Remediator(backends, AuditLog(settings.database_url()), lifecycle=lifecycle, guard=guard,
                      dry_run=not settings.execute_actions, hold_dry_runs=False, requested_by=requested_by,
                      commands_keep_s=settings.remedy_commands_keep_days * 86400.0, **lease_of(settings))
