"""What the tests of claimed runs share: the database on SQLite and on PostgreSQL, drains that killed processes left
journalled as started, an actuator that counts the drains it runs, and a clock the test moves by hand."""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.serve.conftest import fresh_database
from vigil.model import Action, ActionKind
from vigil.remedy.actuators.base import Actuator
from vigil.remedy.audit import AuditLog
from vigil.store.schema import remedy_intents


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'vigil.db'}"
    # a database per test: the audit log keeps one engine (and its connections) per URL for the process
    name = re.sub(r"\W+", "_", request.node.name).lower()
    digest = hashlib.sha1(name.encode()).hexdigest()[:8]  # two long names cut to one prefix stay apart
    return fresh_database(request.getfixturevalue("postgres_url"), f"claims_{name[:40]}_{digest}")


def crashed_drain(audit: AuditLog, *, at: float = 0.0, lease_s: float = 30.0) -> Action:
    """A drain a process killed at ``at`` left journalled as started, its claim good until ``at + lease_s``."""
    action = Action(id="act-drain-n1", ts=0.0, kind=ActionKind.DRAIN, target="node/n1", reason="Xid 79",
                    params={"idempotency_key": "act-drain-n1"})
    assert audit.begin("act-drain-n1", action, owner="vigil-api-killed", now=at, lease_expires=at + lease_s) is None
    return action


def crashed_drains(database: str, *nodes: str) -> None:
    """Drains of ``nodes`` killed servers left started, their leases lapsed long ago: journalled in one transaction,
    so that one round of resumes reads them all."""
    rows = []
    for node in nodes:
        action = Action(id=f"act-drain-{node}", ts=0.0, kind=ActionKind.DRAIN, target=f"node/{node}",
                        reason="Xid 79", params={"idempotency_key": f"act-drain-{node}"})
        rows.append({"key": action.id, "action_id": action.id, "state": "started", "started": 1_000.0,
                     "action": action.model_dump(mode="json"), "owner": "vigil-api-killed", "lease_expires": 1_030.0})
    with AuditLog(database).engine.begin() as conn:
        conn.execute(remedy_intents.insert(), rows)


class CountingActuator(Actuator):
    """Records each drain it runs; ``during`` runs inside the first one, while the action is in flight."""

    name = "counting"
    kinds = frozenset({ActionKind.DRAIN})
    target_kinds = frozenset({"node"})

    def __init__(self, runs: list[str], during: Callable[[], None] | None = None) -> None:
        self.runs = runs
        self.during = during

    def describe(self, action: Action) -> str:
        return f"drain {action.target}"

    def is_satisfied(self, action: Action) -> bool:
        return False

    def execute(self, action: Action) -> str:
        self.runs.append(f"{self.name}:{action.id}")
        if self.during is not None:
            during, self.during = self.during, None
            during()
        return f"drained {action.target}"


class FakeClock:
    """A clock the test moves by hand. ``wait`` is the remediator's wait (the lease renewal's): it returns when the
    test has moved the clock past its deadline; ``advance`` returns only once every waiter it woke has done its
    step and waits again, so the test goes on knowing the renewal happened."""

    def __init__(self, now: float) -> None:
        self.now = now
        self._deadlines: dict[int, float] = {}
        self._changed = threading.Condition()

    def __call__(self) -> float:
        return self.now

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        me = threading.get_ident()
        with self._changed:
            self._deadlines[me] = self.now + seconds
            self._changed.notify_all()
            while not stop.is_set() and self.now < self._deadlines[me]:
                # the timeout only bounds how late a stopped renewal notices: stop.set() does not notify
                self._changed.wait(timeout=0.05)
            if stop.is_set():
                del self._deadlines[me]
                self._changed.notify_all()
            return stop.is_set()

    def advance(self, seconds: float, *, waiters: int = 1) -> None:
        with self._changed:
            self._changed.wait_for(lambda: len(self._deadlines) >= waiters, timeout=30)
            self.now += seconds
            self._changed.notify_all()
            assert self._changed.wait_for(lambda: all(d > self.now for d in self._deadlines.values()), timeout=30)
