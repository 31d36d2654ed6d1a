"""The blast-radius guard under a flood of 1,000 fault events, against a live (fake-scontrol) back end."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

from tests.remedy.claims import database as database
from tests.remedy.conftest import calls
from tests.serve.conftest import postgres_url as postgres_url
from vigil.config import load_settings
from vigil.model import Action, ActionKind, ActionStatus, Anomaly, FaultLevel, Gpu, Node, Topology
from vigil.remedy.acting import remediator_for
from vigil.remedy.actuators.base import Actuator, ActuatorError, OutboxActuator
from vigil.remedy.actuators.slurm import SlurmActuator
from vigil.remedy.audit import AuditLog
from vigil.remedy.guard import BlastRadiusGuard
from vigil.remedy.lifecycle import LifecycleStore
from vigil.remedy.policy import PolicyEngine, load_policies
from vigil.remedy.remediator import Remediator


def cluster(nodes: int = 100, per_switch: int = 10) -> Topology:
    return Topology(
        nodes=[
            Node(
                name=f"n{i:03d}",
                switch=f"leaf{i // per_switch}",
                gpus=[Gpu(node=f"n{i:03d}", index=g) for g in range(8)],
            )
            for i in range(nodes)
        ]
    )


def test_flood_of_1000_fault_events_never_exceeds_the_blast_radius(fake_slurm: Path, tmp_path: Path) -> None:
    topology = cluster()
    url = f"sqlite:///{tmp_path}/remedy.db"
    lifecycle, audit = LifecycleStore(url), AuditLog(url)
    guard = BlastRadiusGuard(topology, lifecycle, max_share=0.1, max_share_per_switch=0.3)
    remediator = Remediator(
        [SlurmActuator(), OutboxActuator(tmp_path / "outbox.jsonl")],
        audit,
        lifecycle=lifecycle,
        guard=guard,
        dry_run=False,
    )
    engine = PolicyEngine(load_policies())
    rng = random.Random(7)
    returned: list[Action] = []
    for _ in range(1000):
        node = rng.choice(topology.nodes)
        level = rng.choice([FaultLevel.DRAIN, FaultLevel.ISOLATE])
        fault = Anomaly(
            entity=f"gpu/{node.name}/{rng.randrange(8)}",
            start=0,
            end=0,
            detector="flood",
            fault_type=rng.choice(["xid_79", "xid_119", "ecc_dbe", "nvlink_down"]),
            level=level,
        )
        returned.extend(remediator.handle(fault, engine))

    out = lifecycle.out_of_service()
    assert 0 < len(out) <= 10  # 10% of 100 nodes
    per_switch = Counter(topology.node(n.removeprefix("node/")).switch for n in out)
    assert max(per_switch.values()) <= 3  # 30% of 10 nodes under one leaf
    drained = {c[1].removeprefix("nodename=") for c in calls(fake_slurm) if c[0] == "update"}
    assert drained == {n.removeprefix("node/") for n in out}  # nothing reached Slurm beyond the limit
    statuses = Counter(a.status for a in returned)
    assert statuses[ActionStatus.REFUSED] > 0 and statuses[ActionStatus.EXECUTED] > 0
    assert all("blast radius" in a.result for a in returned if a.status is ActionStatus.REFUSED)
    # Every action, whatever became of it, is in the audit log exactly once.
    audited = audit.actions()
    assert sorted(a.id for a in audited) == sorted(a.id for a in returned)
    assert all(a.requested_by == "vigil" and a.reason for a in audited)


def test_per_switch_limit_and_release(tmp_path: Path) -> None:
    topology = cluster(nodes=20, per_switch=10)
    guard = BlastRadiusGuard(topology, None, max_share=0.5, max_share_per_switch=0.2)
    assert [guard.admit(f"node/n00{i}").admitted for i in range(3)] == [True, True, False]
    assert "under switch leaf0" in guard.admit("node/n003").reason
    assert guard.admit("node/n010").admitted  # another leaf
    assert guard.admit("node/n000").admitted  # already out: re-admitting costs nothing
    guard.release("node/n001")
    assert guard.admit("node/n004").admitted
    assert not guard.admit("node/unknown").admitted


def test_dry_run_flood_shows_the_same_refusals(tmp_path: Path) -> None:
    topology = cluster(nodes=30, per_switch=10)
    url = f"sqlite:///{tmp_path}/remedy.db"
    lifecycle = LifecycleStore(url)
    guard = BlastRadiusGuard(topology, lifecycle, max_share=0.1, max_share_per_switch=0.5)
    remediator = Remediator([SlurmActuator()], AuditLog(url), lifecycle=lifecycle, guard=guard)
    results = [
        remediator.execute(Action(ts=0, kind=ActionKind.CORDON, target=node.id, reason="flood"))
        for node in topology.nodes
    ]
    assert Counter(a.status for a in results) == {ActionStatus.PROPOSED: 3, ActionStatus.REFUSED: 27}
    assert lifecycle.states() == {}  # a dry run changes nothing


def test_a_server_s_dry_runs_hold_no_node(tmp_path: Path) -> None:
    """A long-running server or engine with execute_actions off: however many nodes its dry runs proposed to
    take out, the next dry run is judged against what is out now, not refused for what was only proposed."""
    topology = cluster(nodes=30, per_switch=10)
    settings = load_settings(home=tmp_path, execute_actions=False, max_cordon_share=0.1)
    lifecycle = LifecycleStore(settings.database_url())
    remediator = remediator_for("slurm", settings, topology, lifecycle, "vigil-api")
    assert remediator is not None and remediator.dry_run and remediator.guard is not None
    assert remediator.guard.cluster_limit == 3
    results = [
        remediator.execute(Action(ts=0, kind=kind, target=node.id, reason="one at a time"))
        for kind in (ActionKind.CORDON, ActionKind.DRAIN)
        for node in topology.nodes
    ]
    assert Counter(a.status for a in results) == {ActionStatus.PROPOSED: 60}
    assert remediator.guard.out_of_service() == set()
    # The guard still says no to what would be refused now: a node outside the topology.
    stray = remediator.execute(Action(ts=0, kind=ActionKind.CORDON, target="node/elsewhere", reason="stray"))
    assert stray.status is ActionStatus.REFUSED and "blast radius" in stray.result


def test_live_reservations_count_for_dry_runs_and_are_released_as_before(fake_slurm: Path, tmp_path: Path) -> None:
    topology = cluster(nodes=10, per_switch=10)
    topology.nodes.append(Node(name="ghost", switch="leaf0", gpus=[]))  # scontrol refuses it
    url = f"sqlite:///{tmp_path}/remedy.db"
    lifecycle, audit = LifecycleStore(url), AuditLog(url)
    guard = BlastRadiusGuard(topology, lifecycle, max_share=0.2, max_share_per_switch=1.0)  # 2 of 11 nodes
    live = Remediator([SlurmActuator()], audit, lifecycle=lifecycle, guard=guard, dry_run=False)
    dry = Remediator([SlurmActuator()], audit, lifecycle=lifecycle, guard=guard, hold_dry_runs=False)

    def act(remediator: Remediator, kind: ActionKind, node: str) -> Action:
        return remediator.execute(Action(ts=0, kind=kind, target=f"node/{node}", reason="test"))

    assert act(live, ActionKind.CORDON, "ghost").status is ActionStatus.FAILED
    assert guard.out_of_service() == set()  # a failed live action gives its reservation back
    assert act(live, ActionKind.CORDON, "n000").status is ActionStatus.EXECUTED
    for _ in range(2):
        assert [act(dry, ActionKind.CORDON, f"n00{i}").status for i in range(1, 10)] == [ActionStatus.PROPOSED] * 9
    assert guard.out_of_service() == {"node/n000"}
    assert act(live, ActionKind.CORDON, "n001").status is ActionStatus.EXECUTED
    refused = act(dry, ActionKind.CORDON, "n002")  # the two live cordons fill the limit
    assert refused.status is ActionStatus.REFUSED and "2 of 11 nodes already out" in refused.result
    assert act(live, ActionKind.UNCORDON, "n000").status is ActionStatus.EXECUTED
    assert guard.out_of_service() == {"node/n001"}  # the node is back: its reservation is released
    assert act(dry, ActionKind.CORDON, "n002").status is ActionStatus.PROPOSED
    assert act(live, ActionKind.CORDON, "n002").status is ActionStatus.EXECUTED
    assert act(dry, ActionKind.CORDON, "n003").status is ActionStatus.REFUSED


def test_a_reservation_is_released_only_by_the_action_that_holds_it() -> None:
    guard = BlastRadiusGuard(cluster(10, per_switch=10), max_share=0.1, max_share_per_switch=1.0)  # one node out
    assert guard.admit("node/n001", owner="act-cordon").admitted
    assert guard.admit("node/n001", owner="act-drain").admitted  # already out: admitted, held by both
    guard.release("node/n001", owner="act-drain")
    refused = guard.admit("node/n002", owner="act-other")
    assert not refused.admitted and "1 of 10 nodes already out" in refused.reason
    guard.release("node/n001", owner="act-cordon")
    assert guard.admit("node/n002", owner="act-other").admitted
    guard.release("node/n002")  # back in service: every hold on it goes
    assert guard.out_of_service() == set()


class HeldCordon(Actuator):
    """Cordons; ``during`` runs inside the first cordon, while it is in flight."""

    name = "held-cordon"
    kinds = frozenset({ActionKind.CORDON})
    target_kinds = frozenset({"node"})

    def __init__(self, during: Callable[[], None]) -> None:
        self.during: Callable[[], None] | None = during

    def describe(self, action: Action) -> str:
        return f"cordon {action.target}"

    def is_satisfied(self, action: Action) -> bool:
        return False

    def execute(self, action: Action) -> str:
        if self.during is not None:
            during, self.during = self.during, None
            during()
        return f"cordoned {action.target}"


class FailingDrain(HeldCordon):
    name = "failing-drain"
    kinds = frozenset({ActionKind.DRAIN})

    def execute(self, action: Action) -> str:
        raise ActuatorError("HTTP 500")


def test_a_failed_action_leaves_the_node_another_action_holds(tmp_path: Path) -> None:
    """On a 10-node cluster where one node may be out, a cordon of n001 is in flight when a drain of n001 in the same
    process fails. The drain releases only its own hold: the cordon still holds n001, so a cordon of n002 is refused.
    Before, the drain's failure released n001 for both, and the cordon of n002 went out beside n001 (two of ten)."""
    guard = BlastRadiusGuard(cluster(10, per_switch=10), max_share=0.1, max_share_per_switch=1.0)
    meanwhile: list[Action] = []

    def drain_then_cordon_another() -> None:
        meanwhile.append(remediator.execute(Action(ts=0, kind=ActionKind.DRAIN, target="node/n001",
                                                   status=ActionStatus.APPROVED)))
        meanwhile.append(remediator.execute(Action(ts=0, kind=ActionKind.CORDON, target="node/n002",
                                                   status=ActionStatus.APPROVED)))

    remediator = Remediator([HeldCordon(drain_then_cordon_another), FailingDrain(drain_then_cordon_another)],
                            AuditLog(f"sqlite:///{tmp_path}/remedy.db"), guard=guard, dry_run=False)
    cordon = remediator.execute(Action(ts=0, kind=ActionKind.CORDON, target="node/n001",
                                       status=ActionStatus.APPROVED))

    assert cordon.status is ActionStatus.EXECUTED
    drain, other = meanwhile
    assert (drain.status, drain.result) == (ActionStatus.FAILED, "failing-drain: HTTP 500")
    assert other.status is ActionStatus.REFUSED and "1 of 10 nodes already out" in other.result, other
    assert guard.out_of_service() == {"node/n001"}


