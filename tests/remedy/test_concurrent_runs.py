"""Two processes on one database executing the same action at once: the one whose run holds the execution journal
writes the action's record; the other's verdict - the run is in another process, or already executed - is recorded
under an id of its own naming the action (``params.repeat_of``), and a server answers it as a conflict, leaving
the stored action as the run leaves it. On SQLite and on PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import insert, text

from tests.conftest import wait_for
from tests.remedy.claims import CountingActuator
from tests.remedy.claims import database as database
from tests.serve.conftest import TOKEN, fresh_database
from tests.serve.conftest import postgres_url as postgres_url
from vigil.config import Settings
from vigil.faces.api.app import app_for_context
from vigil.faces.api.context import ServeContext
from vigil.model import Action, ActionKind, ActionStatus
from vigil.remedy.audit import AuditLog
from vigil.remedy.lifecycle import LifecycleStore, Trigger
from vigil.remedy.remediator import Remediator
from vigil.store.schema import remedy_actions
from vigil.store.sql import Store

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def approved_drain() -> Action:
    return Action(id="act-drain-n1", ts=1_000.0, kind=ActionKind.DRAIN, target="node/n1", reason="Xid 79",
                  status=ActionStatus.APPROVED)


def test_a_repeat_while_the_action_runs_elsewhere_is_recorded_apart(database: str) -> None:
    """Server B executes the drain server A is running: B's skip is recorded under an id of its own - before, it
    took the action's id, and A's record of the drain then failed on it."""
    runs: list[str] = []
    other = Remediator([CountingActuator(runs)], AuditLog(database), dry_run=False, requested_by="vigil-api-b")
    repeats: list[Action] = []
    owner_actuator = CountingActuator(runs, during=lambda: repeats.append(other.execute(approved_drain())))
    owner_actuator.name = "owner"
    owner = Remediator([owner_actuator], AuditLog(database), dry_run=False, requested_by="vigil-api-a")
    done = owner.execute(approved_drain())

    assert done.id == "act-drain-n1" and done.status is ActionStatus.EXECUTED and runs == ["owner:act-drain-n1"]
    (repeat,) = repeats
    assert repeat.status is ActionStatus.SKIPPED and repeat.id != "act-drain-n1"
    assert repeat.params["repeat_of"] == "act-drain-n1"
    assert repeat.result == "running in another process (idempotency key act-drain-n1)"
    records = {a.id: a for a in AuditLog(database).actions()}
    assert {k: a.status for k, a in records.items()} == {"act-drain-n1": ActionStatus.EXECUTED,
                                                         repeat.id: ActionStatus.SKIPPED}


@contextmanager
def server(url: str, home: Path, remediator: Remediator) -> Iterator[TestClient]:
    settings = Settings(home=home, db_url=url, api_token=TOKEN, execute_actions=True)
    ctx = ServeContext(store=Store(url), settings=settings, remediator=remediator, backend="slurm")
    with closing(ctx.store), TestClient(app_for_context(ctx)) as client:
        yield client


def test_a_server_executing_an_action_another_server_runs_answers_a_conflict(tmp_path: Path) -> None:
    """`vigil serve` twice on one database: an operator executes the approved drain on server A, and again on
    server B while A's back end is draining. B answers 409 and leaves the action approved; A's run then records
    it executed. Before, B stored the action skipped under its id, and A answered 500 (its record failed)."""
    url = f"sqlite:///{tmp_path / 'vigil.db'}"
    store = Store(url)
    store.add_action(approved_drain())
    runs: list[str] = []
    seen_during: list[tuple[int, str, str]] = []
    b_remediator = Remediator([CountingActuator(runs)], AuditLog(url), dry_run=False, requested_by="vigil-api-b")
    with server(url, tmp_path / "b", b_remediator) as server_b:

        def execute_on_b() -> None:
            answer = server_b.post("/api/v1/actions/act-drain-n1/execute", params={"dry_run": "false"}, headers=AUTH)
            stored = store.action("act-drain-n1")
            assert stored is not None
            seen_during.append((answer.status_code, answer.json()["detail"], stored.status.value))

        a_actuator = CountingActuator(runs, during=execute_on_b)
        a_actuator.name = "server-a"
        a_remediator = Remediator([a_actuator], AuditLog(url), dry_run=False, requested_by="vigil-api-a")
        with server(url, tmp_path / "a", a_remediator) as server_a:
            answer = server_a.post("/api/v1/actions/act-drain-n1/execute", params={"dry_run": "false"},
                                   headers=AUTH)
    assert seen_during == [(409, "action act-drain-n1: running in another process (idempotency key act-drain-n1)",
                            "approved")]
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "executed" and runs == ["server-a:act-drain-n1"]
    stored = store.action("act-drain-n1")
    assert stored is not None and stored.status is ActionStatus.EXECUTED
    records = AuditLog(url).actions()
    assert [(a.id, a.status) for a in records if "repeat_of" not in a.params] == [("act-drain-n1",
                                                                                   ActionStatus.EXECUTED)]
    assert [(a.status, a.params["repeat_of"]) for a in records if "repeat_of" in a.params] == [
        (ActionStatus.SKIPPED, "act-drain-n1")]


class AuditThen(AuditLog):
    """An audit log that runs ``after_close`` once, right after a run's journal row is closed."""

    def __init__(self, url: str, after_close: Callable[[], None]) -> None:
        super().__init__(url)
        self.after_close: Callable[[], None] | None = after_close

    def finish(self, *args: Any, **kwargs: Any) -> bool:
        closed = super().finish(*args, **kwargs)
        if self.after_close is not None:
            after_close, self.after_close = self.after_close, None
            after_close()
        return closed


