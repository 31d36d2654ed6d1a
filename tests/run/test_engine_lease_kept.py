"""The store's engine lease (vigil.run.engine.LEASE) on SQLite and PostgreSQL: held through a start-up or a tick longer
than the lease while the process lives, taken back by a lone engine whose lease lapsed with no other engine about,
and, in `vigil serve`, lost to another engine and taken over again once that one's lapses - the server's engine stands
by instead of ending."""

from __future__ import annotations

import gc
import os
import threading
import time
from pathlib import Path

from tests.conftest import wait_for
from tests.run.engine_site import Site
from tests.serve.conftest import fresh_database, start_server
from tests.serve.conftest import postgres_url as postgres_url
from tests.store.conftest import db_url as db_url
from vigil.config import Settings
from vigil.remedy.commands import this_host
from vigil.run.engine import CURSOR, LEASE

# short, so that a test waits a few seconds at most for renewals and lapses
LEASE_S = 1.5


def short_lease(site: Site) -> None:
    site.settings = Settings(home=site.settings.home, db_url=site.settings.db_url, resolve_after_s=120.0,
                             remedy_lease_s=LEASE_S, remedy_lease_renew_s=LEASE_S / 3)


def test_a_tick_longer_than_the_lease_keeps_it(db_url: str, tmp_path: Path) -> None:
    """An engine that took the lease and then did not tick for longer than the lease (a start-up renumbering a moved
    store, ~47 s at 1,000,000 events; a long tick) still holds it: another host's engine stands by, and the first ticks
    on. Before, the lease was renewed only by a tick, lapsed, and the other engine took over mid-start-up."""
    site = Site(db_url, tmp_path)
    short_lease(site)
    active = site.engine()
    assert active.start()
    holder = site.store.lease_holder(LEASE)
    assert holder is not None and holder[0] == active.owner
    first_lapse = holder[1]

    def renewed_past_lapse() -> bool:
        now = site.store.lease_holder(LEASE)
        return now is not None and now[1] > first_lapse + LEASE_S and time.time() > first_lapse

    wait_for(renewed_past_lapse, 30, "the lease renewed past its first lapse without a tick")
    other = site.engine()
    other.owner = "other-host:1"
    assert not other.start(wait=False) and other.standing_by == active.owner
    site.store.add_events([site.xid("n01", 1)])
    assert active.tick().events == 1
    assert site.store.lease_holder(LEASE)[0] == active.owner  # type: ignore[index]
    active.release()
    assert other.start(wait=False) and other.standing_by is None
    other.release()
    site.store.close()


def test_a_lone_engine_whose_lease_lapsed_takes_it_back(db_url: str, tmp_path: Path) -> None:
    """No other engine about, a lease that lapsed (the store out of reach longer than it) is renewed by the next tick,
    not lost: the engine judges on and saves its cursor."""
    site = Site(db_url, tmp_path)
    active = site.engine()
    assert active.start()
    active._stop_keeping()
    _, state = site.store.cursor(LEASE)
    site.store.set_cursor(LEASE, time.time() - 60, state)  # lapsed a minute ago, still this engine's
    site.store.add_events([site.xid("n01", 1)])
    assert active.tick().events == 1
    owner, lapses = site.store.lease_holder(LEASE)  # type: ignore[misc]
    assert owner == active.owner and lapses > time.time()
    assert site.store.cursor(CURSOR)[1]["events"] == active.event_cursor.id
    site.store.close()


