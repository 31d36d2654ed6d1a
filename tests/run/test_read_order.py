"""The engine reads every event and metric push once, whatever order their writers commit in, on SQLite and the
suite's PostgreSQL. On PostgreSQL a row's id is drawn when it is inserted, and transactions commit in any order: a
writer holding id 10 open while another commits id 11 must not have its row skipped by a reader that has passed
11. On PostgreSQL the read position passes a row once its transaction and every older one have ended
(vigil.store.sql.ReadPosition), while the later writer's committed row is judged at once and remembered
(tests/run/test_read_ahead.py): the tick after the open one commits judges its row, and not the later one again.
On SQLite writers take turns (the engine's own writes wait for an open writer), so there the first writer writes
after the tick, a higher id: read once all the same."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.run.engine_site import Site
from tests.serve.conftest import postgres_url as postgres_url
from tests.store.conftest import db_url as db_url
from tests.store.conftest import on_postgresql
from vigil.model import Event, Sample
from vigil.run.engine import HELD_BACK_WARN_S
from vigil.store import schema as t
from vigil.store.sql import Store


@pytest.fixture
def site(db_url: str, tmp_path: Path) -> Iterator[Site]:
    site = Site(db_url, tmp_path)
    yield site
    site.store.close()


def event_row(event: Event) -> dict[str, object]:
    return {"ts": event.ts, "entity": event.entity, "kind": event.kind, "source": event.source,
            "level": int(event.level), "message": event.message, "attrs": event.attrs}


def push_row(node: str, samples: list[Sample]) -> dict[str, object]:
    return {"ts": max(s.ts for s in samples), "node": node, "points": [[s.metric, s.entity, s.value] for s in samples]}


def ids(store: Store, table: sa.Table) -> list[int]:
    with store.engine.connect() as conn:
        return [int(i) for i in conn.execute(sa.select(table.c.id).order_by(table.c.id)).scalars()]


def event_id(store: Store, entity: str) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(sa.select(t.events.c.id).where(t.events.c.entity == entity)).scalar_one())


@pytest.mark.parametrize("restart", [False, True], ids=["same-engine", "restarted"])
def test_an_xid_committed_after_a_later_one_is_judged_once(site: Site, restart: bool) -> None:
    """Writer A inserts the Xid of gpu/n01/1 and holds its transaction open; writer B stores the Xid of gpu/n02/2
    (a higher id) and commits; the engine ticks and judges B's; A commits (on SQLite A inserts only then). The next
    tick (of the same engine, or of one started afresh from the stored cursor) judges A's Xid: both GPUs have an
    incident, and the three ticks judge the two events once each."""
    engine = site.engine()
    engine.tick()
    writer_a = site.held()
    postgresql = on_postgresql(site.store.url)
    if postgresql:
        writer_a.execute(sa.insert(t.events), [event_row(site.xid("n01", 1))])
    site.store.add_events([site.xid("n02", 2)])
    first = engine.tick()
    # PostgreSQL: B's row is judged at once, remembered while A, older, runs (the read position waits for A)
    assert first.events == 1
    assert {i.scope for i in site.store.incidents()} == {"gpu/n02/2"}
    if not postgresql:
        writer_a.execute(sa.insert(t.events), [event_row(site.xid("n01", 1))])
    writer_a.commit()
    writer_a.close()
    # the ids as each database hands them out
    assert (event_id(site.store, "gpu/n01/1") < event_id(site.store, "gpu/n02/2")) == postgresql
    if restart:
        engine = site.engine()
    second = engine.tick()
    third = engine.tick()
    assert (second.events, third.events) == (1, 0)
    assert {i.scope: i.fault_types for i in site.store.incidents()} == {"gpu/n01/1": ["gpu_lost"],
                                                                      "gpu/n02/2": ["gpu_lost"]}


@pytest.mark.parametrize("restart", [False, True], ids=["same-engine", "restarted"])
def test_a_push_committed_after_a_later_one_is_read_once(site: Site, restart: bool) -> None:
    """As for events: node n01's push held open while n02's commits is read by the tick after it commits, once, and
    so is n02's."""
    engine = site.engine()
    engine.tick()
    writer_a = site.held()
    postgresql = on_postgresql(site.store.url)
    if postgresql:
        writer_a.execute(sa.insert(t.metric_pushes), [push_row("n01", site.samples("n01"))])
    site.store.add_samples("n02", site.samples("n02"))
    first = engine.tick()
    assert first.pushes == 1 and engine.frames.newest("n01") < site.clock.now
    if not postgresql:
        writer_a.execute(sa.insert(t.metric_pushes), [push_row("n01", site.samples("n01"))])
    writer_a.commit()
    writer_a.close()
    if restart:
        engine = site.engine()
    second = engine.tick()
    third = engine.tick()
    # a restarted engine reads n02's push again on PostgreSQL (pushes read ahead are remembered in memory only): the
    # same values, stamped as they were
    assert (second.pushes, third.pushes) == ((2 if postgresql and restart else 1), 0)
    assert engine.frames.newest("n01") == engine.frames.newest("n02") == site.clock.now
    assert len(ids(site.store, t.metric_pushes)) == 2  # neither pruned: both read within the window


def test_a_transaction_left_open_is_warned_of_once_naming_its_session(
        site: Site, caplog: pytest.LogCaptureFixture) -> None:
    """PostgreSQL: a writer's transaction left open holds back a later writer's committed event; after
    HELD_BACK_WARN_S one warning names the open session's backend, and its end is said once it commits. SQLite
    holds nothing back."""
    engine = site.engine()
    engine.tick()
    writer_a = site.held()
    postgresql = on_postgresql(site.store.url)
    if postgresql:
        writer_a.execute(sa.insert(t.events), [event_row(site.xid("n01", 1))])
        pid = writer_a.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
    site.store.add_events([site.xid("n02", 2)])
    read = [engine.tick().events]
    held = engine.status()["held_back_s"]
    site.clock.now += HELD_BACK_WARN_S
    with caplog.at_level(logging.WARNING, logger="vigil.engine"):
        read += [engine.tick().events, engine.tick().events]
        warned = [r.getMessage() for r in caplog.records if "has waited for" in r.getMessage()]
        if not postgresql:
            writer_a.execute(sa.insert(t.events), [event_row(site.xid("n01", 1))])
        writer_a.commit()
        writer_a.close()
        read += [engine.tick().events]
        ended = [r.getMessage() for r in caplog.records if "has ended" in r.getMessage()]
    if postgresql:
        assert read == [1, 0, 0, 1] and held == 0.0
        (line,) = warned
        assert f"for {HELD_BACK_WARN_S:.0f} s" in line and f"backend pid {pid} " in line
        assert "(1 events of 1000, 0 pushes of 5000)" in line
        assert "idle in transaction" in line
        assert len(ended) == 1
    else:
        assert read == [1, 0, 0, 1] and held is None and warned == ended == []
    assert engine.status()["held_back_s"] is None