class BuggyDrain(HeldCordon):
    """A back end with a bug: its drain raises neither ActuatorError nor OSError."""

    name = "buggy-drain"
    kinds = frozenset({ActionKind.DRAIN})

    def execute(self, action: Action) -> str:
        raise KeyError("pods")


def approved(kind: ActionKind, node: str) -> Action:
    return Action(id=f"act-{kind.value}-{node}", ts=0, kind=kind, target=f"node/{node}", status=ActionStatus.APPROVED)


def test_a_back_end_raising_any_error_fails_the_run_and_keeps_its_node(database: str) -> None:
    """On 10 nodes with one allowed out, a drain of n001 whose back end raises a KeyError (a bug, not the back end's
    refusal: it may come after the node went out, a parse error of the answer) ends failed, the run closed and the
    failure recorded; n001 stays held, so a cordon of n002 is refused, until n001 is back in service. Before bc917be
    the KeyError went up through execute and left the run started; after it, n001 was released and the cordon of
    n002 admitted, two nodes out where the drain had run."""
    guard = BlastRadiusGuard(cluster(10, per_switch=10), max_share=0.1, max_share_per_switch=1.0)
    audit = AuditLog(database)
    remediator = Remediator([HeldCordon(lambda: None), BuggyDrain(lambda: None)], audit, guard=guard, dry_run=False)

    drain = remediator.execute(approved(ActionKind.DRAIN, "n001"))
    assert (drain.status, drain.result) == (ActionStatus.FAILED, "buggy-drain: KeyError: 'pods'")
    assert audit.unfinished() == [] and guard.out_of_service() == {"node/n001"}
    assert [(a.id, a.status) for a in audit.actions()] == [("act-drain-n001", ActionStatus.FAILED)]
    cordon = remediator.execute(approved(ActionKind.CORDON, "n002"))
    assert cordon.status is ActionStatus.REFUSED and "1 of 10 nodes already out" in cordon.result, cordon


