"""A transaction left open on the engine's PostgreSQL server - in another database, by another application, writing
nothing of Vigil's - does not hold the engine's judging back: a row committed after it began is judged by the next
tick (vigil.run.engine._take), once, also after that transaction ends and after a restart; only past a bound of rows
so judged (AHEAD_EVENTS, AHEAD_PUSHES) do further ones wait for it, as before. On SQLite nothing is held back."""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa

from tests.run.engine_site import Site
from tests.serve.conftest import _postgres_bin, fresh_database, running_postgres
from tests.serve.conftest import postgres_url as postgres_url
from vigil.run import engine as engine_module
from vigil.run.engine import CURSOR, Engine, _take
from vigil.store import schema as t
from vigil.store import sql as sql_module
from vigil.store.sql import ReadPosition, Store


@contextmanager
def unrelated_writer(server_url: str) -> Iterator[psycopg.Connection]:
    """Another application's transaction on the same PostgreSQL server, in its maintenance database (not Vigil's),
    that has written (a temporary table of its own: it holds a transaction id) and is left open until the block
    ends, then commits."""
    conn = psycopg.connect(server_url.replace("postgresql+psycopg://", "postgresql://"), autocommit=False)
    try:
        conn.execute("SET application_name = 'nightly-batch'")
        conn.execute("CREATE TEMPORARY TABLE batch_rows (n int)")
        conn.execute("INSERT INTO batch_rows VALUES (1)")
        assert conn.execute("SELECT pg_current_xact_id_if_assigned() IS NOT NULL").fetchone() == (True,)
        yield conn
        conn.commit()
    finally:
        conn.close()


def judged(site: Site) -> tuple[dict[str, list[str]], int, int]:
    """The incidents by scope, and how many anomalies and actions the store holds."""
    incidents = {i.scope: i.fault_types for i in site.store.incidents()}
    return incidents, len(site.store.anomalies(limit=100_000)), len(site.store.actions(limit=100_000))


@pytest.fixture
def server_url(postgres_url: str) -> str:
    """The session's PostgreSQL server, whose maintenance database the unrelated writer uses."""
    return postgres_url


@pytest.fixture
def site(postgres_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Site]:
    """PostgreSQL only: SQLite's writers take turns, so nothing is held back there (tests/run/test_read_order.py)."""
    site = Site(fresh_database(postgres_url, f"ahead_{request.node.name[:40].lower()}"), tmp_path)
    yield site
    site.store.close()


def test_an_unrelated_open_transaction_does_not_hold_judging_back(site: Site, server_url: str) -> None:
    """An unrelated transaction in another database stays open; an Xid stored after it began is judged by the very
    next tick, though the durable read position stays behind it. Once it commits, the tick reads the Xid again as
    settled and judges nothing twice; an engine restarted from the stored cursor neither."""
    engine = site.engine()
    engine.tick()
    with unrelated_writer(server_url):
        site.store.add_events([site.xid("n01", 1)])
        # what the position alone would read (revision 0011): nothing, held back by the unrelated transaction
        assert site.store.events_after(engine.event_cursor) == []
        first = engine.tick()
        assert first.events == 1
        after_first = judged(site)
        assert after_first[0] == {"gpu/n01/1": ["gpu_lost"]}
        assert engine.status()["read_ahead"] == {"events": 1, "pushes": 0, "full": False}
        held_position = engine.event_cursor
        # a restart while it is still open: the remembered event is not judged again
        engine = site.engine()
        assert engine.tick().events == 0 and engine.event_cursor == held_position
        site.store.add_events([site.xid("n02", 2)])
        assert engine.tick().events == 1
        assert engine.status()["read_ahead"]["events"] == 2
    during = judged(site)
    assert set(during[0]) == {"gpu/n01/1", "gpu/n02/2"}
    # the unrelated transaction has committed: both rows settle, neither is judged again
    assert engine.tick().events == 0
    assert engine.event_cursor > held_position and engine.status()["read_ahead"]["events"] == 0
    assert judged(site) == during
    restarted = site.engine()
    assert restarted.tick().events == 0 and restarted.tick().events == 0
    assert judged(site) == during


def test_a_push_committed_past_an_open_transaction_is_read_at_once(site: Site, server_url: str) -> None:
    """A node's push stored while an unrelated transaction is open reaches the live view at the next tick, is not
    applied again once that transaction ends, and is kept (not pruned) until the read position passes it."""
    engine = site.engine()
    engine.tick()
    with unrelated_writer(server_url):
        site.store.add_samples("n01", site.samples("n01"))
        first = engine.tick()
        assert first.pushes == 1 and engine.frames.newest("n01") == site.clock.now
        assert engine.status()["read_ahead"]["pushes"] == 1
    second = engine.tick()
    assert (second.pushes, second.late) == (0, 0) and engine.status()["read_ahead"]["pushes"] == 0
    assert engine.push_cursor.id > 0 and len(site.store.pushes_after(0)) == 1


