from __future__ import annotations

from pathlib import Path

import pytest

from vigil.model import Action, ActionKind, ActionStatus, Node, Topology, VigilInputError
from vigil.remedy.actuators.base import OutboxActuator
from vigil.remedy.audit import AuditLog
from vigil.remedy.lifecycle import LifecycleStore, NodeState, Trigger
from vigil.remedy.remediator import Remediator


def test_full_self_healing_path_is_persisted(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/remedy.db"
    store = LifecycleStore(url)
    path = [Trigger.SUSPECT, Trigger.CORDON, Trigger.DRAIN, Trigger.DRAINED, Trigger.REPAIRED, Trigger.SELF_CHECK_PASS]
    states = [store.apply("node/n1", trigger, "test").state for trigger in path]
    assert states == [
        NodeState.SUSPECT,
        NodeState.CORDONED,
        NodeState.DRAINING,
        NodeState.REPAIRING,
        NodeState.SELF_CHECK,
        NodeState.HEALTHY,
    ]
    # A second process (e.g. `vigil nodes`) reads the same truth.
    reopened = LifecycleStore(url)
    assert reopened.states() == {"node/n1": "healthy"}
    assert [t.trigger for t in reopened.history("node/n1")] == path


def test_failed_self_checks_end_at_the_vendor(tmp_path: Path) -> None:
    store = LifecycleStore(f"sqlite:///{tmp_path}/remedy.db", max_repairs=2)
    store.apply("node/n2", Trigger.CORDON)
    store.apply("node/n2", Trigger.REPAIR)
    store.apply("node/n2", Trigger.REPAIRED)
    assert store.apply("node/n2", Trigger.SELF_CHECK_FAIL).state is NodeState.REPAIRING
    store.apply("node/n2", Trigger.REPAIRED)
    assert store.apply("node/n2", Trigger.SELF_CHECK_FAIL).state is NodeState.VENDOR_REPAIR
    assert store.out_of_service() == {"node/n2"}
    store.apply("node/n2", Trigger.RETURNED)
    assert store.apply("node/n2", Trigger.SELF_CHECK_PASS).state is NodeState.HEALTHY
    assert store.status("node/n2").repair_attempts == 0


def test_illegal_transitions_and_bad_ids_are_refused(tmp_path: Path) -> None:
    store = LifecycleStore(f"sqlite:///{tmp_path}/remedy.db")
    with pytest.raises(VigilInputError, match="cannot apply 'drained'"):
        store.apply("node/n3", Trigger.DRAINED)
    with pytest.raises(VigilInputError, match="node ids"):
        store.apply("gpu/n3/0", Trigger.CORDON)
    assert store.states() == {}


def test_remediator_walks_the_lifecycle_and_finishes_repairs(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/remedy.db"
    store = LifecycleStore(url, max_repairs=2)
    audit = AuditLog(url)

    from vigil.remedy.actuators.base import Actuator

    class Recorder(Actuator):
        """A back end that only records: the lifecycle logic is what this test checks."""

        name = "recorder"
        kinds = frozenset({ActionKind.CORDON, ActionKind.DRAIN, ActionKind.REBOOT, ActionKind.UNCORDON})

        def __init__(self) -> None:
            self.done: list[tuple[ActionKind, str]] = []

        def describe(self, action: Action) -> str:
            return action.kind.value

        def execute(self, action: Action) -> str:
            self.done.append((action.kind, action.target))
            return "ok"

    recorder = Recorder()
    remediator = Remediator(
        [recorder, OutboxActuator(tmp_path / "outbox.jsonl")], audit, lifecycle=store, dry_run=False
    )
    for kind in (ActionKind.CORDON, ActionKind.DRAIN, ActionKind.REBOOT):
        assert remediator.execute(Action(ts=0, kind=kind, target="node/n4")).status is ActionStatus.EXECUTED
    assert store.status("node/n4").state is NodeState.REPAIRING
    assert remediator.finish_repair("node/n4", self_check_passed=True) is NodeState.HEALTHY
    assert recorder.done[-1] == (ActionKind.UNCORDON, "node/n4")

    remediator.execute(Action(ts=0, kind=ActionKind.REBOOT, target="node/n4"))
    assert remediator.finish_repair("node/n4", self_check_passed=False) is NodeState.REPAIRING
    assert remediator.finish_repair("node/n4", self_check_passed=False) is NodeState.VENDOR_REPAIR
    tickets = [a for a in audit.actions() if a.kind is ActionKind.VENDOR_TICKET]
    assert len(tickets) == 1 and tickets[0].status is ActionStatus.EXECUTED
    assert "vendor_ticket" in (tmp_path / "outbox.jsonl").read_text()
    assert Topology(nodes=[Node(name="n4")]).node("n4").id in store.out_of_service()


def test_diagnosis_plans_become_audited_actions(tmp_path: Path) -> None:
    from vigil.model import Diagnosis, RemediationStep
    from vigil.remedy.remediator import actions_from_plan

    diagnosis = Diagnosis(
        incident_id="inc-1",
        summary="GPU 3 of n9 fell off the bus",
        root_cause=None,
        confidence=0.9,
        plan=[
            RemediationStep(action=ActionKind.CORDON, target="node/n9", risk="medium", reason="Xid 79"),
            RemediationStep(action=ActionKind.ALERT, target="gpu/n9/3"),
        ],
        generated_by="llm",
    )
    audit = AuditLog(f"sqlite:///{tmp_path}/remedy.db")
    topology = Topology(nodes=[Node(name=f"n{i}") for i in range(10)])
    from vigil.remedy.guard import BlastRadiusGuard

    remediator = Remediator(
        [OutboxActuator(tmp_path / "outbox.jsonl")], audit, guard=BlastRadiusGuard(topology, max_share=0.1)
    )
    done = remediator.execute_all(actions_from_plan(diagnosis, ts=5.0))
    # No back end handles cordon here: refused, not silently dropped; the alert is proposed (dry-run).
    assert [(a.kind, a.status) for a in done] == [
        (ActionKind.CORDON, ActionStatus.REFUSED),
        (ActionKind.ALERT, ActionStatus.PROPOSED),
    ]
    assert all(a.incident_id == "inc-1" and a.requested_by == "vigil-diagnosis" for a in audit.actions())
    assert audit.actions()[1].reason == "GPU 3 of n9 fell off the bus"
