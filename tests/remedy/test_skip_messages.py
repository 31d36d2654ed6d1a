"""An action skipped because its work is done says so in a sentence - "node/n1 is already cordoned" - for every
action kind, whether the node lifecycle or the back end found it done. On SQLite and on PostgreSQL."""

from __future__ import annotations

import pytest

from tests.remedy.claims import database as database
from tests.serve.conftest import postgres_url as postgres_url
from vigil.model import Action, ActionKind, ActionStatus
from vigil.remedy.actuators.base import Actuator
from vigil.remedy.audit import AuditLog
from vigil.remedy.lifecycle import LifecycleStore, Trigger
from vigil.remedy.remediator import Remediator

TARGETS = {ActionKind.RESET_GPU: "gpu/n1/0", ActionKind.RESTART_JOB: "job/ml:llama",
           ActionKind.MIGRATE_JOB: "job/ml:llama", ActionKind.PREEMPT_NOTICE: "job/ml:llama",
           ActionKind.PREEMPT: "job/ml:llama", ActionKind.DELETE_CHECKPOINT: "job/ml:llama",
           ActionKind.SET_QUOTA: "cluster/prod"}
# what each skip reads, written out here rather than derived from the table it checks
EXPECTED = {
    ActionKind.ALERT: "node/n1 already has an alert out",
    ActionKind.CORDON: "node/n1 is already cordoned",
    ActionKind.UNCORDON: "node/n1 is already uncordoned",
    ActionKind.DRAIN: "node/n1 is already drained",
    ActionKind.RESET_GPU: "gpu/n1/0 is already reset",
    ActionKind.REBOOT: "node/n1 is already rebooted",
    ActionKind.RESTART_JOB: "job/ml:llama is already restarted",
    ActionKind.MIGRATE_JOB: "job/ml:llama is already migrated",
    ActionKind.VENDOR_TICKET: "node/n1 already has a vendor ticket",
    ActionKind.RUN_DIAGNOSTICS: "node/n1 already has its diagnostics run",
    ActionKind.COLLECT_LOGS: "node/n1 already has its logs collected",
    ActionKind.PREEMPT_NOTICE: "job/ml:llama already has its preemption notice",
    ActionKind.PREEMPT: "job/ml:llama is already preempted",
    ActionKind.SET_QUOTA: "cluster/prod already has that quota",
    ActionKind.DELETE_CHECKPOINT: "job/ml:llama already has that checkpoint deleted",
}


class DoneAlready(Actuator):
    """A back end that finds every action's work done."""

    name = "slurm"
    kinds = frozenset(ActionKind)
    target_kinds = frozenset({"node", "gpu", "job", "cluster"})

    def describe(self, action: Action) -> str:
        return f"{action.kind.value} {action.target}"

    def is_satisfied(self, action: Action) -> bool:
        return True

    def execute(self, action: Action) -> str:
        raise AssertionError(f"{action.kind.value} ran although its work was done")


def approved(kind: ActionKind) -> Action:
    return Action(ts=0, kind=kind, target=TARGETS.get(kind, "node/n1"), status=ActionStatus.APPROVED)


def test_every_action_kind_has_its_sentence() -> None:
    assert set(EXPECTED) == set(ActionKind)


@pytest.mark.parametrize("kind", list(ActionKind), ids=lambda kind: kind.value)
def test_a_skip_per_the_back_end_reads_as_a_sentence(database: str, kind: ActionKind) -> None:
    """Before, the verb went in as it is: "node/n1 already cordon per slurm", "job/ml:llama already restart_job"."""
    remediator = Remediator([DoneAlready()], AuditLog(database), dry_run=False)
    skipped = remediator.execute(approved(kind))
    assert (skipped.status, skipped.result) == (ActionStatus.SKIPPED, f"{EXPECTED[kind]}, per slurm")


@pytest.mark.parametrize(("kind", "triggers"), [
    (ActionKind.CORDON, (Trigger.CORDON,)),
    (ActionKind.DRAIN, (Trigger.CORDON, Trigger.DRAIN, Trigger.DRAINED)),
    (ActionKind.UNCORDON, ()),
], ids=lambda value: value.value if isinstance(value, ActionKind) else "")
def test_a_skip_per_the_lifecycle_reads_as_a_sentence(database: str, kind: ActionKind,
                                                      triggers: tuple[Trigger, ...]) -> None:
    """Before: "node/n1 already cordon", "node/n1 already drain", "node/n1 already uncordon"."""
    lifecycle = LifecycleStore(database)
    for trigger in triggers:
        lifecycle.apply("node/n1", trigger, "fault")
    remediator = Remediator([DoneAlready()], AuditLog(database), lifecycle=lifecycle, dry_run=False)
    skipped = remediator.execute(approved(kind))
    assert (skipped.status, skipped.result) == (ActionStatus.SKIPPED, EXPECTED[kind])
    assert [(record.status, record.result) for record in AuditLog(database).actions()] == [
        (ActionStatus.SKIPPED, EXPECTED[kind])]
