"""Two remediators on one database - `vigil serve --no-engine` and a separate `vigil engine`, both starting after
a crash - find the same action journalled as started: resuming it is a claim on its journal row, so one of them
runs it again and the other leaves it. On SQLite and on PostgreSQL."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.remedy.claims import CountingActuator, FakeClock, crashed_drain
from tests.remedy.claims import database as database
from tests.serve.conftest import postgres_url as postgres_url
from vigil.model import Action, ActionKind, ActionStatus
from vigil.remedy.actuators.base import Actuator, ActuatorError
from vigil.remedy.audit import AuditLog
from vigil.remedy.remediator import Remediator


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


def test_a_dry_run_remediator_takes_no_run_over(database: str) -> None:
    """A server with execution off (a dry-run remediator) beside an engine that executes, after a crash: the server's
    recovery leaves the dead owner's drain alone, and the engine resumes it at once. Before, the server claimed the
    run, only recorded what it would do, and left the run started under its own claim, which the engine could take
    only after another lease."""
    audit = AuditLog(database)
    crashed_drain(audit, at=1_000.0, lease_s=30.0)
    runs: list[str] = []
    server = Remediator([CountingActuator(runs)], AuditLog(database), dry_run=True, requested_by="vigil-api",
                        clock=lambda: 1_031.0)
    assert server.recover() == [] and runs == []
    assert [run.owner for run in audit.unfinished_runs()] == ["vigil-api-killed"] and audit.actions() == []
    engine = Remediator([CountingActuator(runs)], AuditLog(database), dry_run=False, requested_by="vigil-engine",
                        clock=lambda: 1_031.0)
    (resumed,) = engine.recover()
    assert resumed.status is ActionStatus.EXECUTED and runs == ["counting:act-drain-n1"]
    assert audit.unfinished() == []


def test_a_claim_is_a_compare_and_set_on_the_owner(database: str) -> None:
    audit = AuditLog(database)
    crashed_drain(audit)
    ((key, owner, lease_expires, action),) = audit.unfinished_runs()
    assert (key, owner, lease_expires, action.id) == ("act-drain-n1", "vigil-api-killed", 30.0, "act-drain-n1")
    assert audit.claim(key, "vigil-engine-a", owner, now=31.0, lease_expires=61.0) is True
    # the other process read the same owner; by the time it asks, the row is no longer that owner's
    assert audit.claim(key, "vigil-api-b", owner, now=31.0, lease_expires=61.0) is False
    assert [run.owner for run in audit.unfinished_runs()] == ["vigil-engine-a"]
    audit.finish(key, "done")
    assert audit.claim(key, "vigil-api-b", "vigil-engine-a", now=99.0, lease_expires=129.0) is False  # finished


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
    assert [(run.key, run.owner) for run in audit.unfinished_runs()] == [("act-drain-n2", engine.owner)]


def test_an_older_database_gets_the_owner_column(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE remedy_intents (key VARCHAR(120) PRIMARY KEY, action_id VARCHAR(40) NOT NULL, "
                     "state VARCHAR(20) NOT NULL, started FLOAT NOT NULL, finished FLOAT, action JSON NOT NULL)")
        conn.execute("INSERT INTO remedy_intents VALUES ('act-old', 'act-old', 'started', 0.0, NULL, ?)",
                     (Action(id="act-old", ts=0.0, kind=ActionKind.DRAIN, target="node/n1").model_dump_json(),))
    audit = AuditLog(f"sqlite:///{path}")
    assert [(run.key, run.owner, run.lease_expires) for run in audit.unfinished_runs()] == [("act-old", None, None)]
    runs: list[str] = []
    (resumed,) = Remediator([CountingActuator(runs)], audit, dry_run=False).recover()
    assert resumed.status is ActionStatus.EXECUTED and runs == ["counting:act-old"]


def schema_before_the_revisions_held_the_audit_log(url: str, added: tuple[str, ...]) -> None:
    """A database as Vigil left it before the remedy tables were the store's: the store's tables at revision 0005,
    and the audit log's as it made them itself, the journal with the ``added`` columns its own ALTER TABLE had
    added (none: an audit log older than the owner column) - holding an executed cordon and a drain a crash left
    started."""
    from importlib import resources

    import sqlalchemy as sa
    from alembic import command
    from alembic.config import Config

    from vigil.store import schema

    engine = sa.create_engine(url)
    cfg = Config()
    cfg.set_main_option("script_location", str(resources.files("vigil.store") / "migrations"))
    with engine.connect() as conn:
        if conn.dialect.name == "sqlite":
            conn.exec_driver_sql("PRAGMA journal_mode=WAL")  # as the store and the audit log left every file
        conn.commit()
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0005")
        conn.commit()
    made_by_the_audit_log = sa.MetaData()
    for table in (schema.remedy_actions, schema.remedy_node_states, schema.remedy_node_transitions):
        table.to_metadata(made_by_the_audit_log)
    made_by_the_audit_log.create_all(engine)
    types = {"owner": "VARCHAR(120)", "lease_expires": "FLOAT"}
    columns = "".join(f", {name} {types[name]}" for name in added)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE remedy_intents (key VARCHAR(120) NOT NULL, action_id VARCHAR(40) NOT NULL, "
                             "state VARCHAR(20) NOT NULL, started FLOAT NOT NULL, finished FLOAT, action JSON NOT "
                             f"NULL{columns}, PRIMARY KEY (key))"))
    drain = Action(id="act-old", ts=0.0, kind=ActionKind.DRAIN, target="node/n1", reason="Xid 79",
                   status=ActionStatus.APPROVED)
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO remedy_intents (key, action_id, state, started, action) "
                             "VALUES ('act-old', 'act-old', 'started', 0.0, :action)"),
                     {"action": drain.model_dump_json()})
        conn.execute(sa.text("INSERT INTO remedy_actions (id, ts, kind, target, reason, requested_by, dry_run, "
                             "status, result, params) VALUES ('act-cordon', 0.0, 'cordon', 'node/n1', 'Xid 79', "
                             "'vigil-engine', false, 'executed', 'cordoned node/n1', '{}')"))
    engine.dispose()


def assert_the_schema_is_the_stores(url: str) -> None:
    """Every table as the store's schema declares it (the revisions made or changed it), at the last revision."""
    import sqlalchemy as sa
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from tests.store.revisions import head_revision
    from vigil.store.schema import metadata

    engine = sa.create_engine(url)
    with engine.connect() as conn:
        context = MigrationContext.configure(conn)
        assert context.get_current_revision() == head_revision()
        assert compare_metadata(context, metadata) == []
    engine.dispose()