def test_a_back_end_s_own_error_lets_its_node_go(database: str) -> None:
    """A drain whose back end answers with its own error (ActuatorError: it did not take the node out) releases
    n001, so a cordon of n002 is admitted."""
    guard = BlastRadiusGuard(cluster(10, per_switch=10), max_share=0.1, max_share_per_switch=1.0)
    remediator = Remediator([HeldCordon(lambda: None), FailingDrain(lambda: None)], AuditLog(database), guard=guard,
                            dry_run=False)
    drain = remediator.execute(approved(ActionKind.DRAIN, "n001"))
    assert (drain.status, drain.result) == (ActionStatus.FAILED, "failing-drain: HTTP 500")
    assert guard.out_of_service() == set()
    assert remediator.execute(approved(ActionKind.CORDON, "n002")).status is ActionStatus.EXECUTED


class AuditAway(AuditLog):
    """An audit log whose journal cannot be written: the database went away after the guard's verdict."""

    def begin(self, *args: Any, **kwargs: Any) -> str | None:
        raise OperationalError("INSERT INTO remedy_intents", {}, ConnectionError("server closed the connection"))


def test_a_store_error_after_the_guard_lets_the_node_go(database: str) -> None:
    """The drain of n001 is admitted, then journalling it fails (the database away): execute raises, and n001 is no
    longer held, so the cordon of n002 through a working store is admitted. Before, n001 stayed held."""
    guard = BlastRadiusGuard(cluster(10, per_switch=10), max_share=0.1, max_share_per_switch=1.0)
    away = Remediator([BuggyDrain(lambda: None)], AuditAway(database), guard=guard, dry_run=False)
    with pytest.raises(OperationalError):
        away.execute(approved(ActionKind.DRAIN, "n001"))
    assert guard.out_of_service() == set()
    working = Remediator([HeldCordon(lambda: None)], AuditLog(database), guard=guard, dry_run=False)
    assert working.execute(approved(ActionKind.CORDON, "n002")).status is ActionStatus.EXECUTED


