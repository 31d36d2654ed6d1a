"""The engine resumes the runs of dead owners: at start before anything new, then every tick beside detection. A
resumed run closes its journal row whatever its end - refused, skipped, or failed on an error that is not the back
end's - so the next takeover (a peer's tick, this engine after a restart) finds nothing left to trip on; and a
resumed drain that takes minutes does not hold up a tick."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from sqlalchemy.exc import IntegrityError, OperationalError

from tests.conftest import wait_for
from tests.remedy.claims import CountingActuator, crashed_drain
from tests.remedy.claims import database as database
from tests.remedy.held_slurm import crashed_drain_of
from tests.serve.conftest import postgres_url as postgres_url
from vigil.config import Settings
from vigil.model import Action, ActionKind, ActionStatus, Node, Topology
from vigil.remedy.audit import AuditLog
from vigil.remedy.guard import BlastRadiusGuard
from vigil.remedy.lifecycle import LifecycleStore, Trigger
from vigil.remedy.remediator import UNCLOSED_WARN_AFTER, Remediator
from vigil.run.engine import Engine, start_in_thread, stop_in_thread
from vigil.store.sql import Store

# what a test opened (its engines, then their stores), closed at its end: an engine left running renews its lease,
# and a store left open keeps its pooled connections, for the rest of the session
_OPENED: list[Engine | Store] = []
_Opened = TypeVar("_Opened", Engine, Store)


def opened(thing: _Opened) -> _Opened:
    _OPENED.append(thing)
    return thing


@pytest.fixture(autouse=True)
def _close_opened() -> Iterator[None]:
    yield
    engines = [e for e in _OPENED if isinstance(e, Engine)]
    stores = [s for s in _OPENED if isinstance(s, Store)]
    _OPENED.clear()
    for engine in engines:
        engine.close()
    for store in stores:
        store.close()


def engine_at(database: str, home: Path, now: float, *, guard: BlastRadiusGuard | None = None,
              actuator: CountingActuator | None = None) -> Engine:
    """An engine process on ``database`` whose remediator's clock reads ``now``."""
    settings = Settings(home=home, db_url=database)
    remediator = Remediator([actuator or CountingActuator([])], AuditLog(database), dry_run=False,
                            lifecycle=LifecycleStore(database), guard=guard, requested_by="vigil-engine",
                            clock=lambda: now, lease_s=30.0)
    return opened(Engine(opened(Store(database)), settings, notifiers=[], remediator=remediator))


@pytest.mark.parametrize("verdict", [ActionStatus.REFUSED, ActionStatus.SKIPPED])
def test_a_resumed_run_refused_or_skipped_is_closed(database: str, tmp_path: Path, verdict: ActionStatus) -> None:
    """A dead owner's drain of node/n1, resumed at start by an engine whose guard refuses it (node/n1 is not in the
    topology) or whose lifecycle has it done (node/n1 is already in repair). The verdict closes the run, so the
    engine started again after its own claim lapsed finds nothing to resume. Before, the run stayed started under
    the first engine's claim, and the restart's takeover recorded the verdict again under the action's id:
    Engine.start() raised IntegrityError."""
    audit = AuditLog(database)
    crashed_drain(audit, at=1_000.0, lease_s=30.0)
    if verdict is ActionStatus.SKIPPED:
        lifecycle = LifecycleStore(database)
        for trigger in (Trigger.CORDON, Trigger.DRAIN, Trigger.DRAINED):
            lifecycle.apply("node/n1", trigger, "repair")
    guard = BlastRadiusGuard(Topology(nodes=[Node(name="n2")]))
    first = engine_at(database, tmp_path, 1_031.0, guard=guard)
    first.start()
    assert first.resumed_actions == 1 and audit.unfinished() == []
    (record,) = audit.actions()
    assert record.id == "act-drain-n1" and record.status is verdict
    assert record.params["taken_over_from"] == "vigil-api-killed"

    restarted = engine_at(database, tmp_path, 1_062.0, guard=BlastRadiusGuard(Topology(nodes=[Node(name="n2")])))
    restarted.start()
    restarted.tick()
    assert restarted._resuming is not None  # the tick's round of resumes runs on its own thread: wait for it
    restarted._resuming.join(timeout=10)
    assert not restarted._resuming.is_alive()
    assert restarted.resumed_actions == 0 and [a.id for a in audit.actions()] == ["act-drain-n1"]


def test_a_refused_resumed_run_may_be_retried_at_once(database: str, tmp_path: Path) -> None:
    """The run the guard refused never reached the back end: a retry under its key, within what was the engine's
    claim, runs it - not "running in another process"."""
    audit = AuditLog(database)
    crashed_drain(audit, at=1_000.0, lease_s=30.0)
    engine_at(database, tmp_path, 1_031.0, guard=BlastRadiusGuard(Topology(nodes=[Node(name="n2")]))).start()
    runs: list[str] = []
    server = Remediator([CountingActuator(runs)], AuditLog(database), dry_run=False, requested_by="vigil-api",
                        clock=lambda: 1_040.0)
    retry = Action(id="act-drain-n1-retry", ts=1_040.0, kind=ActionKind.DRAIN, target="node/n1",
                   status=ActionStatus.APPROVED, params={"idempotency_key": "act-drain-n1"})
    done = server.execute(retry)
    assert (done.status, done.result) == (ActionStatus.EXECUTED, "drained node/n1")
    assert runs == ["counting:act-drain-n1-retry"] and audit.unfinished() == []