def test_a_repeat_that_finds_the_run_done_finds_its_record(database: str) -> None:
    """Server B executes the drain the moment server A's run of it is closed in the journal. B's "already executed"
    is recorded apart, and the audit log then holds A's record of the drain: the journal's close and the record
    are one transaction. Before, A closed the journal first and recorded after, so B read "executed" while no
    record of the execution existed (and none would, had A died between the two)."""
    runs: list[str] = []
    other = Remediator([CountingActuator(runs)], AuditLog(database), dry_run=False, requested_by="vigil-api-b")
    repeats: list[Action] = []
    seen: list[list[tuple[str, ActionStatus]]] = []

    def repeat_on_b() -> None:
        repeats.append(other.execute(approved_drain()))
        seen.append([(a.id, a.status) for a in AuditLog(database).actions() if "repeat_of" not in a.params])

    owner = Remediator([CountingActuator(runs)], AuditThen(database, repeat_on_b), dry_run=False,
                       requested_by="vigil-api-a")
    done = owner.execute(approved_drain())

    assert done.id == "act-drain-n1" and done.status is ActionStatus.EXECUTED and runs == ["counting:act-drain-n1"]
    (repeat,) = repeats
    assert repeat.status is ActionStatus.SKIPPED and repeat.result == "already executed (idempotency key act-drain-n1)"
    assert repeat.id != "act-drain-n1" and repeat.params["repeat_of"] == "act-drain-n1"
    assert seen == [[("act-drain-n1", ActionStatus.EXECUTED)]]
    assert {a.id: a.status for a in AuditLog(database).actions()} == {"act-drain-n1": ActionStatus.EXECUTED,
                                                                      repeat.id: ActionStatus.SKIPPED}


def repaired_n1(database: str) -> LifecycleStore:
    """A lifecycle that has node/n1 in repair: a drain of it is done already."""
    lifecycle = LifecycleStore(database)
    for trigger in (Trigger.CORDON, Trigger.DRAIN, Trigger.DRAINED):
        lifecycle.apply("node/n1", trigger, "repair")
    return lifecycle


