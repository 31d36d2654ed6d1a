"""Node self-healing lifecycle: detect -> cordon -> drain -> repair -> self-check -> return (or vendor).

    healthy --fault(observe/degraded)--> suspect --clear--> healthy
    healthy/suspect --fault(drain/isolate)--> cordoned --drain--> draining --drained--> repairing
    repairing --repaired--> self_check --pass--> healthy
                                       --fail--> repairing (again) ... after max_repairs -> vendor_repair
    vendor_repair --returned--> self_check

Every transition is checked against the table below and persisted (current state + history) in the
remedy tables, so ``vigil nodes`` and the web UI read the same truth the remediator acts on.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import insert, select, update

from vigil.model import FaultLevel, VigilInputError, parse_entity
from vigil.remedy.audit import engine_for
from vigil.store.schema import remedy_node_states as node_states_table
from vigil.store.schema import remedy_node_transitions as node_transitions_table


class NodeState(enum.StrEnum):
    HEALTHY = "healthy"
    SUSPECT = "suspect"
    CORDONED = "cordoned"
    DRAINING = "draining"
    REPAIRING = "repairing"
    SELF_CHECK = "self_check"
    VENDOR_REPAIR = "vendor_repair"

    @property
    def in_service(self) -> bool:
        """Schedulable: counts as capacity for the blast-radius guard."""
        return self in (NodeState.HEALTHY, NodeState.SUSPECT)


class Trigger(enum.StrEnum):
    SUSPECT = "suspect"
    CLEAR = "clear"
    CORDON = "cordon"
    DRAIN = "drain"
    DRAINED = "drained"
    REPAIR = "repair"
    REPAIRED = "repaired"
    SELF_CHECK_PASS = "self_check_pass"
    SELF_CHECK_FAIL = "self_check_fail"
    VENDOR = "vendor"
    RETURNED = "returned"


S, T = NodeState, Trigger
TRANSITIONS: dict[tuple[NodeState, Trigger], NodeState] = {
    (S.HEALTHY, T.SUSPECT): S.SUSPECT,
    (S.SUSPECT, T.SUSPECT): S.SUSPECT,
    (S.SUSPECT, T.CLEAR): S.HEALTHY,
    (S.HEALTHY, T.CORDON): S.CORDONED,
    (S.SUSPECT, T.CORDON): S.CORDONED,
    (S.CORDONED, T.DRAIN): S.DRAINING,
    (S.DRAINING, T.DRAINED): S.REPAIRING,
    # A cordoned node with nothing running goes straight to repair.
    (S.CORDONED, T.REPAIR): S.REPAIRING,
    (S.REPAIRING, T.REPAIRED): S.SELF_CHECK,
    (S.SELF_CHECK, T.SELF_CHECK_PASS): S.HEALTHY,
    (S.SELF_CHECK, T.SELF_CHECK_FAIL): S.REPAIRING,
    (S.REPAIRING, T.VENDOR): S.VENDOR_REPAIR,
    (S.SELF_CHECK, T.VENDOR): S.VENDOR_REPAIR,
    (S.CORDONED, T.VENDOR): S.VENDOR_REPAIR,
    (S.VENDOR_REPAIR, T.RETURNED): S.SELF_CHECK,
    # An operator may give a node back from any out-of-service state.
    (S.CORDONED, T.CLEAR): S.HEALTHY,
    (S.VENDOR_REPAIR, T.CLEAR): S.HEALTHY,
}


@dataclass(frozen=True)
class NodeStatus:
    node: str
    state: NodeState
    since: float
    reason: str
    repair_attempts: int


@dataclass(frozen=True)
class Transition:
    node: str
    ts: float
    from_state: NodeState
    to_state: NodeState
    trigger: Trigger
    reason: str


def trigger_for_level(level: FaultLevel) -> Trigger | None:
    """The lifecycle step a new fault of ``level`` asks for (None: nothing to record)."""
    if level >= FaultLevel.DRAIN:
        return Trigger.CORDON
    if level >= FaultLevel.OBSERVE:
        return Trigger.SUSPECT
    return None


class LifecycleStore:
    """Persisted node states. ``states()`` is what ``vigil nodes`` shows.

    ``max_repairs``: failed self-checks after which a node goes to the vendor instead of another repair.
    """

    def __init__(self, url: str | None = None, *, max_repairs: int = 2, clock: Callable[[], float] = time.time):
        self.engine = engine_for(url)
        self.max_repairs = max_repairs
        self.clock = clock

    def states(self) -> dict[str, str]:
        """node id -> lifecycle state name, for every node the remediator has ever touched."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(node_states_table.c.node, node_states_table.c.state))
            return {row.node: row.state for row in rows}

    def status(self, node: str) -> NodeStatus:
        with self.engine.connect() as conn:
            row = conn.execute(select(node_states_table).where(node_states_table.c.node == node)).first()
        if row is None:
            return NodeStatus(node, NodeState.HEALTHY, 0.0, "", 0)
        return NodeStatus(row.node, NodeState(row.state), row.since, row.reason, row.repair_attempts)

    def all(self) -> list[NodeStatus]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(node_states_table).order_by(node_states_table.c.node))
            return [NodeStatus(r.node, NodeState(r.state), r.since, r.reason, r.repair_attempts) for r in rows]

    def out_of_service(self) -> set[str]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(node_states_table.c.node, node_states_table.c.state))
            return {row.node for row in rows if not NodeState(row.state).in_service}

    def history(self, node: str) -> list[Transition]:
        query = (
            select(node_transitions_table)
            .where(node_transitions_table.c.node == node)
            .order_by(node_transitions_table.c.seq)
        )
        with self.engine.connect() as conn:
            return [
                Transition(r.node, r.ts, NodeState(r.from_state), NodeState(r.to_state), Trigger(r.trigger), r.reason)
                for r in conn.execute(query)
            ]

    def can(self, node: str, trigger: Trigger) -> bool:
        return (self.status(node).state, trigger) in TRANSITIONS

    def apply(self, node: str, trigger: Trigger, reason: str = "") -> NodeStatus:
        """Move ``node`` along the lifecycle; a trigger not allowed from its state is an input error."""
        if parse_entity(node)[0] != "node":
            raise VigilInputError(f"lifecycle applies to node ids (node/<name>), got {node!r}")
        with self.engine.begin() as conn:
            row = conn.execute(select(node_states_table).where(node_states_table.c.node == node)).first()
            current = NodeState(row.state) if row is not None else NodeState.HEALTHY
            attempts = row.repair_attempts if row is not None else 0
            target = TRANSITIONS.get((current, trigger))
            if target is None:
                raise VigilInputError(f"node {node} is {current.value}: cannot apply {trigger.value!r}")
            if trigger is Trigger.SELF_CHECK_FAIL and attempts >= self.max_repairs:
                target = NodeState.VENDOR_REPAIR
            if trigger is Trigger.REPAIRED:
                attempts += 1
            if target is NodeState.HEALTHY:
                attempts = 0
            now = self.clock()
            values = {"state": target.value, "since": now, "reason": reason, "repair_attempts": attempts}
            if row is None:
                conn.execute(insert(node_states_table).values(node=node, **values))
            else:
                conn.execute(update(node_states_table).where(node_states_table.c.node == node).values(**values))
            conn.execute(
                insert(node_transitions_table).values(
                    node=node,
                    ts=now,
                    from_state=current.value,
                    to_state=target.value,
                    trigger=trigger.value,
                    reason=reason,
                )
            )
        return NodeStatus(node, target, now, reason, attempts)