class BrokenDrain(CountingActuator):
    """A drain whose actuator has a bug: an error that is not the back end's refusal, which fails the run as one."""

    def execute(self, action: Action) -> str:
        super().execute(action)
        raise KeyError("nodeName")


def test_a_resumed_run_that_raises_is_closed_as_failed(database: str, tmp_path: Path) -> None:
    """An error other than the back end's refusal inside the resumed run (a bug in the actuator) fails the run, with
    the error, instead of escaping Engine.start() and leaving the run started for the next takeover to trip on."""
    audit = AuditLog(database)
    crashed_drain(audit, at=1_000.0, lease_s=30.0)
    runs: list[str] = []
    engine = engine_at(database, tmp_path, 1_031.0, actuator=BrokenDrain(runs))
    engine.start()
    assert runs == ["counting:act-drain-n1"] and audit.unfinished() == []
    (record,) = audit.actions()
    assert record.id == "act-drain-n1" and record.status is ActionStatus.FAILED
    assert record.result == "counting: KeyError: 'nodeName'"
    restarted = engine_at(database, tmp_path, 1_062.0)
    restarted.start()
    assert restarted.resumed_actions == 0 and len(audit.actions()) == 1


def resumed_to(database: str, home: Path, verdict: ActionStatus, runs: list[str]) -> None:
    """The crashed drain of node/n1, resumed at 1031 by an engine that ends it as ``verdict``: its guard refuses
    node/n1, its lifecycle has node/n1 in repair already, or its actuator raises after the back end ran."""
    crashed_drain(AuditLog(database), at=1_000.0, lease_s=30.0)
    if verdict is ActionStatus.SKIPPED:
        lifecycle = LifecycleStore(database)
        for trigger in (Trigger.CORDON, Trigger.DRAIN, Trigger.DRAINED):
            lifecycle.apply("node/n1", trigger, "repair")
    guard = BlastRadiusGuard(Topology(nodes=[Node(name="n2")])) if verdict is ActionStatus.REFUSED else None
    actuator = BrokenDrain(runs) if verdict is ActionStatus.FAILED else CountingActuator(runs)
    engine_at(database, home, 1_031.0, guard=guard, actuator=actuator).start()
    (record,) = AuditLog(database).actions()
    assert (record.id, record.status) == ("act-drain-n1", verdict)


@pytest.mark.parametrize("verdict", [ActionStatus.REFUSED, ActionStatus.SKIPPED, ActionStatus.FAILED])
def test_the_same_action_runs_again_after_its_resumed_run_ended(database: str, tmp_path: Path,
                                                                verdict: ActionStatus) -> None:
    """A resumed run that ended refused, skipped or failed holds its record under the action's id and leaves the
    action open to run again. An operator executing that same action again runs the back end once more, and its
    verdict is recorded beside the first, under an id of its own naming the action (params.retry_of); the run is
    closed, and a takeover after the lease finds nothing to resume. Before, the verdict's record under the action's
    id raised IntegrityError, which rolled back the run's close: the run stayed started, and every takeover after a
    lease ran the back end again."""
    runs: list[str] = []
    resumed_to(database, tmp_path, verdict, runs)
    before = len(runs)
    server = Remediator([CountingActuator(runs)], AuditLog(database), dry_run=False, requested_by="vigil-api",
                        clock=lambda: 1_040.0, lease_s=30.0)
    again = Action(id="act-drain-n1", ts=1_040.0, kind=ActionKind.DRAIN, target="node/n1", reason="Xid 79",
                   status=ActionStatus.APPROVED, params={"idempotency_key": "act-drain-n1"})
    done = server.execute(again)
    assert (done.status, done.result) == (ActionStatus.EXECUTED, "drained node/n1")
    assert done.id != "act-drain-n1" and done.params["retry_of"] == "act-drain-n1"
    assert runs[before:] == ["counting:act-drain-n1"]
    audit = AuditLog(database)
    assert audit.unfinished() == []
    assert [(a.id, a.status) for a in audit.actions()] == [("act-drain-n1", verdict),
                                                            (done.id, ActionStatus.EXECUTED)]
    peer = engine_at(database, tmp_path, 1_100.0, actuator=CountingActuator(runs))
    peer.start()
    assert peer.resumed_actions == 0 and runs[before:] == ["counting:act-drain-n1"]


def drain_to_retry() -> Action:
    return Action(id="act-drain-n1", ts=1_040.0, kind=ActionKind.DRAIN, target="node/n1", reason="Xid 79",
                  status=ActionStatus.APPROVED, params={"idempotency_key": "act-drain-n1"})


def test_a_resumed_run_that_raises_settles_its_stored_action(database: str, tmp_path: Path) -> None:
    """The stored action follows its run's close on the path of an error that is not the back end's too: it was
    left approved while the journal and the audit said failed."""
    store = opened(Store(database))
    store.add_action(drain_to_retry())
    resumed_to(database, tmp_path, ActionStatus.FAILED, [])
    stored = store.action("act-drain-n1")
    assert stored is not None and stored.status is ActionStatus.FAILED, stored
    assert stored.result == "counting: KeyError: 'nodeName'"