def test_a_verdict_recorded_under_the_id_while_the_run_works_leaves_the_run_its_close(database: str) -> None:
    """Server A runs the drain; while its back end works, server B - whose lifecycle has node/n1 in repair - decides
    the same action done before any journal and records its skip under the action's id. A's close then finds the id
    taken and records the drain under an id of its own naming the action (params.retry_of), closing the run in the
    same transaction. Before, A looked for a record under the id before the back end, found none, and its insert
    after it raised IntegrityError: the close rolled back, the run stayed started for a takeover to run again."""
    runs: list[str] = []
    b_skips: list[Action] = []
    server_b = Remediator([CountingActuator(runs)], AuditLog(database), lifecycle=repaired_n1(database),
                          dry_run=False, requested_by="vigil-api-b")
    a_actuator = CountingActuator(runs, during=lambda: b_skips.append(server_b.execute(approved_drain())))
    a_actuator.name = "server-a"
    server_a = Remediator([a_actuator], AuditLog(database), dry_run=False, requested_by="vigil-api-a")

    done = server_a.execute(approved_drain())

    (skip,) = b_skips
    assert (skip.id, skip.status) == ("act-drain-n1", ActionStatus.SKIPPED)
    assert done.status is ActionStatus.EXECUTED and runs == ["server-a:act-drain-n1"]
    assert done.id != "act-drain-n1" and done.params["retry_of"] == "act-drain-n1"
    audit = AuditLog(database)
    assert audit.unfinished() == []
    assert {a.id: a.status for a in audit.actions()} == {"act-drain-n1": ActionStatus.SKIPPED,
                                                         done.id: ActionStatus.EXECUTED}


def test_two_records_under_one_id_at_once_on_postgresql(postgres_url: str) -> None:
    """PostgreSQL: another process's transaction has written a verdict under the drain's id and not committed when
    server A runs the drain. A cannot see that record, so nothing before its close can tell the id is taken; its
    close's insert waits on the other transaction (a backend whose pg_blocking_pids names that transaction's), which
    the test then commits. A records the
    drain under an id of its own (params.retry_of) and closes the run. Before, A's earlier look found the id free, its
    insert raised a unique violation once the other committed, and the run stayed started."""
    database = fresh_database(postgres_url, "claims_two_records_one_id")
    audit = AuditLog(database)
    other = audit.engine.connect()
    other_tx = other.begin()
    other_pid = other.execute(text("SELECT pg_backend_pid()")).scalar_one()
    other.execute(insert(remedy_actions).values(id="act-drain-n1", ts=1_000.0, kind="drain", target="node/n1",
                                                reason="Xid 79", requested_by="vigil-api-b", dry_run=False,
                                                status="skipped", result="node/n1 is already drained", params={}))
    runs: list[str] = []
    server_a = Remediator([CountingActuator(runs)], AuditLog(database), dry_run=False, requested_by="vigil-api-a")
    try:
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(server_a.execute, approved_drain())
            with audit.engine.connect() as look:
                # a backend of this database blocked by the other transaction's: server A's insert, and only it
                blocked = text("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                               "AND CAST(:other AS integer) = ANY(pg_blocking_pids(pid)) "
                               "AND query ILIKE '%remedy_actions%'").bindparams(other=other_pid)

                def a_blocked() -> bool:
                    try:  # pg_stat_activity is read once per transaction: a new one each look
                        return bool(look.execute(blocked).scalar_one() > 0)
                    finally:
                        look.rollback()

                wait_for(lambda: running.done() or a_blocked(), 30,
                         "server A's record to wait on the other transaction")
            assert not running.done(), running.result()
            other_tx.commit()
            done = running.result(timeout=30)
    finally:
        other.close()
    assert done.status is ActionStatus.EXECUTED and runs == ["counting:act-drain-n1"]
    assert done.id != "act-drain-n1" and done.params["retry_of"] == "act-drain-n1"
    assert audit.unfinished() == []
    assert {a.id: a.status for a in audit.actions()} == {"act-drain-n1": ActionStatus.SKIPPED,
                                                         done.id: ActionStatus.EXECUTED}
