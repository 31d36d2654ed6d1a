"""The store's engine lease (vigil.run.engine.LEASE): who holds it - host and pid namespace, pid and a token of the
process - and for how long - while the engine's loop shows progress, not merely while its renewing thread lives. A hung
loop lets the lease lapse for a standby engine, and should it move again it finds the lease lost before it writes; an
engine that stops cleanly gives the lease up at once, so another host's engine takes over without waiting out the
lease (a killed one's is waited out). SQLite and PostgreSQL."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_for
from tests.run.engine_process import EngineProcess
from tests.run.engine_site import Site
from tests.serve.conftest import REPO
from tests.serve.conftest import postgres_url as postgres_url
from tests.store.conftest import db_url as db_url
from vigil.config import Settings
from vigil.remedy.commands import this_host
from vigil.run import engine as engine_module
from vigil.run.engine import CURSOR, LEASE, Engine, engine_owner
from vigil.store.sql import LeaseLost

# short, so that a test waits a few seconds for the bound, a lapse and a takeover
LEASE_S = 1.5
STEP_MAX_S = 2.0
# the bound of an engine not under test, or of one before its hang (``unhung``): a loaded machine's slow step is no hang
LONG_STEP_MAX_S = 3600.0
OTHER_HOST = "other-host pid:[4026531836]:1:0123456789abcdef"


class HungQuery:
    """A PromQL source whose query, once armed, does not return until released: a loop hung in a call."""

    def __init__(self) -> None:
        self.armed = threading.Event()
        self.entered = threading.Event()
        self.released = threading.Event()

    def samples(self, metrics: Sequence[str], at: float | None = None) -> list[tuple[str, str, float, float]]:
        if self.armed.is_set():
            self.entered.set()
            assert self.released.wait(120)
        return []


def hung_engine(site: Site, query: HungQuery) -> Engine:
    """An engine whose bound is long (a start-up or a tick slowed by a loaded machine is not taken for hung) until
    ``hang_bound`` shortens it, just before its query hangs."""
    settings = Settings(home=site.settings.home, db_url=site.settings.db_url, resolve_after_s=120.0,
                        remedy_lease_s=LEASE_S, remedy_lease_renew_s=LEASE_S / 3, engine_interval_s=0.1,
                        engine_step_max_s=LONG_STEP_MAX_S)
    return Engine(site.store, settings, prom=query, notifiers=[], clock=site.clock)  # type: ignore[arg-type]


def hang_bound(engine: Engine) -> None:
    """From now on ``engine``'s loop is taken for hung past engine_interval_s + STEP_MAX_S without progress."""
    engine.stuck_after_s = engine.settings.engine_interval_s + STEP_MAX_S


def tick_on_thread(engine: Engine) -> tuple[threading.Thread, list[Any]]:
    """``engine.tick()`` on a thread of its own; what it returned or raised in the list."""
    outcome: list[Any] = []

    def tick() -> None:
        try:
            outcome.append(engine.tick())
        except BaseException as err:
            outcome.append(err)

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    return thread, outcome


def stuck_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "has shown no progress" in r.getMessage()]