@pytest.mark.parametrize("verdict", [ActionStatus.REFUSED, ActionStatus.SKIPPED, ActionStatus.FAILED])
def test_a_retry_settles_the_stored_action_and_a_later_execute_keeps_it(database: str, tmp_path: Path,
                                                                        verdict: ActionStatus) -> None:
    """A stored action still approved beside a record of its earlier run's failure (written by a Vigil that did not
    settle it) is executed again: the retry's verdict, recorded under an id of its own (params.retry_of), settles the
    stored action in the run's close, and an execute after it finds the action executed and leaves it so. Before,
    the retry settled nothing (its new id names no stored action), and the next execute settled the stored action
    from the earlier record: failed, over a run the journal had done."""
    runs: list[str] = []
    resumed_to(database, tmp_path, verdict, runs)
    store = opened(Store(database))
    store.add_action(drain_to_retry())
    server = Remediator([CountingActuator(runs)], AuditLog(database), dry_run=False, requested_by="vigil-api",
                        clock=lambda: 1_040.0, lease_s=30.0)
    done = server.execute(drain_to_retry())
    assert done.status is ActionStatus.EXECUTED and done.params["retry_of"] == "act-drain-n1"
    stored = store.action("act-drain-n1")
    assert stored is not None and (stored.status, stored.result) == (ActionStatus.EXECUTED, "drained node/n1")
    again = server.execute(drain_to_retry())
    assert again.status is ActionStatus.SKIPPED and "already executed" in again.result
    stored = store.action("act-drain-n1")
    assert stored is not None and stored.status is ActionStatus.EXECUTED, stored


@pytest.mark.parametrize("verdict", [ActionStatus.REFUSED, ActionStatus.FAILED])
def test_a_crashed_retry_of_a_recorded_action_is_resumed_and_closed(database: str, tmp_path: Path,
                                                                    verdict: ActionStatus) -> None:
    """The action's resumed run was refused; a retry of the same action then died mid-run, and an engine takes
    that run over and ends it refused (its guard) or failed (an error not the back end's). The verdict is recorded
    beside the first (params.retry_of) and the run is closed. Before, the record under the action's id raised
    IntegrityError, and so did the failed run's close with it in the except path: Engine.start() raised, the run
    stayed started."""
    runs: list[str] = []
    resumed_to(database, tmp_path, ActionStatus.REFUSED, runs)
    audit = AuditLog(database)
    retry = Action(id="act-drain-n1", ts=1_040.0, kind=ActionKind.DRAIN, target="node/n1", reason="Xid 79",
                   status=ActionStatus.APPROVED, params={"idempotency_key": "act-drain-n1"})
    assert audit.begin("act-drain-n1", retry, owner="vigil-api-killed-again", now=1_040.0,
                       lease_expires=1_070.0) == "refused"
    guard = BlastRadiusGuard(Topology(nodes=[Node(name="n2")])) if verdict is ActionStatus.REFUSED else None
    actuator = BrokenDrain(runs) if verdict is ActionStatus.FAILED else CountingActuator(runs)
    engine = engine_at(database, tmp_path, 1_071.0, guard=guard, actuator=actuator)
    engine.start()
    assert engine.resumed_actions == 1 and audit.unfinished() == []
    first, second = audit.actions()
    assert (first.id, first.status) == ("act-drain-n1", ActionStatus.REFUSED)
    assert second.id != "act-drain-n1" and second.status is verdict
    assert second.params["retry_of"] == "act-drain-n1"
    assert second.params["taken_over_from"] == "vigil-api-killed-again"
    assert len(runs) == (1 if verdict is ActionStatus.FAILED else 0)


class HeldDrain(CountingActuator):
    """A drain that evicts until the test lets it finish."""

    def __init__(self, runs: list[str]) -> None:
        super().__init__(runs)
        self.evicting, self.finish = threading.Event(), threading.Event()

    def execute(self, action: Action) -> str:
        self.evicting.set()
        assert self.finish.wait(timeout=60)
        return super().execute(action)


def test_ticks_go_on_while_a_resumed_drain_runs(tmp_path: Path) -> None:
    """A server beside the engine dies mid-drain; the engine's next tick takes the drain over. The tick returns
    while the drain is evicting, and so does the next one, which does not start the drain twice. Before, the tick
    ran the drain itself, and detection waited for the whole eviction."""
    database = f"sqlite:///{tmp_path / 'vigil.db'}"
    runs: list[str] = []
    drain = HeldDrain(runs)
    engine = engine_at(database, tmp_path, 1_031.0, actuator=drain)
    engine.start()
    crashed_drain(AuditLog(database), at=1_000.0, lease_s=30.0)  # after the start: the peer died since
    ticked: list[int] = []

    def two_ticks() -> None:
        for _ in range(2):
            engine.tick()
            ticked.append(engine.ticks)

    ticking = threading.Thread(target=two_ticks, name="ticks")
    try:
        ticking.start()
        assert drain.evicting.wait(timeout=30)
        ticking.join(timeout=30)
        assert not ticking.is_alive() and ticked == [1, 2]  # both ticks done, the drain still evicting
        assert runs == [] and engine.resumed_actions == 0
    finally:
        drain.finish.set()
    wait_for(lambda: engine.resumed_actions == 1, 30, "the resumed drain to end")
    assert runs == ["counting:act-drain-n1"] and AuditLog(database).unfinished() == []


