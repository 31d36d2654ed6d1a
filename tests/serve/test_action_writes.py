"""Approving and executing an action from two servers on one database (`vigil serve` beside `vigil engine`, two
replicas): each server's action lock is its own, so what one writes must not undo what the other wrote meanwhile."""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.serve.conftest import fresh_database
from tests.serve.conftest import postgres_url as postgres_url
from vigil.config import Settings
from vigil.faces.api.actions import ActionRefused, approve, execute
from vigil.faces.api.auth import Identity, Role
from vigil.faces.api.context import ServeContext
from vigil.model import Action, ActionKind, ActionStatus
from vigil.remedy.actuators.base import Actuator
from vigil.remedy.audit import AuditLog
from vigil.remedy.lifecycle import LifecycleStore
from vigil.remedy.remediator import Remediator
from vigil.store.sql import Store

OPERATOR = Identity("otto", Role.OPERATOR)
APPROVER = Identity("alan", Role.APPROVER)


class Cordon(Actuator):
    """A cordon back end; ``during`` runs inside the first dry run's or run's call, while the action is decided."""

    name = "cordon"
    kinds = frozenset({ActionKind.CORDON})
    target_kinds = frozenset({"node"})

    def __init__(self, during: Callable[[], None] | None = None) -> None:
        self.during = during

    def _meanwhile(self) -> None:
        if self.during is not None:
            during, self.during = self.during, None
            during()

    def describe(self, action: Action) -> str:
        self._meanwhile()
        return f"cordon {action.target}"

    def is_satisfied(self, action: Action) -> bool:
        return False

    def execute(self, action: Action) -> str:
        self._meanwhile()
        return f"cordoned {action.target}"


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def frozen(stop: threading.Event, seconds: float) -> bool:
    """The lease renewal's wait in a process frozen with its renewal thread (a paused VM): none before the run ends."""
    return stop.wait()


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'vigil.db'}"
    name = re.sub(r"\W+", "_", request.node.name).lower()
    digest = hashlib.sha1(name.encode()).hexdigest()[:8]
    return fresh_database(request.getfixturevalue("postgres_url"), f"writes_{name[:40]}_{digest}")


def server(database: str, home: Path, remediator: Remediator | None = None) -> ServeContext:
    """One server's context on the shared database: its own store handle (engine) and its own action lock."""
    return ServeContext(store=Store(database), settings=Settings(home=home, db_url=database), remediator=remediator,
                        backend="cordon" if remediator else "none")


def test_a_dry_run_keeps_an_approval_another_server_wrote_meanwhile(database: str, tmp_path: Path) -> None:
    """Server A dry-runs a proposed cordon; while its back end is asked what it would run, server B approves the
    action. Before, A then wrote back the action as it had read it, with the dry run's answer: the approval was
    gone, the action proposed again, and dry_run_status / dry_run_record stayed on it."""
    approving = server(database, tmp_path / "b")
    actuator = Cordon(during=lambda: approve(approving, "act-cordon-n1", APPROVER))
    trying = server(database, tmp_path / "a", Remediator([actuator], AuditLog(database), hold_dry_runs=False))
    trying.store.add_action(Action(id="act-cordon-n1", ts=1_000.0, kind=ActionKind.CORDON, target="node/n1",
                                   reason="Xid 79", requested_by="ada"))

    answer = execute(trying, "act-cordon-n1", OPERATOR, dry_run=True)

    assert actuator.during is None  # the approval was written during the dry run
    assert answer.status is ActionStatus.PROPOSED and answer.result == "dry-run: would cordon node/n1"
    assert answer.params["dry_run_status"] == "proposed" and answer.params["dry_run_by"] == "otto"
    for ctx in (trying, approving):
        stored = ctx.store.action("act-cordon-n1")
        assert stored is not None and stored.status is ActionStatus.APPROVED, stored
        assert stored.params["approved_by"] == "alan" and stored.result == ""
        assert not {k for k in stored.params if k.startswith("dry_run")}, stored.params
    # the dry run is in the audit log, under its own id, naming the action
    (record,) = AuditLog(database).actions(target="node/n1")
    assert record.id == answer.params["dry_run_record"] and record.params["dry_run_of"] == "act-cordon-n1"
    assert (record.status, record.dry_run, record.result) == (ActionStatus.PROPOSED, True, answer.result)
    for ctx in (trying, approving):
        ctx.store.close()


