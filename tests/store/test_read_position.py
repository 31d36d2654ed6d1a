"""Revision 0011 on SQLite and the suite's PostgreSQL: a store upgraded from 0010 keeps its events and pushes (xid 0),
an engine cursor saved before it (row ids alone) reads on from where it was - nothing before it again, everything
after it, the rows written since included - and pruning and the restart's replay go by the same order."""

from __future__ import annotations

import sqlalchemy as sa

from tests.serve.conftest import postgres_url as postgres_url
from tests.store.conftest import db_url as db_url
from tests.store.conftest import on_postgresql, opened
from tests.store.revisions import upgrade_to
from vigil.model import Event, Sample
from vigil.store import schema as t
from vigil.store.sql import ReadPosition


def event(ts: float) -> Event:
    return Event(ts=ts, entity="gpu/n01/0", kind="xid", source="kernel", level=4, message=f"Xid 79 at {ts:g}")


def test_a_cursor_from_before_0011_reads_on_from_where_it_was(db_url: str) -> None:
    engine = sa.create_engine(db_url)
    with engine.connect() as conn:
        upgrade_to(conn, "0010")
        conn.execute(sa.text("INSERT INTO events (ts, entity, kind, source, level, message, attrs) "
                             "VALUES (:ts, 'gpu/n01/0', 'xid', 'kernel', 4, 'Xid 79', '{}')"),
                     [{"ts": float(i)} for i in range(4)])
        conn.execute(sa.text("INSERT INTO metric_pushes (ts, node, points) VALUES (:ts, 'n01', '[]')"),
                     [{"ts": float(i)} for i in range(4)])
        conn.commit()
    engine.dispose()
    with opened(db_url) as store:
        # the engine had read the first two of each: its cursor then held row ids alone
        old_events = store.events_after(2)
        assert [(p.xid, e.ts) for p, e in old_events] == [(0, 2.0), (0, 3.0)]
        store.add_events([event(4.0)])
        store.add_samples("n01", [Sample(ts=4.0, entity="node/n01", metric="m", value=1.0)])
        after = store.events_after(2)
        assert [e.ts for _, e in after] == [2.0, 3.0, 4.0]
        new_xid = after[-1][0].xid
        assert (new_xid > 0) == on_postgresql(db_url)
        assert store.events_after(after[-1][0]) == [] and store.events_after(after[1][0]) == [after[2]]
        if on_postgresql(db_url):  # an xid past 32 bits: a bigint
            assert store.events_after(ReadPosition(2**40, 0)) == []
        pushes = store.pushes_after(2)
        assert [p.ts for p in pushes] == [2.0, 3.0, 4.0]
        assert (pushes[-1].xid > new_xid) == on_postgresql(db_url)  # a transaction of its own, later
        # the replay and the pruning go by the same order: up to the third push read, the fourth and fifth kept
        assert [p.ts for p in store.latest_pushes(pushes[0].position, since=0.0)] == [0.0, 1.0, 2.0]
        assert store.prune_pushes_outside(pushes[0].position, older_than=10.0, newer_than=10.0) == 3
        assert [p.ts for p in store.pushes_after(0)] == [3.0, 4.0]
        with store.engine.connect() as conn:
            xids = conn.execute(sa.select(t.events.c.xid).order_by(t.events.c.id)).scalars().all()
        assert xids == [0, 0, 0, 0, new_xid]


def test_a_bare_row_id_is_the_position_of_a_row_stored_before_0011() -> None:
    assert ReadPosition.of(7) == (0, 7) and ReadPosition.of(ReadPosition(5, 7)) == (5, 7)
    assert ReadPosition(0, 9) < ReadPosition(1, 1)


def test_a_bare_row_id_past_rows_written_since_0011_reads_on_after_them(db_url: str) -> None:
    """A cursor holding a row id alone that points at rows written since 0011 (an engine of before 0011 beside an
    upgraded server, or a cursor written by hand) places the engine after those rows, not before them all."""
    with opened(db_url) as store:
        store.add_events([event(float(ts)) for ts in range(3)])
        read = store.events_after(0)
        position = store.position_of("events", read[1][0].id)
        assert position == read[1][0] and store.events_after(position) == read[2:]
        assert store.position_of("events", 0) == (0, 0)
        assert store.position_of("metric_pushes", 5) == (0, 5)  # nothing written: every later row is read