def test_stopping_the_engine_waits_for_the_resumed_drain(tmp_path: Path) -> None:
    """The engine is stopped (SIGTERM sets ``stop``) while a drain it took over from a dead server is evicting: run()
    returns once the drain has ended and its run is closed. Before, run() returned at once and the process ended
    with the drain cut short (its thread is a daemon), left for another process to take over a lease later."""
    database = f"sqlite:///{tmp_path / 'vigil.db'}"
    runs: list[str] = []
    drain = HeldDrain(runs)
    engine = engine_at(database, tmp_path, 1_031.0, actuator=drain)
    engine.start()
    crashed_drain(AuditLog(database), at=1_000.0, lease_s=30.0)
    running = threading.Thread(target=engine.run, name="engine")
    try:
        running.start()
        assert drain.evicting.wait(timeout=30)
        engine.stop.set()
        running.join(timeout=1.0)
        assert running.is_alive() and runs == []  # still waiting for the drain
    finally:
        drain.finish.set()
    running.join(timeout=30)
    assert not running.is_alive() and engine.resumed_actions == 1
    assert runs == ["counting:act-drain-n1"] and AuditLog(database).unfinished() == []


def test_a_round_claims_no_run_once_stopping(database: str, tmp_path: Path) -> None:
    """Two dead servers' drains (node/n1, node/n2) lapsed; the engine's round takes one over, and the engine is
    stopped while that drain evicts. The drain ends and its run is closed, and the round claims no other: the second
    drain is left started under its dead owner, for the next engine or a peer. Before, the round went on claiming
    and ran the second drain after stop was set (2 resumed)."""
    runs: list[str] = []
    drain = HeldDrain(runs)
    engine = engine_at(database, tmp_path, 1_031.0, actuator=drain)
    engine.start()
    crashed_drain(AuditLog(database), at=1_000.0, lease_s=30.0)
    crashed_drain_of(database, "n2")
    try:
        engine.tick()
        assert drain.evicting.wait(timeout=30)
        engine.stop.set()
    finally:
        drain.finish.set()
    assert engine._resuming is not None
    engine._resuming.join(timeout=30)
    assert not engine._resuming.is_alive()
    assert engine.resumed_actions == 1 and len(runs) == 1
    (left,) = AuditLog(database).unfinished_runs()
    assert left.owner == "vigil-api-killed" and f"counting:{left.key}" not in runs


