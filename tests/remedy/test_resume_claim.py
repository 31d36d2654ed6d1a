"""Two remediators on one database - `vigil serve --no-engine` and a separate `vigil engine`, both starting after
a crash - find the same action journalled as started: resuming it is a claim on its journal row, so one of them
runs it again and the other leaves it. On SQLite and on PostgreSQL."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.serve.conftest import fresh_database
from tests.serve.conftest import postgres_url as postgres_url
from vigil.model import Action, ActionKind, ActionStatus
from vigil.remedy.actuators.base import Actuator
from vigil.remedy.audit import AuditLog
from vigil.remedy.remediator import Remediator


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


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'vigil.db'}"
    # a database per test: the audit log keeps one engine (and its connections) per URL for the process
    name = "claims_" + re.sub(r"\W+", "_", request.node.name).lower()
    return fresh_database(request.getfixturevalue("postgres_url"), name[:60])


def crashed_drain(audit: AuditLog) -> Action:
    """A drain a killed process left journalled as started."""
    action = Action(id="act-drain-n1", ts=0.0, kind=ActionKind.DRAIN, target="node/n1", reason="Xid 79",
                    params={"idempotency_key": "act-drain-n1"})
    assert audit.begin("act-drain-n1", action, owner="vigil-api-killed") is None
    return action


def test_two_processes_recovering_at_once_resume_an_action_once(database: str) -> None:
    audit = AuditLog(database)
    crashed_drain(audit)
    runs: list[str] = []
    # the engine process started as the server did, and read the journal the same way: the drain started by the
    # killed process
    engine_audit = AuditLog(database)
    read_at_start = engine_audit.unfinished_runs()
    engine_audit.unfinished_runs = lambda: read_at_start  # type: ignore[method-assign]
    engine = Remediator([CountingActuator(runs)], engine_audit, dry_run=False, requested_by="vigil-engine")
    engine_resumed: list[Action] = []

    # the server claims the drain first; while it is resuming it, the engine gets to its own recovery
    server_actuator = CountingActuator(runs, during=lambda: engine_resumed.extend(engine.recover()))
    server_actuator.name = "server"
    server = Remediator([server_actuator], AuditLog(database), dry_run=False, requested_by="vigil-api")
    (resumed,) = server.recover()
    assert resumed.status is ActionStatus.EXECUTED and resumed.result.startswith("resumed after an interrupted run")
    assert engine_resumed == [] and runs == ["server:act-drain-n1"]  # the engine's claim lost: it left the drain
    assert audit.unfinished() == []
    assert [(a.id, a.status) for a in audit.actions()] == [("act-drain-n1", ActionStatus.EXECUTED)]

    # and a process that reads the journal after the server finished finds nothing to resume
    late = Remediator([CountingActuator(runs)], AuditLog(database), dry_run=False, requested_by="vigil-engine")
    assert late.recover() == [] and runs == ["server:act-drain-n1"]


def test_a_claim_is_a_compare_and_set_on_the_owner(database: str) -> None:
    audit = AuditLog(database)
    crashed_drain(audit)
    ((key, owner, action),) = audit.unfinished_runs()
    assert (key, owner, action.id) == ("act-drain-n1", "vigil-api-killed", "act-drain-n1")
    assert audit.claim(key, "vigil-engine-a", owner) is True
    # the other process read the same owner; by the time it asks, the row is no longer that owner's
    assert audit.claim(key, "vigil-api-b", owner) is False
    assert [o for _, o, _ in audit.unfinished_runs()] == ["vigil-engine-a"]
    audit.finish(key, "done")
    assert audit.claim(key, "vigil-api-b", "vigil-engine-a") is False  # finished: nothing to resume


def test_a_process_does_not_resume_its_own_run(database: str) -> None:
    """Of two started actions, the one a crash left is resumed; the one journalled as this remediator's own
    (running now) is left to it."""
    audit = AuditLog(database)
    crashed_drain(audit)
    second = Action(id="act-drain-n2", ts=1.0, kind=ActionKind.DRAIN, target="node/n2",
                    params={"idempotency_key": "act-drain-n2"})
    runs: list[str] = []
    engine = Remediator([CountingActuator(runs)], AuditLog(database), dry_run=False, requested_by="vigil-engine")
    audit.begin("act-drain-n2", second, owner=engine.owner)  # the engine is running this one now
    assert [a.id for a in engine.recover()] == ["act-drain-n1"]
    assert runs == ["counting:act-drain-n1"]
    assert [(k, o) for k, o, _ in audit.unfinished_runs()] == [("act-drain-n2", engine.owner)]


def test_an_older_database_gets_the_owner_column(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE remedy_intents (key VARCHAR(120) PRIMARY KEY, action_id VARCHAR(40) NOT NULL, "
                     "state VARCHAR(20) NOT NULL, started FLOAT NOT NULL, finished FLOAT, action JSON NOT NULL)")
        conn.execute("INSERT INTO remedy_intents VALUES ('act-old', 'act-old', 'started', 0.0, NULL, ?)",
                     (Action(id="act-old", ts=0.0, kind=ActionKind.DRAIN, target="node/n1").model_dump_json(),))
    audit = AuditLog(f"sqlite:///{path}")
    assert [(k, o) for k, o, _ in audit.unfinished_runs()] == [("act-old", None)]
    runs: list[str] = []
    (resumed,) = Remediator([CountingActuator(runs)], audit, dry_run=False).recover()
    assert resumed.status is ActionStatus.EXECUTED and runs == ["counting:act-old"]


def test_two_processes_adding_the_owner_column_at_once_both_open_the_store(
    database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`vigil serve --no-engine` and `vigil engine` started together on a database made before the owner column:
    both see it missing, one adds it first; the other's ALTER TABLE then fails, and it opens the store anyway."""
    import vigil.remedy.audit as audit_module

    AuditLog(database)  # the other process: it has added the column
    monkeypatch.setattr(audit_module, "_engines", {})  # this process opens the database afresh
    real_inspect = audit_module.inspect
    looks: list[str] = []

    class BeforeTheOther:
        """This process's first look, taken before the other process added the column."""

        def __init__(self, engine: object) -> None:
            self.real = real_inspect(engine)

        def get_columns(self, table: str) -> list[dict[str, object]]:
            looks.append(table)
            columns = self.real.get_columns(table)
            return columns if len(looks) > 1 else [c for c in columns if c["name"] != "owner"]

    monkeypatch.setattr(audit_module, "inspect", BeforeTheOther)
    audit = AuditLog(database)
    assert looks and audit.unfinished_runs() == []
    crashed_drain(audit)
    assert [(k, o) for k, o, _ in audit.unfinished_runs()] == [("act-drain-n1", "vigil-api-killed")]