class GoodDrain(HeldCordon):
    name = "good-drain"
    kinds = frozenset({ActionKind.DRAIN})

    def execute(self, action: Action) -> str:
        return f"drained {action.target}"


class CloseAway(AuditLog):
    """The database goes away between the back end's answer and the run's close."""

    def finish(self, *args: Any, **kwargs: Any) -> bool:
        raise OperationalError("UPDATE remedy_intents", {}, ConnectionError("server closed the connection"))


def test_a_drained_node_stays_counted_when_the_close_fails(database: str) -> None:
    """The back end drained n001, then the run's close hit a dropped connection: execute raises, and n001 - out of
    service in the cluster - still counts, so a cordon of n002 on 10 nodes with one allowed out is refused. Before,
    whatever raised after the guard released n001, and the cordon of n002 was admitted: two nodes out."""
    guard = BlastRadiusGuard(cluster(10, per_switch=10), max_share=0.1, max_share_per_switch=1.0)
    remediator = Remediator([GoodDrain(lambda: None), HeldCordon(lambda: None)], CloseAway(database), guard=guard,
                            dry_run=False)
    with pytest.raises(OperationalError):
        remediator.execute(approved(ActionKind.DRAIN, "n001"))
    assert guard.out_of_service() == {"node/n001"}
    working = Remediator([HeldCordon(lambda: None)], AuditLog(database), guard=guard, dry_run=False)
    assert working.execute(approved(ActionKind.CORDON, "n002")).status is ActionStatus.REFUSED


class LifecycleAway(LifecycleStore):
    """The lifecycle store fails its write after the run closed done."""

    def apply(self, *args: Any, **kwargs: Any) -> Any:
        raise OperationalError("UPDATE node_lifecycle", {}, ConnectionError("server closed the connection"))


def test_a_drained_node_stays_counted_when_the_lifecycle_write_fails(database: str) -> None:
    """The drain ran and its run closed done, then the lifecycle's write failed: the run is nobody's to resume, the
    lifecycle does not say n001 is out, and the guard still holds it (released before)."""
    lifecycle = LifecycleAway(database)
    guard = BlastRadiusGuard(cluster(10, per_switch=10), lifecycle, max_share=0.1, max_share_per_switch=1.0)
    audit = AuditLog(database)
    remediator = Remediator([GoodDrain(lambda: None), HeldCordon(lambda: None)], audit, lifecycle=lifecycle,
                            guard=guard, dry_run=False)
    with pytest.raises(OperationalError):
        remediator.execute(approved(ActionKind.DRAIN, "n001"))
    assert audit.unfinished() == []
    assert [a.status for a in audit.actions()] == [ActionStatus.EXECUTED]
    assert guard.out_of_service() == {"node/n001"}
    cordon = remediator.execute(approved(ActionKind.CORDON, "n002"))
    assert cordon.status is ActionStatus.REFUSED and "1 of 10 nodes already out" in cordon.result, cordon