def test_a_late_answer_is_recorded_beside_the_action_not_copied_onto_it(database: str, tmp_path: Path) -> None:
    """Server A executes an approved cordon (claimed at 1000, a 30 s lease) and stalls in the back end; at 1031 the
    engine takes the run over and completes it; then A's call returns. The remediator records that late answer under
    an id of its own; before, the API copied its status, result and params (late_completion_of) onto the stored
    action. The action follows the resumed run, and the late answer is a separate action, naming it."""
    clock = Clock(1_000.0)
    engine = Remediator([Cordon()], AuditLog(database), dry_run=False, requested_by="vigil-engine", clock=clock,
                        wait=frozen, lease_s=30.0)
    resumed: list[Action] = []

    def engine_takes_over() -> None:
        clock.now = 1_031.0
        resumed.extend(engine.recover())

    owner = Remediator([Cordon(during=engine_takes_over)], AuditLog(database), dry_run=False,
                       requested_by="vigil-api", clock=clock, wait=frozen, lease_s=30.0)
    ctx = server(database, tmp_path / "a", owner)
    ctx.store.add_action(Action(id="act-cordon-n1", ts=1_000.0, kind=ActionKind.CORDON, target="node/n1",
                                reason="Xid 79", requested_by="ada", status=ActionStatus.APPROVED,
                                params={"approved_by": "alan"}))

    late = execute(ctx, "act-cordon-n1", OPERATOR, dry_run=False)

    (taken,) = resumed
    assert taken.id == "act-cordon-n1" and taken.status is ActionStatus.EXECUTED
    assert late.id != "act-cordon-n1" and late.status is ActionStatus.EXECUTED
    assert late.params["late_completion_of"] == "act-cordon-n1" and late.params["claim_lost_to"] == engine.owner
    assert late.result.startswith("late completion") and late.params["executed_by"] == "otto"
    # the action takes the resumed run's verdict, not the late answer
    stored = ctx.store.action("act-cordon-n1")
    assert stored is not None and (stored.status, stored.result) == (
        ActionStatus.EXECUTED, "resumed after an interrupted run: cordoned node/n1"), stored
    assert stored.params["approved_by"] == "alan" and stored.params["taken_over_from"] == owner.owner
    assert "late_completion_of" not in stored.params and stored.params["executed_by"] == "otto"
    assert ctx.store.action(late.id) == late  # visible beside it, through the API's reads
    records = {a.id: a for a in AuditLog(database).actions(target="node/n1")}
    assert set(records) == {"act-cordon-n1", late.id}
    assert records["act-cordon-n1"].result.startswith("resumed after an interrupted run")
    ctx.store.close()


def approved_cordon(status: ActionStatus = ActionStatus.APPROVED) -> Action:
    return Action(id="act-cordon-n1", ts=1_000.0, kind=ActionKind.CORDON, target="node/n1", reason="Xid 79",
                  requested_by="ada", status=status, params={"approved_by": "alan"})


def test_a_run_another_process_resumes_settles_the_stored_action(database: str, tmp_path: Path) -> None:
    """Server A is killed while its cordon runs (journalled started at 1000, a 30 s lease); at 1031 the engine
    resumes the run and completes it. The stored action takes the run's verdict with it. Before, only the audit log
    and the journal said executed: the action stayed approved, and executing it again answered 409 'already
    executed' and left it approved for good."""
    ctx = server(database, tmp_path / "a", Remediator([Cordon()], AuditLog(database), dry_run=False))
    ctx.store.add_action(approved_cordon())
    killed = approved_cordon().model_copy(update={"dry_run": False})
    assert AuditLog(database).begin("act-cordon-n1", killed, owner="vigil-api-killed", now=1_000.0,
                                    lease_expires=1_030.0) is None
    engine = Remediator([Cordon()], AuditLog(database), dry_run=False, requested_by="vigil-engine",
                        clock=Clock(1_031.0), lease_s=30.0)

    (resumed,) = engine.recover()

    assert resumed.status is ActionStatus.EXECUTED
    stored = ctx.store.action("act-cordon-n1")
    assert stored is not None and (stored.status, stored.result, stored.dry_run) == (
        ActionStatus.EXECUTED, "resumed after an interrupted run: cordoned node/n1", False), stored
    assert stored.params["approved_by"] == "alan" and stored.params["taken_over_from"] == "vigil-api-killed"
    with pytest.raises(ActionRefused) as refused:
        execute(ctx, "act-cordon-n1", OPERATOR, dry_run=False)
    assert refused.value.status_code == 409 and "is executed" in str(refused.value)
    assert ctx.store.action("act-cordon-n1") == stored
    ctx.store.close()


def test_a_resumed_run_leaves_a_verdict_the_stored_action_holds(database: str, tmp_path: Path) -> None:
    """The stored action holds a verdict already (failed) when a resumed run of it closes: the run is recorded in
    the audit log, and the stored action keeps its verdict - the close writes only over proposed or approved."""
    store = Store(database)
    store.add_action(approved_cordon(ActionStatus.FAILED).model_copy(update={"result": "cordon: HTTP 500"}))
    AuditLog(database).begin("act-cordon-n1", approved_cordon(), owner="vigil-api-killed", now=1_000.0,
                             lease_expires=1_030.0)
    engine = Remediator([Cordon()], AuditLog(database), dry_run=False, clock=Clock(1_031.0), lease_s=30.0)
    (resumed,) = engine.recover()
    assert resumed.status is ActionStatus.EXECUTED
    stored = store.action("act-cordon-n1")
    assert stored is not None and (stored.status, stored.result) == (ActionStatus.FAILED, "cordon: HTTP 500")
    store.close()