def test_the_engine_of_vigil_serve_stands_by_after_losing_its_lease_and_takes_over_again(
        db_url: str, tmp_path: Path) -> None:
    """`vigil serve` (a real process) judges the store; another host's engine takes its lease (as after a stall past
    it): the server's engine stops judging and stands by, an event stored meanwhile is not judged by it; the other's
    lease given up, the server's engine takes over again, reads on from the cursor and judges that event. Before, its
    engine thread ended on the loss and the server ran without one until restarted: the event was never judged."""
    site = Site(db_url, tmp_path / "site")
    home = tmp_path / "home"
    env = {**os.environ, "VIGIL_HOME": str(home), "VIGIL_DB_URL": db_url, "VIGIL_ENGINE_INTERVAL_S": "0.2",
           "VIGIL_REMEDY_LEASE_S": "30", "VIGIL_RESOLVE_AFTER_S": "3600", "PYTHONPATH": str(Path.cwd())}
    server = start_server(home, env)
    log = home / "serve.log"
    try:
        def holder() -> str:
            held = site.store.lease_holder(LEASE)
            return held[0] if held else ""

        def the_server() -> bool:  # the owner: host and pid namespace, pid, token
            return holder().rsplit(":", 2)[:2] == [this_host(), str(server.pid)]

        wait_for(the_server, 60, "the server's engine to take the lease")
        wait_for(lambda: int(site.store.cursor(CURSOR)[1].get("ticks", 0)) >= 2, 60, "the server's engine to tick")
        other = site.engine()
        other.owner = "other-host:1"
        # taken over as after the server's engine stalled past it (written at once: a compare-and-set of a lapse would
        # race the server's renewals)
        site.store.set_cursor(LEASE, time.time() + 30, {"owner": other.owner})
        assert other.start(wait=False)
        wait_for(lambda: "standing by: engine other-host:1" in log.read_text(), 60,
                 "the server's engine to stand by again")
        assert "this engine stops judging and stands by again" in log.read_text()
        assert server.poll() is None, log.read_text()
        site.store.add_events([site.xid("n01", 1)])
        assert other.tick().events == 1
        other.release()  # given up: the server's engine takes over at its next try
        wait_for(the_server, 60, "the server's engine to take the lease again")
        site.store.add_events([site.xid("n02", 2)])
        wait_for(lambda: any(a.entity == "gpu/n02/2" for a in site.store.anomalies()), 60,
                 "the n02 Xid judged by the server's engine")
        assert sorted(a.entity for a in site.store.anomalies()) == ["gpu/n01/1", "gpu/n02/2"]
        assert "taking over from engine other-host:1" in log.read_text()
    finally:
        server.terminate()
        server.wait(60)
    assert server.returncode == 0, log.read_text()
    site.store.close()


def test_the_lease_keeper_ends_with_its_engine_or_store(tmp_path: Path) -> None:
    """An engine never released (dropped, or its store closed) leaves no thread renewing its lease - and holding a
    connection - for the rest of the process."""
    site = Site(f"sqlite:///{tmp_path / 'v.db'}", tmp_path)
    short_lease(site)
    dropped = site.engine()
    assert dropped.start()
    keeper = dropped._keeper
    assert keeper is not None and keeper.is_alive()
    del dropped
    gc.collect()
    keeper.join(30)
    assert not keeper.is_alive()
    kept = site.engine()
    assert kept.start()
    keeper = kept._keeper
    assert keeper is not None and keeper.is_alive()
    site.store.close()
    keeper.join(30)
    assert not keeper.is_alive()


def client_connections(postgres_url: str, database: str) -> int:
    """How many client connections the session's PostgreSQL server holds to ``database`` (counted from another)."""
    import psycopg

    with psycopg.connect(postgres_url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND backend_type = "
                           "'client backend'", (database,)).fetchone()
    return int(row[0]) if row else 0


def test_a_closed_engine_leaves_no_lease_thread_or_connection_behind(postgres_url: str, tmp_path: Path) -> None:
    """An engine renewing its lease on PostgreSQL renews it through its store's pool (no connection of its own); once
    closed (``with``), its renewing thread has ended, its lease is given up and no connection is checked out of that
    pool - and the store closed, none to the database is left on the server. Before, an engine had no close, and one
    left running renewed on a thread of its own until collected; the suite's tests that left theirs reached 78 client
    connections on one server."""
    database = "closed_engine"
    site = Site(fresh_database(postgres_url, database), tmp_path)
    short_lease(site)
    pool = site.store.engine.pool
    with site.engine() as engine:
        assert engine.start()
        keeper = engine._keeper
        assert keeper is not None and keeper.is_alive()
        holder = site.store.lease_holder(LEASE)
        assert holder is not None and holder[0] == engine.owner
        wait_for(lambda: site.store.lease_holder(LEASE)[1] > holder[1], 30,  # type: ignore[index]
                 "the renewing thread to renew the lease")
        # every connection to the database is one of the store's pool: the renewing thread holds none of its own
        assert client_connections(postgres_url, database) == pool.checkedin() + pool.checkedout()
    assert not keeper.is_alive()
    assert not [t for t in threading.enumerate() if t.name == "vigil-engine-lease"]
    assert pool.checkedout() == 0
    assert site.store.lease_holder(LEASE) == (engine.owner, 0.0)  # given up: a standby takes it at once
    site.store.close()
    wait_for(lambda: client_connections(postgres_url, database) == 0, 30,
             "the closed store's connections to end on the server")