def test_a_hung_loop_lets_its_lease_lapse_and_finds_it_lost_before_writing(
        db_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The engine's tick hangs in a query (after reading an Xid event): past engine_interval_s + engine_step_max_s
    without progress its renewing thread stops renewing, in one line; the lease lapses and another host's engine takes
    over. The hung query returns: the tick ends in LeaseLost before writing the anomaly, the incident or the cursor;
    the new holder judges the event, once. Before, the renewing thread kept the lease for as long as the process
    lived: the other engine stood by for ever behind a hung one."""
    caplog.set_level(logging.WARNING, logger="vigil.engine")
    site = Site(db_url, tmp_path)
    query = HungQuery()
    stuck = hung_engine(site, query)
    assert stuck.start()
    stuck.tick()
    cursor_before = site.store.cursor(CURSOR)
    site.store.add_events([site.xid("n01", 1)])
    hang_bound(stuck)
    query.armed.set()
    thread, outcome = tick_on_thread(stuck)
    try:
        assert query.entered.wait(60)
        other = hung_engine(site, HungQuery())  # its bound stays long: it is not the one hung
        other.owner = OTHER_HOST
        # taken only once the renewing thread stopped, past the bound (2.1 s), and the lease lapsed (1.5 s)
        wait_for(lambda: other.start(wait=False), 60, "the other engine to take the lapsed lease over")
        assert len(stuck_lines(caplog)) == 1, caplog.text
        assert site.store.lease_holder(LEASE)[0] == OTHER_HOST  # type: ignore[index]
    finally:
        query.released.set()
        thread.join(60)
    [ended] = outcome
    assert isinstance(ended, LeaseLost), ended
    assert site.store.anomalies() == [] and site.store.incidents() == []
    assert site.store.cursor(CURSOR) == cursor_before
    report = other.tick()
    assert report.events == 1 and len(report.opened) == 1
    assert [a.entity for a in site.store.anomalies()] == ["gpu/n01/1"]
    assert len(stuck_lines(caplog)) == 1
    other.release()
    stuck.release()
    site.store.close()


def test_a_hung_loop_that_moves_again_before_any_takeover_keeps_the_lease(
        db_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The loop hangs past the bound and the renewing thread stops, but no other engine takes the lease: once the loop
    moves again it renews the lease (lapsed or not), renews it on a thread again and judges on - its tick writes the
    anomaly and the cursor."""
    caplog.set_level(logging.WARNING, logger="vigil.engine")
    site = Site(db_url, tmp_path)
    query = HungQuery()
    stuck = hung_engine(site, query)
    assert stuck.start()
    stuck.tick()
    site.store.add_events([site.xid("n01", 1)])
    hang_bound(stuck)
    query.armed.set()
    thread, outcome = tick_on_thread(stuck)
    try:
        assert query.entered.wait(60)
        wait_for(lambda: stuck_lines(caplog), 60, "the renewing thread to stop renewing")
        keeper = stuck._keeper
        assert keeper is not None
        keeper.join(30)
        assert not keeper.is_alive()
    finally:
        # moving again, the loop is not taken for hung while this test reads what it did (however loaded the machine)
        stuck.stuck_after_s = LONG_STEP_MAX_S
        released = time.time()
        query.armed.clear()
        query.released.set()
        thread.join(60)
    [report] = outcome
    assert report.events == 1 and len(report.opened) == 1, outcome
    assert "moves again and no other engine took its lease meanwhile" in caplog.text
    owner, lapses = site.store.lease_holder(LEASE)  # type: ignore[misc]
    assert owner == stuck.owner and lapses >= released + LEASE_S  # renewed once the loop moved again
    assert stuck._keeper is not None and stuck._keeper.is_alive()
    assert site.store.cursor(CURSOR)[1]["events"] == stuck.event_cursor.id
    stuck.release()
    site.store.close()


def test_the_owner_names_host_pid_namespace_pid_and_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The owner is this host's name and pid namespace (as the commands' records give them), the pid and a token of
    the process. A process of this host and namespace that ended is gone (its lease taken at once); the same pid in
    another pid namespace (a container with the same hostname) is not, nor an owner of an older release (HOST:PID),
    nor a live process; this pid's owner with another token is an earlier process by this pid, gone."""
    owner = engine_owner()
    where, pid, token = owner.rsplit(":", 2)
    assert where == this_host() and pid == str(os.getpid()) and len(token) == 16
    assert engine_owner() == owner  # one per process
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    gone = engine_module._process_gone
    assert gone(f"{this_host()}:{dead.pid}:{token}")
    host, _, _ = this_host().partition(" ")
    assert not gone(f"{host} pid:[1]:{dead.pid}:{token}")  # another container's pid namespace
    assert not gone(f"{host}:{dead.pid}")  # an older release's owner: its lease lapses
    assert not gone(f"{this_host()}:{os.getppid()}:{token}")  # alive
    assert not gone(owner)
    assert gone(f"{this_host()}:{os.getpid()}:{'0' * 16}")
    monkeypatch.setattr(engine_module, "this_host", lambda: f"{host} pid:?")  # no /proc: never known gone
    assert not gone(f"{host} pid:?:{dead.pid}:{token}")
    monkeypatch.undo()
    site = Site(f"sqlite:///{tmp_path / 'v.db'}", tmp_path)
    first = site.engine()
    assert first.start()
    # an engine of another container on the same host name, with the same pid, does not take the lease
    monkeypatch.setattr(engine_module, "this_host", lambda: f"{host} pid:[1]")
    twin = site.engine()
    assert twin.owner != first.owner and twin.owner.rsplit(":", 2)[1] == str(os.getpid())
    assert not twin.start(wait=False) and twin.standing_by == first.owner
    first.release()
    assert twin.start(wait=False)
    twin.release()
    site.store.close()