def test_an_execute_that_finds_the_run_closed_settles_the_stored_action(database: str, tmp_path: Path) -> None:
    """The run of an approved cordon is closed in the journal, executed, while the stored action still says
    approved (its server died between the two, or an older Vigil closed it). Executing the action again answers
    409 'already executed' and settles the stored action from the run's record; before, it stayed approved."""
    owner = Remediator([Cordon()], AuditLog(database), dry_run=False, requested_by="vigil-api-a")
    assert owner.execute(approved_cordon()).status is ActionStatus.EXECUTED
    ctx = server(database, tmp_path / "b", Remediator([Cordon()], AuditLog(database), dry_run=False,
                                                       requested_by="vigil-api-b"))
    ctx.store.add_action(approved_cordon())

    with pytest.raises(ActionRefused) as refused:
        execute(ctx, "act-cordon-n1", OPERATOR, dry_run=False)

    assert refused.value.status_code == 409 and "already executed" in str(refused.value)
    stored = ctx.store.action("act-cordon-n1")
    assert stored is not None and (stored.status, stored.result, stored.dry_run) == (
        ActionStatus.EXECUTED, "cordoned node/n1", False), stored
    assert stored.params["approved_by"] == "alan" and stored.params["actuator"] == "cordon"
    ctx.store.close()


class ReadThen(Store):
    """A server's store handle that runs ``after_read`` once, right after it reads an action: between a server's
    read of the action and its write of it."""

    def __init__(self, url: str, after_read: Callable[[], object]) -> None:
        super().__init__(url)
        self.after_read: Callable[[], object] | None = after_read

    def action(self, action_id: str) -> Action | None:
        found = super().action(action_id)
        if self.after_read is not None:
            after_read, self.after_read = self.after_read, None
            after_read()
        return found


def test_a_second_approval_at_once_answers_the_first(database: str, tmp_path: Path) -> None:
    """Servers A and B approve one proposed cordon at once: B writes its approval after A read the action as
    proposed. A's answer is what is stored, approved by B's approver; before, A wrote back the whole action with
    itself as approved_by, silently over B's."""
    approving = server(database, tmp_path / "b")
    bea = Identity("bea", Role.APPROVER)
    ctx = ServeContext(store=ReadThen(database, lambda: approve(approving, "act-cordon-n1", bea)),
                       settings=Settings(home=tmp_path / "a", db_url=database), remediator=None, backend="none")
    approving.store.add_action(approved_cordon(ActionStatus.PROPOSED).model_copy(update={"params": {}}))

    answer = approve(ctx, "act-cordon-n1", APPROVER)

    assert (answer.status, answer.params["approved_by"]) == (ActionStatus.APPROVED, "bea"), answer
    stored = approving.store.action("act-cordon-n1")
    assert stored == answer
    for handle in (ctx.store, approving.store):
        handle.close()


def test_an_execute_that_read_the_action_before_another_servers_run_leaves_that_run(database: str,
                                                                                    tmp_path: Path) -> None:
    """Server A reads the approved cordon; before A's remediator decides it, server B executes it: cordoned,
    recorded, node/n1 cordoned in the lifecycle. A's remediator then finds node/n1 already cordoned. A answers 409
    and the action stays B's executed run, with B's operator; before, A's skip failed on B's record of the
    action's id (IntegrityError, HTTP 500) - and its write-back of the whole action would have put 'skipped' over
    B's 'executed'."""
    b_remediator = Remediator([Cordon()], AuditLog(database), dry_run=False, lifecycle=LifecycleStore(database),
                              requested_by="vigil-api-b")
    other = server(database, tmp_path / "b", b_remediator)
    other.store.add_action(approved_cordon())
    a_remediator = Remediator([Cordon()], AuditLog(database), dry_run=False, lifecycle=LifecycleStore(database),
                              requested_by="vigil-api-a")
    ctx = ServeContext(store=ReadThen(database, lambda: execute(other, "act-cordon-n1", Identity("bob", Role.OPERATOR),
                                                                dry_run=False)),
                       settings=Settings(home=tmp_path / "a", db_url=database), remediator=a_remediator,
                       backend="cordon")

    with pytest.raises(ActionRefused) as refused:
        execute(ctx, "act-cordon-n1", OPERATOR, dry_run=False)

    assert refused.value.status_code == 409 and "already cordon" in str(refused.value)
    stored = other.store.action("act-cordon-n1")
    assert stored is not None and (stored.status, stored.result) == (ActionStatus.EXECUTED, "cordoned node/n1")
    assert stored.params["executed_by"] == "bob" and stored.params["approved_by"] == "alan"
    records = AuditLog(database).actions(target="node/n1")
    assert [(a.id, a.status) for a in records if "repeat_of" not in a.params] == [
        ("act-cordon-n1", ActionStatus.EXECUTED)]
    assert [(a.status, a.params["repeat_of"]) for a in records if "repeat_of" in a.params] == [
        (ActionStatus.SKIPPED, "act-cordon-n1")]
    for handle in (ctx.store, other.store):
        handle.close()