def test_one_tick_waits_for_the_resumed_drain_at_most_a_lease(tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """`vigil engine --once` after a tick that took a drain over: finish_resuming() returns when the drain ends, and
    gives up after one lease with one warning when it does not (the lease here is 0.5 s)."""
    database = f"sqlite:///{tmp_path / 'vigil.db'}"
    runs: list[str] = []
    drain = HeldDrain(runs)
    remediator = Remediator([drain], AuditLog(database), dry_run=False, requested_by="vigil-engine",
                            clock=lambda: 1_031.0, lease_s=0.5, renew_s=0.2)
    engine = opened(Engine(opened(Store(database)), Settings(home=tmp_path, db_url=database), notifiers=[],
                           remediator=remediator))
    engine.start()
    crashed_drain(AuditLog(database), at=1_000.0, lease_s=30.0)
    try:
        engine.tick()
        assert drain.evicting.wait(timeout=30)
        with caplog.at_level("WARNING", logger="vigil.engine"):
            assert engine.finish_resuming() is False
        assert [r.getMessage() for r in caplog.records] == [
            "stopping while interrupted actions are still being resumed after 0.5 s (one lease); another server or "
            "engine takes them over once this process's lease on them lapses"]
    finally:
        drain.finish.set()
    wait_for(lambda: engine.resumed_actions == 1, 30, "the resumed drain to end")
    assert engine.finish_resuming() is True
    assert runs == ["counting:act-drain-n1"] and AuditLog(database).unfinished() == []


class LifecycleAway(LifecycleStore):
    """A node lifecycle whose table cannot be read: the database went away in the middle of a resumed run."""

    def status(self, node: str) -> Any:
        raise OperationalError("SELECT remedy_node_states", {}, ConnectionError("server closed the connection"))


class AuditSeenByPeer(AuditLog):
    """An audit log that notes, right after each close of a run, what another process reads: the records and the
    runs still started. ``record_fails``: a close carrying a record raises instead (the record cannot be written)."""

    def __init__(self, url: str, *, record_fails: bool = False) -> None:
        super().__init__(url)
        self.record_fails = record_fails
        self.seen: list[tuple[list[tuple[str, ActionStatus]], list[str]]] = []

    def finish(self, *args: Any, **kwargs: Any) -> bool:
        if self.record_fails and kwargs.get("record") is not None:
            raise IntegrityError("INSERT INTO remedy_actions", {}, ValueError("duplicate key"))
        closed = super().finish(*args, **kwargs)
        peer = AuditLog(str(self.engine.url.render_as_string(hide_password=False)))
        self.seen.append(([(a.id, a.status) for a in peer.actions()], [run.key for run in peer.unfinished_runs()]))
        return closed


def test_a_resumed_run_that_raises_is_closed_with_its_record(database: str) -> None:
    """The engine takes over a dead server's drain and the lifecycle's table cannot be read before the back end is
    asked: the run's close as failed and the failure's record are one transaction, so a process reading right after
    the close finds the record. Before, the close committed alone and the record came after (a peer read the run
    failed with no record of it, and none would exist had the engine died between the two)."""
    crashed_drain(AuditLog(database), at=1_000.0, lease_s=30.0)
    audit = AuditSeenByPeer(database)
    runs: list[str] = []
    engine = Remediator([CountingActuator(runs)], audit, lifecycle=LifecycleAway(database), dry_run=False,
                        requested_by="vigil-engine", clock=lambda: 1_031.0)
    (resumed,) = engine.recover()
    assert resumed.status is ActionStatus.FAILED and resumed.result.startswith("resuming failed: OperationalError")
    assert runs == []
    assert audit.seen == [([("act-drain-n1", ActionStatus.FAILED)], [])]


def test_a_resumed_run_whose_record_fails_is_closed_all_the_same(database: str) -> None:
    """The same, and the failure's record cannot be written: the run is closed without it, and the stored action
    settled failed, so no takeover runs the back end again."""
    store = opened(Store(database))
    store.add_action(drain_to_retry())
    crashed_drain(AuditLog(database), at=1_000.0, lease_s=30.0)
    audit = AuditSeenByPeer(database, record_fails=True)
    engine = Remediator([CountingActuator([])], audit, lifecycle=LifecycleAway(database), dry_run=False,
                        requested_by="vigil-engine", clock=lambda: 1_031.0)
    (resumed,) = engine.recover()
    assert resumed.status is ActionStatus.FAILED
    assert audit.seen == [([], [])]
    stored = store.action("act-drain-n1")
    assert stored is not None and stored.status is ActionStatus.FAILED, stored


class WatchedLoop(threading.Thread):
    """The engine's loop thread, saying when a stop starts waiting for it."""

    def __init__(self, engine: Engine, progressed: threading.Event) -> None:
        super().__init__(target=engine.run, name="vigil-engine", daemon=True)
        self.joined, self.progressed = threading.Event(), progressed

    def join(self, timeout: float | None = None) -> None:
        self.joined.set()
        self.progressed.set()
        super().join(timeout)


def held_tick_engine(tmp_path: Path, **settings: Any) -> tuple[Engine, threading.Event, threading.Event]:
    """An engine with no remediator (no back end, the default) whose tick holds until the test lets it go."""
    database = f"sqlite:///{tmp_path / 'vigil.db'}"
    engine = Engine(opened(Store(database)), Settings(home=tmp_path, db_url=database, **settings), notifiers=[],
                    remediator=None)
    in_tick, let_go = threading.Event(), threading.Event()

    def held_tick() -> None:
        in_tick.set()
        let_go.wait(60)

    engine.tick = held_tick  # type: ignore[method-assign]
    return engine, in_tick, let_go


def test_stop_waits_for_the_tick_in_flight_without_a_remediator(tmp_path: Path) -> None:
    """`vigil serve` with no back end stopping while its engine's tick runs (publishing incidents, notifying, saving
    the cursor): stop_in_thread waits on the loop, and returns True once the tick ends, the loop ended. Before, it
    returned at once without waiting (finish_resuming had nothing to wait for without a remediator)."""
    engine, in_tick, let_go = held_tick_engine(tmp_path)
    progressed = threading.Event()
    loop = WatchedLoop(engine, progressed)
    loop.start()
    stopped: list[bool] = []

    def stop() -> None:
        stopped.append(stop_in_thread(engine, loop))
        progressed.set()

    stopper = threading.Thread(target=stop, daemon=True)
    try:
        assert in_tick.wait(30)
        stopper.start()
        assert progressed.wait(30)
        assert loop.joined.is_set() and stopped == [], "stop_in_thread returned without waiting for the tick"
    finally:
        let_go.set()
    stopper.join(30)
    assert stopped == [True] and not loop.is_alive()


def test_stop_without_a_remediator_gives_up_on_the_tick_after_one_lease(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """A tick that does not end: the stop gives up after remedy_lease_s (0.5 s here) with one warning."""
    engine, in_tick, let_go = held_tick_engine(tmp_path, remedy_lease_s=0.5, remedy_lease_renew_s=0.2)
    loop = start_in_thread(engine)
    try:
        assert in_tick.wait(30)
        with caplog.at_level("WARNING", logger="vigil.engine"):
            assert stop_in_thread(engine, loop) is False
        assert loop.is_alive()
        assert [r.getMessage() for r in caplog.records] == [
            "stopping while the engine's tick is still running after 0.5 s (one lease)"]
    finally:
        let_go.set()
    loop.join(30)
    assert not loop.is_alive()


class AuditAway(AuditLog):
    """An audit log whose database connection is gone while ``away``: every close of a run raises."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.away = True

    def finish(self, *args: Any, **kwargs: Any) -> bool:
        if self.away:
            raise OperationalError("UPDATE remedy_intents", {}, ConnectionError("server closed the connection"))
        return super().finish(*args, **kwargs)


def test_a_resumed_run_whose_close_fails_is_closed_at_the_next_round(database: str,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    """The engine takes over a dead server's drain, the lifecycle's table cannot be read, and the database is gone
    for the failure's close too (with its record and without). The round goes on with one error naming the run and
    what happens to it; a round while the database is still away leaves the run started without a word more; the
    first round after it is back closes the run failed with its record, the stored action settled. Before, the close's
    error went up through recover() (Engine.start() raised) and the run stayed started under this engine's claim,
    which no round of its own takes over: open for this process's life."""
    store = opened(Store(database))
    store.add_action(drain_to_retry())
    crashed_drain(AuditLog(database), at=1_000.0, lease_s=30.0)
    audit = AuditAway(database)
    runs: list[str] = []
    engine = Remediator([CountingActuator(runs)], audit, lifecycle=LifecycleAway(database), dry_run=False,
                        requested_by="vigil-engine", clock=lambda: 1_031.0)
    with caplog.at_level("DEBUG", logger="vigil.remedy"):
        (resumed,) = engine.recover()
        assert resumed.status is ActionStatus.FAILED and resumed.result.startswith("resuming failed: OperationalError")
        closing = [r for r in caplog.records if "closing the failed resumed run" in r.getMessage()]
        assert [(r.levelname, r.getMessage()) for r in closing] == [(
            "ERROR", "closing the failed resumed run act-drain-n1 (drain on node/n1) failed too: OperationalError: "
            "(builtins.ConnectionError) server closed the connection; it is left started, closed at the next recovery "
            "round or taken over by another server or engine once this process's lease on it lapses")]
        (left,) = AuditLog(database).unfinished_runs()
        assert left.key == "act-drain-n1" and left.owner == engine.owner

        caplog.clear()
        assert engine.recover() == []  # still away: still started, and nothing said above debug
        assert [r.levelname for r in caplog.records if r.levelno > 10] == []
        assert [run.key for run in AuditLog(database).unfinished_runs()] == ["act-drain-n1"]

        audit.away = False
        assert engine.recover() == []
    assert AuditLog(database).unfinished_runs() == [] and runs == []
    (record,) = AuditLog(database).actions()
    assert (record.id, record.status) == ("act-drain-n1", ActionStatus.FAILED)
    assert record.result.startswith("resuming failed: OperationalError")
    stored = store.action("act-drain-n1")
    assert stored is not None and stored.status is ActionStatus.FAILED, stored
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        "closed the failed resumed run act-drain-n1 (drain on node/n1) at a later recovery round"]


class LifecycleBack(LifecycleAway):
    """A node lifecycle whose table cannot be read while ``away``, and can again once the database is back."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.away = True

    def status(self, node: str) -> Any:
        return super().status(node) if self.away else LifecycleStore.status(self, node)


def test_a_remembered_close_leaves_a_live_rerun_of_the_same_action_alone(database: str) -> None:
    """The engine of a server resumes a dead server's drain of node/n1; the run fails and its close fails too (the
    database gone), so it is remembered to close at the next round. The database returns and an operator executes
    the still-approved action on the same server (the API and the engine share one remediator): the run is its own,
    so the drain starts again, the guard holding node/n1. The engine's round, run while that drain is in flight,
    must leave it alone: node/n1 stays held (a cordon of node/n2 is refused: one node of ten may be out), and the
    drain ends executed, the stored action with it. Before, the round's deferred close matched the live run (same
    owner) and closed it failed, released node/n1's hold and settled the action failed."""
    store = opened(Store(database))
    store.add_action(drain_to_retry())
    crashed_drain(AuditLog(database), at=1_000.0, lease_s=30.0)
    audit, lifecycle = AuditAway(database), LifecycleBack(database)
    guard = BlastRadiusGuard(Topology(nodes=[Node(name=f"n{i}") for i in range(1, 11)]), max_share=0.1)
    seen: dict[str, Any] = {}

    def tick_round() -> None:
        seen["resumed"] = server.recover()
        seen["n1 held"] = "node/n1" in guard.out_of_service()
        seen["cordon n2"] = guard.admit_all(["node/n2"], reserve=False, owner="act-cordon-n2").admitted

    runs: list[str] = []
    server = Remediator([CountingActuator(runs, during=tick_round)], audit, lifecycle=lifecycle, guard=guard,
                        dry_run=False, requested_by="vigil-api", clock=lambda: 1_031.0, lease_s=30.0)
    (resumed,) = server.recover()
    assert resumed.status is ActionStatus.FAILED and runs == []
    assert [run.key for run in AuditLog(database).unfinished_runs()] == ["act-drain-n1"]

    audit.away = lifecycle.away = False
    done = server.execute(drain_to_retry())
    assert runs == ["counting:act-drain-n1"]
    assert seen == {"resumed": [], "n1 held": True, "cordon n2": False}
    assert done.status is ActionStatus.EXECUTED, done
    assert AuditLog(database).unfinished_runs() == []
    stored = store.action("act-drain-n1")
    assert stored is not None and stored.status is ActionStatus.EXECUTED, stored
    # the failed resumed run kept its record, closed before the re-run began; the re-run's is beside it
    assert sorted((a.status.value, a.params.get("retry_of")) for a in AuditLog(database).actions()) == [
        ("executed", "act-drain-n1"), ("failed", None)]
    assert "node/n1" in guard.out_of_service()  # drained: held until back in service