class CloseAwayOnce(AuditLog):
    """The database drops the connection once, at the first close; it is back right after."""

    failed = False

    def finish(self, *args: Any, **kwargs: Any) -> bool:
        if not self.failed:
            self.failed = True
            raise OperationalError("UPDATE remedy_intents", {}, ConnectionError("server closed the connection"))
        return super().finish(*args, **kwargs)


def test_one_server_keeps_the_share_after_a_failed_close(database: str) -> None:
    """One `vigil serve` (its API and engine share one remediator): the drain of n001 ran, its close hit a dropped
    connection. The run stays started under this process's own claim, which its recover() never takes, and the
    lifecycle never heard of the drain - only the guard's hold counts n001, and it stays: a cordon of n002 is refused
    on a cluster allowing one node out (admitted before, two nodes out)."""
    lifecycle = LifecycleStore(database)
    guard = BlastRadiusGuard(cluster(10, per_switch=10), lifecycle, max_share=0.1, max_share_per_switch=1.0)
    audit = CloseAwayOnce(database)
    server = Remediator([GoodDrain(lambda: None), HeldCordon(lambda: None)], audit, lifecycle=lifecycle,
                        guard=guard, dry_run=False, clock=lambda: 10_000.0)
    with pytest.raises(OperationalError):
        server.execute(approved(ActionKind.DRAIN, "n001"))
    assert server.recover() == []
    assert [run.key for run in audit.unfinished_runs()] == ["act-drain-n001"]
    cordon = server.execute(approved(ActionKind.CORDON, "n002"))
    assert cordon.status is ActionStatus.REFUSED and "1 of 10 nodes already out" in cordon.result, cordon


def resumed_drain(audit: AuditLog, node: str) -> None:
    """A drain of ``node`` another process left started, its lease lapsed at 30 s: the next recover() takes it over."""
    action = approved(ActionKind.DRAIN, node)
    action.params["idempotency_key"] = action.id
    assert audit.begin(action.id, action, owner="vigil-engine-killed", now=0.0, lease_expires=30.0) is None


def test_a_resumed_drain_keeps_its_node_counted_when_the_close_fails(database: str) -> None:
    """This process takes over a drain of n001 another left started: the back end drains n001, then the run's close
    hits a dropped connection (back right after). The resumed run is closed failed, and n001 - out in the cluster -
    still counts, so a cordon of n002 on 10 nodes with one allowed out is refused. Before, the takeover's error path
    released n001 and the cordon was admitted: two nodes out."""
    guard = BlastRadiusGuard(cluster(10, per_switch=10), max_share=0.1, max_share_per_switch=1.0)
    audit = CloseAwayOnce(database)
    resumed_drain(audit, "n001")
    remediator = Remediator([GoodDrain(lambda: None), HeldCordon(lambda: None)], audit, guard=guard, dry_run=False,
                            clock=lambda: 10_000.0)
    (drain,) = remediator.recover()
    assert drain.status is ActionStatus.FAILED and drain.result.startswith("resuming failed: OperationalError"), drain
    assert audit.unfinished_runs() == []
    assert guard.out_of_service() == {"node/n001"}
    cordon = remediator.execute(approved(ActionKind.CORDON, "n002"))
    assert cordon.status is ActionStatus.REFUSED and "1 of 10 nodes already out" in cordon.result, cordon


def test_a_resumed_drain_whose_back_end_refuses_lets_its_node_go(database: str) -> None:
    """The taken-over drain of n001 meets the back end's own error (ActuatorError: it did not take n001 out): the run
    ends failed and n001 is released, so a cordon of n002 is admitted."""
    guard = BlastRadiusGuard(cluster(10, per_switch=10), max_share=0.1, max_share_per_switch=1.0)
    audit = AuditLog(database)
    resumed_drain(audit, "n001")
    remediator = Remediator([FailingDrain(lambda: None), HeldCordon(lambda: None)], audit, guard=guard,
                            dry_run=False, clock=lambda: 10_000.0)
    (drain,) = remediator.recover()
    assert (drain.status, drain.result) == (ActionStatus.FAILED, "failing-drain: HTTP 500")
    assert audit.unfinished_runs() == [] and guard.out_of_service() == set()
    assert remediator.execute(approved(ActionKind.CORDON, "n002")).status is ActionStatus.EXECUTED