@pytest.mark.slow
def test_a_stopped_engine_gives_its_lease_up_at_once_a_killed_one_is_waited_out(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another host's engine takes over from `vigil engine` stopped by SIGTERM at once - the stop gives the lease up -
    and from one killed (SIGKILL) only once its lease (here 30 s) lapses: a process of another host is never known to
    have ended."""
    site = Site(db_url, tmp_path / "site")
    env = {**os.environ, "VIGIL_HOME": str(tmp_path / "home"), "VIGIL_DB_URL": db_url,
           "VIGIL_ENGINE_INTERVAL_S": "0.2", "VIGIL_REMEDY_LEASE_S": "30", "VIGIL_RESOLVE_AFTER_S": "3600",
           "PYTHONPATH": str(REPO)}
    # the taker runs on another host: it cannot see the engine's process end
    monkeypatch.setattr(engine_module, "this_host", lambda: OTHER_HOST.rsplit(":", 2)[0])
    other = site.engine()
    assert other.owner.startswith("other-host pid:[4026531836]:")

    def held_by(engine: EngineProcess) -> bool:
        held = site.store.lease_holder(LEASE)
        return held is not None and held[0].rsplit(":", 2)[:2] == [this_host(), str(engine.process.pid)] and (
            int(site.store.cursor(CURSOR)[1].get("ticks", 0)) >= 2)

    for sent in (signal.SIGTERM, signal.SIGKILL):
        engine = EngineProcess(env)
        try:
            wait_for(lambda engine=engine: held_by(engine), 120, "`vigil engine` to take the lease and tick")
            assert not other.start(wait=False)
            engine.process.send_signal(sent)
            returncode = engine.process.wait(60)
        finally:
            engine.end()
        stopped = time.time()
        taken = other.start(wait=False)
        holder = site.store.lease_holder(LEASE)
        assert holder is not None
        if sent == signal.SIGTERM:
            assert returncode == 0, engine.lines
            assert taken and holder[0] == other.owner, engine.lines
            other.release()
        else:
            # the lease still runs for most of its 30 s: the other host waits it out
            assert not taken and holder[1] > stopped + 10, holder
    site.store.close()


def test_a_diagnosis_waiting_on_a_slow_llm_endpoint_is_no_hung_loop(tmp_path: Path) -> None:
    """One incident's diagnosis waits on the LLM endpoint up to two completions of three attempts each at
    llm_timeout_s (and the backoffs): 363 s at llm_timeout_s 60, past the default engine_step_max_s (300 s). The bound
    past which the loop is taken for hung covers it, so a healthy engine diagnosing against a slow endpoint keeps its
    lease; a loop silent past it still lets the lease lapse. Before, the bound was 305 s whatever the LLM's timeout."""
    site = Site(f"sqlite:///{tmp_path}/vigil.db", tmp_path)
    settings = Settings(home=site.settings.home, db_url=site.settings.db_url, llm_base_url="http://127.0.0.1:9/v1",
                        llm_timeout_s=60.0, engine_interval_s=5.0, engine_step_max_s=300.0)
    engine = Engine(site.store, settings, notifiers=[], clock=site.clock)
    assert engine.llm is not None
    waited = 2 * (3 * 60.0 + 0.5 + 1.0)  # diagnosis_wait_s: 363 s
    engine._beat = time.monotonic() - 5.0 - waited + 1.0  # a round's wait, then one diagnosis waiting out its endpoint
    assert not engine._stuck()
    engine._beat = time.monotonic() - 5.0 - waited - 1.0
    assert engine._stuck()
    # without an endpoint the bound is the setting's
    plain = Engine(site.store, site.settings.model_copy(update={"engine_interval_s": 5.0, "engine_step_max_s": 300.0}),
                   notifiers=[], clock=site.clock)
    assert plain.llm is None and plain.stuck_after_s == 305.0
    site.store.close()


def test_a_frozen_engine_is_waited_out_for_its_lease_only_then_stops_on_waking(db_url: str, tmp_path: Path) -> None:
    """`vigil engine` frozen whole (SIGSTOP: its renewing thread frozen too, so no hang is seen) holds the store no
    longer than its lease (here 10 s) after its last renewal - not engine_interval_s + engine_step_max_s (300 s
    here), the bound of a hung loop whose renewing thread lives. A process that is stopped has not ended: the
    standby waits the lease out. Woken (SIGCONT), the engine finds the lease taken and stops, exit 1."""
    site = Site(db_url, tmp_path / "site")
    lease_s = 10.0
    env = {**os.environ, "VIGIL_HOME": str(tmp_path / "home"), "VIGIL_DB_URL": db_url,
           "VIGIL_ENGINE_INTERVAL_S": "0.2", "VIGIL_REMEDY_LEASE_S": str(lease_s), "VIGIL_REMEDY_LEASE_RENEW_S": "3",
           "VIGIL_ENGINE_STEP_MAX_S": "300", "VIGIL_RESOLVE_AFTER_S": "3600", "PYTHONPATH": str(REPO)}
    other = site.engine()
    engine = EngineProcess(env)
    try:
        def held() -> bool:
            holder = site.store.lease_holder(LEASE)
            return holder is not None and holder[0].rsplit(":", 2)[1] == str(engine.process.pid) and (
                int(site.store.cursor(CURSOR)[1].get("ticks", 0)) >= 2)

        wait_for(held, 120, "`vigil engine` to take the lease and tick")
        engine.process.send_signal(signal.SIGSTOP)
        frozen = time.time()
        holder = site.store.lease_holder(LEASE)
        assert holder is not None and holder[1] <= frozen + lease_s, holder  # renewed no more from here
        wait_for(lambda: other.start(wait=False), 120, "the standby to take the lapsed lease")
        taken = time.time()
        assert holder[1] <= taken, (holder, taken)  # not before the frozen engine's lease lapsed
        assert site.store.lease_holder(LEASE)[0] == other.owner  # type: ignore[index]
        engine.process.send_signal(signal.SIGCONT)
        assert engine.process.wait(60) == 1, engine.lines
        assert any("this engine stops" in line for line in engine.lines), engine.lines
        assert site.store.lease_holder(LEASE)[0] == other.owner  # type: ignore[index]
    finally:
        engine.process.send_signal(signal.SIGCONT)
        engine.end()
        other.release()
        site.store.close()