class AuditTakenOverWhileAway(AuditLog):
    """An audit log whose connection drops at the close of the first run that succeeded, while a peer whose clock is
    past the lease takes the run over from ``engine`` (the database came back after this process's lease lapsed)."""

    engine_owner = ""

    def finish(self, key: str, state: str, *args: Any, **kwargs: Any) -> bool:
        if state == "done" and self.engine_owner:
            owner, self.engine_owner = self.engine_owner, ""
            assert AuditLog(str(self.engine.url)).claim(key, "vigil-peer", owner, now=2_000.0, lease_expires=2_030.0)
            raise OperationalError("UPDATE remedy_intents", {}, ConnectionError("server closed the connection"))
        return super().finish(key, state, *args, **kwargs)


def test_a_resumed_run_whose_claim_is_lost_before_its_failure_closes_releases_its_nodes(database: str) -> None:
    """The engine resumes a dead server's drain of node/n1; the back end drains, but the run's close fails (the
    database gone) and by the time the failure's close reaches it a peer has taken the run over. The run is the
    peer's, whose guard holds node/n1; this engine's guard lets it go, as a late completion does. Before, node/n1
    stayed held here for the process's life (the back end had been asked), counting against the blast radius."""
    crashed_drain(AuditLog(database), at=1_000.0, lease_s=30.0)
    audit = AuditTakenOverWhileAway(database)
    guard = BlastRadiusGuard(Topology(nodes=[Node(name=f"n{i}") for i in range(1, 11)]), max_share=0.1)
    runs: list[str] = []
    engine = Remediator([CountingActuator(runs)], audit, guard=guard, dry_run=False, requested_by="vigil-engine",
                        clock=lambda: 1_031.0, lease_s=30.0)
    audit.engine_owner = engine.owner
    (resumed,) = engine.recover()
    assert runs == ["counting:act-drain-n1"]
    assert resumed.status is ActionStatus.FAILED and resumed.result.startswith("resuming failed: OperationalError")
    assert AuditLog(database).owner_of("act-drain-n1") == "vigil-peer"
    assert engine._unclosed == {}
    assert guard.out_of_service() == set()
    assert guard.admit_all(["node/n2"], reserve=False).admitted