@pytest.mark.parametrize("added", [(), ("owner",), ("owner", "lease_expires")], ids=["none", "owner", "lease"])
def test_an_old_audit_log_upgrades(database: str, added: tuple[str, ...]) -> None:
    schema_before_the_revisions_held_the_audit_log(database, added)
    audit = AuditLog(database)
    assert_the_schema_is_the_stores(database)
    assert [a.id for a in audit.actions()] == ["act-cordon"]
    assert [(run.key, run.owner, run.lease_expires) for run in audit.unfinished_runs()] == [("act-old", None, None)]
    runs: list[str] = []
    (resumed,) = Remediator([CountingActuator(runs)], audit, dry_run=False).recover()
    assert resumed.status is ActionStatus.EXECUTED and runs == ["counting:act-old"]


def test_a_new_audit_log_is_made_by_the_revisions(database: str) -> None:
    audit = AuditLog(database)
    assert_the_schema_is_the_stores(database)
    crashed_drain(audit)
    assert [(run.key, run.owner) for run in audit.unfinished_runs()] == [("act-drain-n1", "vigil-api-killed")]


def test_two_processes_upgrading_at_once_both_open_it(database: str) -> None:
    """`vigil serve --no-engine` and `vigil engine` started together on a database made before the remedy tables
    were the store's: while the other process is in the middle of its upgrade (its changes made, not committed),
    this one waits for it and then opens the database at the last revision, rather than reading the revision the
    other is changing and making the same tables again."""
    import threading
    from importlib import resources

    import sqlalchemy as sa
    from alembic import command
    from alembic.config import Config

    from tests.conftest import wait_for
    from vigil.store.sql import MIGRATION_LOCK

    schema_before_the_revisions_held_the_audit_log(database, added=())
    other = sa.create_engine(database)
    cfg = Config()
    cfg.set_main_option("script_location", str(resources.files("vigil.store") / "migrations"))
    opened: list[object] = []
    with other.connect() as conn:
        transaction = conn.begin()
        if conn.dialect.name == "postgresql":
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:lock)"), {"lock": MIGRATION_LOCK})
        else:
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        cfg.attributes["connection"] = conn
        # the other process's upgrade, not committed yet: up to the revision that makes the audit log's tables (a
        # later revision that builds an index CONCURRENTLY commits on its own)
        command.upgrade(cfg, "0006")
        this_process = threading.Thread(target=lambda: opened.append(_open_or_fail(database)), name="this-process")
        asked: list[str] = []

        def ask(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
            if threading.current_thread() is this_process:
                asked.append(statement)

        sa.event.listen(sa.Engine, "before_cursor_execute", ask)
        try:
            this_process.start()
            wait_for(lambda: _waiting(database, asked) or not this_process.is_alive(), 20,
                     "this process to wait for the other's upgrade")
            assert this_process.is_alive(), opened
            transaction.commit()
            this_process.join(timeout=30)
        finally:
            sa.event.remove(sa.Engine, "before_cursor_execute", ask)
    other.dispose()
    assert len(opened) == 1 and isinstance(opened[0], AuditLog), opened
    assert_the_schema_is_the_stores(database)
    assert [(run.key, run.owner) for run in opened[0].unfinished_runs()] == [("act-old", None)]


def _open_or_fail(url: str) -> AuditLog | Exception:
    try:
        return AuditLog(url)
    except Exception as err:  # the test names what went wrong
        return err


def _waiting(url: str, asked: list[str]) -> bool:
    """Whether this process is waiting for the other's upgrade (``asked``: its statements so far): on PostgreSQL,
    it asked for the migration lock again, so the first try was refused (it asks outside any transaction, which
    leaves no record of a waiter in pg_locks); SQLite keeps no record of who waits for its write lock, so there,
    whether this process has asked the database for anything."""
    if not url.startswith("postgresql"):
        return bool(asked)
    return sum("pg_try_advisory_lock" in statement for statement in asked) >= 2


def test_a_dead_owner_s_claim_is_taken_over_after_its_lease_and_not_before(database: str) -> None:
    audit = AuditLog(database)
    crashed_drain(audit, at=1_000.0, lease_s=30.0)  # its owner was killed at 1000: no one renews the lease
    clock = FakeClock(1_029.0)
    runs: list[str] = []
    engine = Remediator([CountingActuator(runs)], AuditLog(database), dry_run=False, requested_by="vigil-engine",
                        clock=clock, wait=clock.wait, lease_s=30.0)
    assert engine.recover() == [] and runs == []  # the lease holds until 1030: its owner may be alive
    assert [run.owner for run in audit.unfinished_runs()] == ["vigil-api-killed"]

    clock.now = 1_031.0
    (resumed,) = engine.recover()
    assert resumed.status is ActionStatus.EXECUTED and runs == ["counting:act-drain-n1"]
    # the audit log records the takeover: whose claim it took, and when that claim had lapsed
    (record,) = audit.actions()
    assert record.params["taken_over_from"] == "vigil-api-killed" and record.params["lease_expired_at"] == 1_030.0
    assert record.result.startswith("resumed after an interrupted run") and audit.unfinished() == []


@pytest.mark.parametrize("now, winners", [(1_029.0, 0), (1_031.0, 1)], ids=["before-expiry", "after-expiry"])
def test_contenders_racing_for_an_expired_claim_one_wins(database: str, now: float, winners: int) -> None:
    """Eight processes' claims on the same dead owner's run, released together: one UPDATE each, so exactly one
    wins once the lease has lapsed, and none before."""
    crashed_drain(AuditLog(database), at=1_000.0, lease_s=30.0)
    contenders = 8
    start = threading.Barrier(contenders)

    def contend(index: int) -> bool:
        audit = AuditLog(database)
        start.wait(timeout=30)
        return audit.claim("act-drain-n1", f"vigil-engine-{index}", "vigil-api-killed", now=now,
                           lease_expires=now + 30.0)

    with ThreadPoolExecutor(contenders) as pool:
        won = [index for index, claimed in enumerate(pool.map(contend, range(contenders))) if claimed]
    assert len(won) == winners
    owners = [run.owner for run in AuditLog(database).unfinished_runs()]
    assert owners == ([f"vigil-engine-{won[0]}"] if won else ["vigil-api-killed"])


def test_a_renewing_owner_keeps_its_claim(database: str) -> None:
    """A drain that runs for 45 s of a 30 s lease: its owner renews the claim every 10 s, so an engine looking
    for dead owners' runs meanwhile leaves it alone - and without the renewals would have taken it at 1030."""
    clock = FakeClock(1_000.0)
    runs: list[str] = []
    contender = Remediator([CountingActuator(runs)], AuditLog(database), dry_run=False, requested_by="vigil-engine",
                           clock=clock, wait=clock.wait, lease_s=30.0)
    taken: list[Action] = []

    def long_drain() -> None:
        clock.advance(25.0)  # the owner's renewal at 1025 holds the claim until 1055
        taken.extend(contender.recover())
        clock.advance(20.0)  # 1045: past the first lease, within the renewed one (renewed again: 1075)
        taken.extend(contender.recover())
        leases.append(AuditLog(database).unfinished_runs()[0].lease_expires)

    leases: list[float | None] = []
    owner_actuator = CountingActuator(runs, during=long_drain)
    owner_actuator.name = "owner"
    owner = Remediator([owner_actuator], AuditLog(database), dry_run=False, requested_by="vigil-api", clock=clock,
                       wait=clock.wait, lease_s=30.0)
    done = owner.execute(Action(id="act-drain-n1", ts=0.0, kind=ActionKind.DRAIN, target="node/n1",
                                status=ActionStatus.APPROVED))
    assert done.status is ActionStatus.EXECUTED and taken == [] and runs == ["owner:act-drain-n1"]
    assert leases == [1_075.0]
    assert AuditLog(database).unfinished() == []


def test_an_action_another_live_owner_is_running_is_not_run_twice(database: str) -> None:
    """The same approved drain executed on a second server (a retry under the same idempotency key) while the first
    still holds its lease is skipped; once that lease has lapsed, the second server runs it."""
    audit = AuditLog(database)
    crashed_drain(audit, at=1_000.0, lease_s=30.0)
    clock = FakeClock(1_010.0)
    runs: list[str] = []
    second = Remediator([CountingActuator(runs)], AuditLog(database), dry_run=False, clock=clock, wait=clock.wait)
    retry = Action(id="act-drain-n1-retry", ts=0.0, kind=ActionKind.DRAIN, target="node/n1",
                   status=ActionStatus.APPROVED, params={"idempotency_key": "act-drain-n1"})
    skipped = second.execute(retry)
    assert skipped.status is ActionStatus.SKIPPED
    assert skipped.result == "running in another process (idempotency key act-drain-n1)"
    assert runs == [] and [run.owner for run in audit.unfinished_runs()] == ["vigil-api-killed"]
    clock.now = 1_031.0
    again = second.execute(retry.model_copy(update={"id": "act-drain-n1-again"}))
    assert again.status is ActionStatus.EXECUTED and runs == ["counting:act-drain-n1-again"]


class FailingDrain(CountingActuator):
    """A drain whose back end says no, after ``during``."""

    def execute(self, action: Action) -> str:
        super().execute(action)
        raise ActuatorError("eviction refused")


def frozen(stop: threading.Event, seconds: float) -> bool:
    """The wait of an owner frozen with its renewal thread (a paused VM): no renewal before the run ends."""
    return stop.wait()


@pytest.mark.parametrize("outcome", [ActionStatus.EXECUTED, ActionStatus.FAILED])
def test_a_stalled_owner_s_late_answer_is_recorded_beside_the_resumed_run(database: str,
                                                                          outcome: ActionStatus) -> None:
    """The owner stalls in the back-end call past its lease (claimed at 1000, until 1030); at 1031 an engine
    takes the run over and completes it; then the stalled call returns. Its answer is recorded as a late
    completion under an id of its own - before, the second record of the action's id failed with an error - and
    the journal and the action's record stay the resumed run's."""
    clock = FakeClock(1_000.0)
    runs: list[str] = []
    engine = Remediator([CountingActuator(runs)], AuditLog(database), dry_run=False, requested_by="vigil-engine",
                        clock=clock, wait=frozen, lease_s=30.0)
    resumed: list[Action] = []

    def stall() -> None:
        clock.now = 1_031.0
        resumed.extend(engine.recover())

    stalled_drain = (CountingActuator if outcome is ActionStatus.EXECUTED else FailingDrain)(runs, during=stall)
    stalled_drain.name = "stalled"
    owner = Remediator([stalled_drain], AuditLog(database), dry_run=False, requested_by="vigil-api", clock=clock,
                       wait=frozen, lease_s=30.0)
    drain = Action(id="act-drain-n1", ts=1_000.0, kind=ActionKind.DRAIN, target="node/n1", reason="Xid 79")
    late = owner.execute(drain)

    assert runs == ["stalled:act-drain-n1", "counting:act-drain-n1"]
    (taken,) = resumed
    assert taken.id == "act-drain-n1" and taken.status is ActionStatus.EXECUTED
    assert taken.params["taken_over_from"] == owner.owner and taken.params["lease_expired_at"] == 1_030.0
    assert late.id != "act-drain-n1" and late.status is outcome
    assert late.params["late_completion_of"] == "act-drain-n1" and late.params["claim_lost_to"] == engine.owner
    assert late.result.startswith(f"late completion, after this run's claim lapsed and {engine.owner} resumed it")
    audit = AuditLog(database)
    records = {a.id: a for a in audit.actions()}
    assert set(records) == {"act-drain-n1", late.id}
    assert records["act-drain-n1"].result.startswith("resumed after an interrupted run")  # not overwritten
    assert records[late.id].status is outcome
    # the journal is the resumed run's: done, so the action is not run a third time (a late failure would have
    # marked it failed, open to a retry)
    assert audit.unfinished() == [] and audit.owner_of("act-drain-n1") == engine.owner
    retry = drain.model_copy(update={"id": "act-drain-n1-retry", "params": {"idempotency_key": "act-drain-n1"}})
    again = Remediator([CountingActuator(runs)], audit, dry_run=False, clock=clock).execute(retry)
    assert again.status is ActionStatus.SKIPPED and "already executed" in again.result
    assert len(runs) == 2


@pytest.mark.parametrize("outcome", [ActionStatus.EXECUTED, ActionStatus.FAILED])
def test_a_stalled_owner_s_late_answer_releases_the_nodes_it_held(database: str, outcome: ActionStatus) -> None:
    """Of 10 nodes one may be out (max_cordon_share 0.1). The owner's guard holds node/n1 for its drain, which
    stalls past the lease; an engine (another process, its own guard) takes the drain over and completes it; then
    the stalled call returns. Once node/n1 is repaired and back, the owner's server drains node/n2. Before, the late
    answer left node/n1 held in the owner's guard for good, and every later capacity action there was refused."""
    from vigil.model import Node, Topology
    from vigil.remedy.guard import BlastRadiusGuard
    from vigil.remedy.lifecycle import LifecycleStore, NodeState, Trigger

    topology = Topology(nodes=[Node(name=f"n{i}", switch=f"s{i % 2}") for i in range(10)])

    def remediator(actuator: Actuator, requested_by: str) -> Remediator:
        lifecycle = LifecycleStore(database)
        return Remediator([actuator], AuditLog(database), lifecycle=lifecycle, dry_run=False,
                          guard=BlastRadiusGuard(topology, lifecycle, max_share=0.1, max_share_per_switch=1.0),
                          requested_by=requested_by, clock=clock, wait=frozen, lease_s=30.0)

    clock = FakeClock(1_000.0)
    runs: list[str] = []
    engine = remediator(CountingActuator(runs), "vigil-engine")
    resumed: list[Action] = []

    def stall() -> None:
        clock.now = 1_031.0
        resumed.extend(engine.recover())

    stalled_drain = (CountingActuator if outcome is ActionStatus.EXECUTED else FailingDrain)(runs, during=stall)
    owner = remediator(stalled_drain, "vigil-api")
    late = owner.execute(Action(id="act-drain-n1", ts=1_000.0, kind=ActionKind.DRAIN, target="node/n1"))
    assert late.params["late_completion_of"] == "act-drain-n1" and late.status is outcome
    assert [a.status for a in resumed] == [ActionStatus.EXECUTED]

    lifecycle = LifecycleStore(database)
    assert lifecycle.status("node/n1").state is NodeState.DRAINING  # the resumed drain's, in every process
    for trigger in (Trigger.DRAINED, Trigger.REPAIRED, Trigger.SELF_CHECK_PASS):
        lifecycle.apply("node/n1", trigger, "repaired")
    assert owner.guard is not None and owner.guard.out_of_service() == set()
    next_drain = owner.execute(Action(id="act-drain-n2", ts=1_100.0, kind=ActionKind.DRAIN, target="node/n2"))
    assert (next_drain.status, next_drain.result) == (outcome, "counting: eviction refused"
                                                      if outcome is ActionStatus.FAILED else "drained node/n2")


def test_servers_executing_the_same_new_action_at_once_run_it_once(database: str) -> None:
    """Four servers execute the same new action at once: each looks for its journal row, finds none, and only
    then inserts (a barrier holds every look until all have looked). One insert wins and the others see the
    run as another process's - before, on PostgreSQL and SQLite alike, they failed on the primary key."""
    from sqlalchemy import event

    contenders = 4
    looked = threading.Barrier(contenders)
    first_look = threading.local()
    audit = AuditLog(database)

    def hold_after_the_first_look(conn: object, cursor: object, statement: str, *args: object) -> None:
        if statement.startswith("SELECT remedy_intents.state") and not getattr(first_look, "done", False):
            first_look.done = True
            looked.wait(timeout=30)

    event.listen(audit.engine, "after_cursor_execute", hold_after_the_first_look)
    drain = Action(id="act-drain-n1", ts=1_000.0, kind=ActionKind.DRAIN, target="node/n1", reason="Xid 79")
    try:
        with ThreadPoolExecutor(contenders) as pool:
            previous = list(pool.map(lambda i: audit.begin("act-drain-n1", drain, owner=f"vigil-api-{i}",
                                                           now=1_000.0, lease_expires=1_030.0),
                                     range(contenders)))
    finally:
        event.remove(audit.engine, "after_cursor_execute", hold_after_the_first_look)
    assert sorted(previous, key=str) == [None] + ["running"] * (contenders - 1)
    (run,) = audit.unfinished_runs()
    assert run.owner == f"vigil-api-{previous.index(None)}" and run.lease_expires == 1_030.0