def test_past_the_bound_rows_wait_for_the_open_transaction(site: Site, server_url: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """With room for one event read ahead, the second stored behind the open transaction waits for it (the
    behaviour of revision 0011), and is judged once, with the first not judged again, once it ends."""
    monkeypatch.setattr(engine_module, "AHEAD_EVENTS", 1)
    engine: Engine = site.engine()
    engine.tick()
    with unrelated_writer(server_url):
        site.store.add_events([site.xid("n01", 1)])
        site.store.add_events([site.xid("n02", 2)])
        first = engine.tick()
        assert first.events == 1 and engine.status()["read_ahead"] == {"events": 1, "pushes": 0, "full": True}
        assert set(judged(site)[0]) == {"gpu/n01/1"}
        assert engine.tick().events == 0
    assert engine.tick().events == 1
    assert engine.status()["read_ahead"] == {"events": 0, "pushes": 0, "full": False}
    assert set(judged(site)[0]) == {"gpu/n01/1", "gpu/n02/2"}
    assert engine.tick().events == 0


def test_a_tick_that_fails_leaves_its_rows_read_ahead_to_the_next(site: Site, server_url: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A tick that fails after reading an event committed past the open transaction remembers nothing of it: the
    next tick judges it."""
    engine = site.engine()
    engine.tick()
    with unrelated_writer(server_url):
        site.store.add_events([site.xid("n01", 1)])
        with monkeypatch.context() as patched:
            def down(*_args: object) -> None:
                raise RuntimeError("store down")
            patched.setattr(engine, "_detect", down)
            with pytest.raises(RuntimeError, match="store down"):
                engine.tick()
        assert engine.status()["read_ahead"]["events"] == 0
        assert engine.tick().events == 1
        assert set(judged(site)[0]) == {"gpu/n01/1"}


def test_a_read_position_saved_on_another_server_reads_on_after_the_move(site: Site,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    """The store moved to another PostgreSQL server (pg_dump/pg_restore): its rows and the engine's saved position
    hold the old server's xids, far past this server's counter, so every row written here sorts before the position.
    The engine started on it renumbers once: the event stored here is judged at the first tick, the one stored but
    not read before the move too, the one read before it not again, nor anything after a restart."""
    engine = site.engine()
    site.store.add_events([site.xid("n01", 1)])
    assert engine.tick().events == 1
    site.store.add_events([site.xid("n02", 2)])  # stored, not read before the move
    before = judged(site)
    # the state a restore leaves: rows and position as the old server numbered them, a billion transactions on
    old = 10**9
    with site.store.engine.begin() as conn:
        conn.execute(sa.update(t.events).values(xid=t.events.c.xid + old))
        conn.execute(sa.update(t.metric_pushes).values(xid=t.metric_pushes.c.xid + old))
    position, state = site.store.cursor(CURSOR)
    site.store.set_cursor(CURSOR, position, {**state, "events_xid": int(state["events_xid"]) + old,
                                             "pushes_xid": int(state["pushes_xid"]) + old})
    moved = site.engine()
    site.store.add_events([site.xid("n01", 3)])  # written on the new server, before the engine started
    with caplog.at_level(logging.WARNING, logger="vigil.engine"):
        first = moved.tick()
    assert first.events == 2
    assert judged(site)[1] == before[1] + 2  # an anomaly each, the one read before the move none again
    assert "store was moved from another server" in caplog.text
    assert moved.event_cursor.xid < old and moved.status()["read_ahead"]["events"] == 0
    site.store.add_events([site.xid("n02", 3)])
    assert moved.tick().events == 1 and moved.tick().events == 0 and judged(site)[1] == before[1] + 3
    after = judged(site)
    restarted = site.engine()
    assert restarted.tick().events == 0 and judged(site) == after
    assert restarted.event_cursor == moved.event_cursor


def test_a_read_full_of_remembered_rows_still_watches_what_holds_them(site: Site, server_url: str) -> None:
    """With a batch of two and two rows judged ahead of an open transaction, the next read returns those two alone:
    it is no full read, and the transaction holding them is watched (warned of after HELD_BACK_WARN_S)."""
    engine = site.engine()
    engine.batch = 2
    engine.tick()
    with unrelated_writer(server_url):
        site.store.add_events([site.xid("n01", 1), site.xid("n02", 2)])
        assert engine.tick().events == 2
        assert engine.tick().events == 0
        assert engine.held_since is not None


def test_remembered_rows_the_read_passes_take_no_room_under_the_bound() -> None:
    """The bound counts the rows remembered past the position the call returns: one remembered row that settles in
    this read leaves room for a new one committed past another open transaction."""
    ahead = {ReadPosition(5, 1)}
    rows = [(ReadPosition(5, 1), "settled now", True), (ReadPosition(9, 2), "new", False)]
    taken, cursor, full = _take(rows, ReadPosition(0, 0), ahead, bound=1)
    assert (taken, cursor, full, ahead) == (["new"], ReadPosition(5, 1), False, {ReadPosition(9, 2)})


def test_rows_remembered_are_not_read_again_while_the_transaction_stays_open(site: Site, server_url: str) -> None:
    """A tick reads the rows it judged ahead of an open transaction no more while they wait (each re-read in full
    cost 0.44 s a tick with 6,000 pushes); once the transaction ends they are read, settled, and passed."""
    engine = site.engine()
    engine.tick()
    with unrelated_writer(server_url):
        site.store.add_events([site.xid("n01", 1), site.xid("n02", 2)])
        site.store.add_samples("n01", site.samples("n01"))
        assert (engine.tick().events, engine.last_tick and engine.last_tick.pushes) == (2, 1)
        assert len(site.store.events_read(engine.event_cursor)) == 2
        assert site.store.events_read(engine.event_cursor, skip=engine.ahead_events) == []
        assert site.store.pushes_read(engine.push_cursor, skip=engine.ahead_pushes) == []
        assert site.store.events_read(engine.event_cursor, settled_only=True) == []
        site.store.add_events([site.xid("n01", 3)])
        assert [e.entity for _, e, _ in site.store.events_read(engine.event_cursor, skip=engine.ahead_events)] == [
            "gpu/n01/3"]
        assert engine.tick().events == 1
    assert [s for _, _, s in site.store.events_read(engine.event_cursor, skip=engine.ahead_events)] == [True] * 3
    assert engine.tick().events == 0 and engine.status()["read_ahead"] == {"events": 0, "pushes": 0, "full": False}


def test_an_event_judged_ahead_before_a_move_is_not_judged_again_after_it(site: Site, server_url: str) -> None:
    """An event judged ahead of an open transaction (remembered in the cursor) and the store then moved to another
    server before the position passed it: after the renumbering it is still remembered, not judged again."""
    engine = site.engine()
    engine.tick()
    with unrelated_writer(server_url):
        site.store.add_events([site.xid("n01", 1)])
        assert engine.tick().events == 1 and engine.status()["read_ahead"]["events"] == 1
    before = judged(site)
    old = 10**9
    with site.store.engine.begin() as conn:
        conn.execute(sa.update(t.events).values(xid=t.events.c.xid + old))
    position, state = site.store.cursor(CURSOR)
    site.store.set_cursor(CURSOR, position, {**state, "events_xid": int(state["events_xid"]) + old,
                                             "events_ahead": [[x + old, i] for x, i in state["events_ahead"]]})
    moved = site.engine()
    assert moved.tick().events == 0 and judged(site) == before
    assert moved.status()["read_ahead"]["events"] == 0 and moved.event_cursor.xid < old
    site.store.add_events([site.xid("n02", 2)])
    assert moved.tick().events == 1 and judged(site)[1] == before[1] + 1


def _burn_xids(server_url: str, past: int) -> None:
    """Transactions on the server until its next xid is past ``past``: a busy server's counter, far ahead of a new
    one's."""
    with psycopg.connect(server_url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
        while int(conn.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()[0]) <= past:
            pass


def _next_xid(url: str) -> int:
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
        return int(conn.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint").fetchone()[0])


def test_a_store_moved_under_a_running_engine_is_placed_at_the_next_tick(
        site: Site, server_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """The store dumped (pg_dump), restored on another PostgreSQL server whose counter runs far lower and the
    running engine's store switched to it (a failover, its URL or proxy pointing at the new server): the next tick
    notices, renumbers in one line of log, and reads on - the event read before the move is not judged again, the
    one stored but not read before it is judged once, as is one written on the new server; one remembered ahead of
    an open transaction on the old server is not judged again. Before, the engine read nothing more, for good."""
    with running_postgres() as (new_server, _base):
        _burn_xids(server_url, _next_xid(new_server) + 5_000)
        engine = site.engine()
        site.store.add_events([site.xid("n01", 1)])
        assert engine.tick().events == 1
        with unrelated_writer(server_url):
            site.store.add_events([site.xid("n01", 2)])  # judged ahead of the open transaction, remembered
            assert engine.tick().events == 1 and engine.status()["read_ahead"]["events"] == 1
            site.store.add_events([site.xid("n02", 1)])  # stored, not read before the move
            dump = subprocess.run([_postgres_bin("pg_dump"), "--no-owner", "-d",
                                   site.store.url.replace("postgresql+psycopg://", "postgresql://")],
                                  check=True, capture_output=True).stdout
        before = judged(site)
        old_xid = engine.event_cursor.xid
        moved_url = fresh_database(new_server, "moved")
        subprocess.run([_postgres_bin("psql"), "--single-transaction", "-v", "ON_ERROR_STOP=1", "-q", "-d",
                        moved_url.replace("postgresql+psycopg://", "postgresql://")], input=dump, check=True,
                       capture_output=True)
        assert old_xid >= _next_xid(new_server)  # the move the engine has to notice
        site.store.close()
        site.store = engine.store = Store(moved_url)
        site.store.add_events([site.xid("n02", 2)])  # written on the new server
        with caplog.at_level(logging.WARNING, logger="vigil.engine"):
            first = engine.tick()
        moved_lines = [r for r in caplog.records if "store was moved" in r.getMessage()]
        assert len(moved_lines) == 1 and "while the engine ran" in moved_lines[0].getMessage()
        assert first.events == 2 and engine.event_cursor.xid < old_xid
        assert judged(site)[1] == before[1] + 2  # one anomaly each for the two not judged before; none again
        assert engine.tick().events == 0
        site.store.add_events([site.xid("n02", 3)])
        assert engine.tick().events == 1 and judged(site)[1] == before[1] + 3
        after = judged(site)
        restarted = site.engine()
        assert restarted.tick().events == 0 and judged(site) == after
        site.store.close()


def test_the_push_bound_follows_the_load_or_the_setting(site: Site) -> None:
    """5,000 pushes remembered fill in about a minute at 1,000 nodes pushing every 15 s: the bound is 40 a node
    pushing (10 minutes of their pushes), at least 5,000, unless engine_read_ahead_pushes sets it."""
    engine = site.engine()
    assert engine.ahead_push_bound() == 5_000
    engine.push_offsets = {f"n{k:04d}": 0.0 for k in range(1_000)}
    assert engine.ahead_push_bound() == 40_000
    assert engine.status()["read_ahead_bound"] == {"events": 1_000, "pushes": 40_000}
    site.settings = site.settings.model_copy(update={"engine_read_ahead_pushes": 7})
    assert site.engine().ahead_push_bound() == 7


def test_past_the_push_bound_the_log_says_what_waits_and_what_it_costs(site: Site, server_url: str,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    """With room for one push remembered, the second committed behind an open transaction waits for it: the warning
    names the bound, the setting to raise, and the cost - judged late, read again by a restart meanwhile - and the
    push is judged once, at the tick after the transaction ends."""
    site.settings = site.settings.model_copy(update={"engine_read_ahead_pushes": 1})
    engine = site.engine()
    engine.tick()
    with unrelated_writer(server_url), caplog.at_level(logging.WARNING, logger="vigil.engine"):
        site.store.add_samples("n01", site.samples("n01"))
        site.store.add_samples("n02", site.samples("n02"))
        assert engine.tick().pushes == 1
        assert engine.status()["read_ahead"] == {"events": 0, "pushes": 1, "full": True}
        assert engine.tick().pushes == 0
    message = " ".join(r.getMessage() for r in caplog.records if "bound is reached" in r.getMessage())
    assert "1 metric pushes (of 1)" in message and "judged late" in message
    assert "reads those pushes again" in message and "engine_read_ahead_pushes" in message
    assert engine.tick().pushes == 1 and engine.tick().pushes == 0
    assert engine.status()["read_ahead"] == {"events": 0, "pushes": 0, "full": False}


def _restored(site: Site, old: int) -> ReadPosition:
    """Six events as a restore from a busy server leaves them - xids a billion on, the fourth (id 4) committed
    last, after the fifth and sixth - and the position past the first three and the fifth: read order (xid, id)
    puts the fourth after it although its id is lower."""
    for gpu in range(6):
        site.store.add_events([site.xid(("n01", "n02")[gpu % 2], gpu % 4)])
    with site.store.engine.begin() as conn:
        found = sorted(conn.execute(sa.select(t.events.c.id)).scalars())
        for k, row_id in enumerate(found):
            conn.execute(sa.update(t.events).where(t.events.c.id == row_id)
                         .values(xid=old + (50 if k == 3 else 10 * k)))
    return ReadPosition(old + 40, found[4])


def _xids(site: Site) -> list[tuple[int, int]]:
    with site.store.engine.connect() as conn:
        return [(int(r.id), int(r.xid)) for r in conn.execute(sa.select(t.events.c.id, t.events.c.xid)
                                                             .order_by(t.events.c.id))]


def test_a_renumbering_cut_short_is_finished_by_the_next(site: Site, monkeypatch: pytest.MonkeyPatch) -> None:
    """The renumbering goes a few ids a transaction; one cut short after its first (the engine killed) leaves its
    rows renumbered and the rest as restored, and the next - from the position still saved - renumbers the rest
    alike: the rows read xid 0, the fourth (unread, though its id is below the position's) xid 1, none read twice
    or skipped."""
    position = _restored(site, 10**9)
    monkeypatch.setattr(sql_module, "RENUMBER_BATCH", 2)
    spans = 0
    whole = sql_module.Store._renumber_span

    def cut(self: Store, *args: object) -> None:
        nonlocal spans
        spans += 1
        if spans == 2:
            raise RuntimeError("killed")
        whole(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(sql_module.Store, "_renumber_span", cut)
    with pytest.raises(RuntimeError, match="killed"):
        site.store.renumber_moved("events", position)
    ids = [i for i, _ in _xids(site)]
    assert [x for _, x in _xids(site)][:2] == [0, 0] and all(x > 10**9 for _, x in _xids(site)[2:])
    monkeypatch.setattr(sql_module.Store, "_renumber_span", whole)
    moved = site.store.renumber_moved("events", position)
    assert moved is not None and moved[0] == ReadPosition(0, ids[4])
    assert _xids(site) == [(ids[0], 0), (ids[1], 0), (ids[2], 0), (ids[3], 1), (ids[4], 0), (ids[5], 1)]
    assert [e for _, e, _ in site.store.events_read(moved[0])] and len(site.store.events_read(moved[0])) == 2


def test_a_row_deleted_while_the_store_is_renumbered_fails_nothing(site: Site, server_url: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Retention deleting a row the renumbering has not reached yet: in one REPEATABLE READ transaction that failed
    the whole renumbering (a serialization failure, 33-50 s lost at 1,000,000 rows); a transaction a span, it goes
    on and renumbers the rest."""
    position = _restored(site, 10**9)
    ids = [i for i, _ in _xids(site)]
    monkeypatch.setattr(sql_module, "RENUMBER_BATCH", 2)
    whole = sql_module.Store._renumber_span
    spans = 0

    def retention_meanwhile(self: Store, *args: object) -> None:
        nonlocal spans
        whole(self, *args)  # type: ignore[arg-type]
        spans += 1
        if spans == 1:
            with psycopg.connect(site.store.url.replace("postgresql+psycopg://", "postgresql://"),
                                 autocommit=True) as other:
                other.execute("DELETE FROM events WHERE id = %s", (ids[5],))

    monkeypatch.setattr(sql_module.Store, "_renumber_span", retention_meanwhile)
    moved = site.store.renumber_moved("events", position)
    assert moved is not None and moved[0] == ReadPosition(0, ids[4])
    assert _xids(site) == [(ids[0], 0), (ids[1], 0), (ids[2], 0), (ids[3], 1), (ids[4], 0)]


def test_a_long_renumbering_marks_the_loops_progress_after_every_span(site: Site,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Renumbering a moved store goes a span of ids a transaction (~47 s a table at 1,000,000 events): the engine's
    loop marks its progress after every span, so that its renewing thread, which renews the lease only while the loop
    moved within engine_interval_s + engine_step_max_s, does not take a big table's renumbering (past 6,000,000
    events at that rate) for a hung loop and let a healthy engine's lease lapse. Before, one mark covered a whole
    table: every span saw the same mark."""
    position = _restored(site, 10**9)
    _, state = site.store.cursor(CURSOR)
    site.store.set_cursor(CURSOR, float(position.id), {**state, "events": position.id, "events_xid": position.xid})
    monkeypatch.setattr(sql_module, "RENUMBER_BATCH", 2)
    engine = site.engine()
    whole = sql_module.Store._renumber_span
    marks: list[float] = []

    def span(self: Store, *args: object) -> None:
        marks.append(engine._beat)
        whole(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(sql_module.Store, "_renumber_span", span)
    assert engine.tick().events == 2  # the fourth and sixth, unread before the move
    assert len(marks) >= 3 and len(set(marks)) == len(marks), marks