def test_a_remembered_close_that_keeps_failing_is_warned_once(database: str,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """A remembered close that fails round after round (the database away for long) is said once more, as a warning
    naming the run, at the 10th round in a row - not at every round, and not only at debug for ever as before."""
    crashed_drain(AuditLog(database), at=1_000.0, lease_s=30.0)
    audit = AuditAway(database)
    engine = Remediator([CountingActuator([])], audit, lifecycle=LifecycleAway(database), dry_run=False,
                        requested_by="vigil-engine", clock=lambda: 1_031.0)
    (resumed,) = engine.recover()
    assert resumed.status is ActionStatus.FAILED
    with caplog.at_level("DEBUG", logger="vigil.remedy"):
        for _ in range(UNCLOSED_WARN_AFTER * 2):
            assert engine.recover() == []
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [
        f"closing the failed resumed run act-drain-n1 (drain on node/n1) failed again at {UNCLOSED_WARN_AFTER} "
        "recovery rounds in a row: OperationalError: (builtins.ConnectionError) server closed the connection; it stays "
        "started, tried again every round (said once)"]
    audit.away = False
    assert engine.recover() == []
    assert AuditLog(database).unfinished_runs() == []


def test_a_retry_that_succeeds_replaces_the_failure_the_stored_action_read(database: str, tmp_path: Path) -> None:
    """A resumed run of an approved drain fails (an error that is not the back end's) and its close settles the stored
    action failed; an execute of the action that read it approved just before (the API's, racing the engine's round)
    runs it again, and the retry ends executed. The stored action - what `GET /actions`, the dashboard and the API's
    answer read - says executed, the retry's result, with the failure kept in params.earlier_verdicts; the audit log
    keeps both records. Before, the retry's close settled only from proposed or approved, so the action read failed
    for good over a run the journal had done."""
    store = opened(Store(database))
    store.add_action(drain_to_retry())
    runs: list[str] = []
    resumed_to(database, tmp_path, ActionStatus.FAILED, runs)
    failed = store.action("act-drain-n1")
    assert failed is not None and failed.status is ActionStatus.FAILED
    server = Remediator([CountingActuator(runs)], AuditLog(database), dry_run=False, requested_by="vigil-api",
                        clock=lambda: 1_040.0, lease_s=30.0)
    done = server.execute(drain_to_retry())
    assert done.status is ActionStatus.EXECUTED and done.params["retry_of"] == "act-drain-n1"
    (stored,) = [a for a in store.actions() if a.id == "act-drain-n1"]
    assert (stored.status, stored.result) == (ActionStatus.EXECUTED, "drained node/n1"), stored
    assert stored.params["earlier_verdicts"] == [{"status": "failed", "result": failed.result}]
    assert "retry_of" not in stored.params, stored  # the action is no retry of itself
    assert sorted((a.status.value, a.params.get("retry_of")) for a in AuditLog(database).actions()) == [
        ("executed", "act-drain-n1"), ("failed", None)]
    # a later execute finds the action done, and leaves it so
    again = server.execute(drain_to_retry())
    assert again.status is ActionStatus.SKIPPED
    stored_after = store.action("act-drain-n1")
    assert stored_after is not None and stored_after.status is ActionStatus.EXECUTED


class AuditHeldAtClose(AuditAway):
    """``AuditAway``; once back, the close of the run under ``held_key`` waits for ``let_go`` (a slow store), saying
    when it is there (``closing``); every begin and close is noted in ``calls`` in order."""

    def __init__(self, url: str, held_key: str) -> None:
        super().__init__(url)
        self.held_key = held_key
        self.closing, self.let_go = threading.Event(), threading.Event()
        self.calls: list[str] = []

    def finish(self, key: str, *args: Any, **kwargs: Any) -> bool:
        if not self.away and key == self.held_key and not self.let_go.is_set():
            self.closing.set()
            assert self.let_go.wait(60)
        done = super().finish(key, *args, **kwargs)
        self.calls.append(f"closed {key}")
        return done

    def begin(self, key: str, *args: Any, **kwargs: Any) -> str | None:
        self.calls.append(f"begin {key}")
        return super().begin(key, *args, **kwargs)


class NotedCondition(threading.Condition):
    """A condition that says when a thread starts waiting on it."""

    def __init__(self, lock: Any, waiting: threading.Event) -> None:
        super().__init__(lock)
        self.waiting = waiting

    def wait(self, timeout: float | None = None) -> bool:
        self.waiting.set()
        return super().wait(timeout)


def test_a_slow_remembered_close_holds_up_only_a_rerun_of_its_own_key(database: str) -> None:
    """A resumed drain of node/n1 failed and its close failed too (the database gone), so it is remembered. Back, the
    engine's round closes it on a store that stalls (held until the test lets it go). Meanwhile an operator executes
    a drain of node/n3 on the same remediator: it runs to its end while the close still stalls. A re-run of the
    drain itself waits for that close, and begins only after it returned - the close never matches the live re-run.
    Before, the lock on remembered runs was held across the close's database calls: the other drain waited for the
    stalled close (any execute does, to look for a remembered run of its key)."""
    store = opened(Store(database))
    store.add_action(drain_to_retry())
    crashed_drain(AuditLog(database), at=1_000.0, lease_s=30.0)
    audit, lifecycle = AuditHeldAtClose(database, "act-drain-n1"), LifecycleBack(database)
    runs: list[str] = []
    server = Remediator([CountingActuator(runs)], audit, lifecycle=lifecycle, dry_run=False,
                        requested_by="vigil-api", clock=lambda: 1_031.0, lease_s=30.0)
    (resumed,) = server.recover()
    assert resumed.status is ActionStatus.FAILED and runs == []
    audit.away = lifecycle.away = False
    waiting = threading.Event()
    server._unclosed_closed = NotedCondition(server._unclosed_lock, waiting)

    rounds = threading.Thread(target=server.recover, name="round")
    rounds.start()
    try:
        assert audit.closing.wait(30), "the round's close to reach the store"
        drain_n3 = Action(id="act-drain-n3", ts=1_040.0, kind=ActionKind.DRAIN, target="node/n3", reason="Xid 79",
                          status=ActionStatus.APPROVED)
        drained: list[Action] = []
        other = threading.Thread(target=lambda: drained.append(server.execute(drain_n3)), name="other key")
        other.start()
        other.join(30)
        assert not other.is_alive(), "the drain of node/n3 waited for the stalled close of another run"
        assert [a.status for a in drained] == [ActionStatus.EXECUTED]
        assert not audit.let_go.is_set() and rounds.is_alive()

        rerun: list[Action] = []
        same = threading.Thread(target=lambda: rerun.append(server.execute(drain_to_retry())), name="same key")
        same.start()
        assert waiting.wait(30), "the re-run to wait for the close of its key"
        assert "begin act-drain-n1" not in audit.calls
    finally:
        audit.let_go.set()
    rounds.join(30)
    same.join(30)
    assert not rounds.is_alive() and not same.is_alive()
    drain_calls = [call for call in audit.calls if call.endswith("act-drain-n1")]
    assert drain_calls == ["closed act-drain-n1", "begin act-drain-n1", "closed act-drain-n1"], audit.calls
    assert [a.status for a in rerun] == [ActionStatus.EXECUTED], rerun
    assert runs == ["counting:act-drain-n3", "counting:act-drain-n1"]
    stored = store.action("act-drain-n1")
    assert stored is not None and stored.status is ActionStatus.EXECUTED, stored
    assert AuditLog(database).unfinished_runs() == []
