"""Events and log lines of named entities, selected in the database (what a diagnosis reads: its incident's
footprint out of a window holding the whole cluster's records) on SQLite and the suite's PostgreSQL: the same
records, in the same order, as reading the window and keeping those entities', across the IN-list chunks, within
the limit; and read through the (entity, ts) indexes."""

from __future__ import annotations

import random

import pytest
from sqlalchemy import text

from tests.store.conftest import db_url as db_url
from tests.store.conftest import on_postgresql, opened
from vigil.model import Event, FaultLevel, LogRecord
from vigil.store import sql

pytestmark = pytest.mark.timeout(180)


def records(entities: int, per_entity: int) -> tuple[list[Event], list[LogRecord]]:
    rng = random.Random(7)
    events, logs = [], []
    for n in range(entities):
        entity = f"gpu/n{n // 8:04d}/{n % 8}"
        for k in range(per_entity):
            ts = 1000.0 + rng.randrange(0, 600)  # ties in time: the order falls to the row id
            events.append(Event(ts=ts, entity=entity, kind="xid", source="test", level=FaultLevel.DRAIN,
                                message=f"{entity} {k}"))
            logs.append(LogRecord(ts=ts, entity=entity, source="kern.log", line=f"{entity} line {k}", lineno=k))
    rng.shuffle(events)
    rng.shuffle(logs)
    return events, logs


def test_the_records_of_named_entities_are_those_of_the_window_kept_by_entity(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sql, "ENTITY_CHUNK", 7)  # several IN lists, merged
    events, logs = records(entities=64, per_entity=5)
    with opened(db_url) as store:
        store.add_events(events)
        store.add_logs(logs)
        all_entities = sorted({e.entity for e in events})
        wanted = set(all_entities[::3]) | {"gpu/n9999/0"}  # one with no records
        for since, until, limit in ((1100.0, 1400.0, 100_000), (None, None, 100_000), (1000.0, 1600.0, 25)):
            window_events = store.events(since=since, until=until, limit=100_000)
            window_logs = store.logs(since=since, until=until, limit=100_000)
            kept_events = [e for e in window_events if e.entity in wanted][:limit]
            kept_logs = [r for r in window_logs if r.entity in wanted][:limit]
            got_events = store.events(since=since, until=until, limit=limit, entities=wanted)
            got_logs = store.logs(since=since, until=until, limit=limit, entities=wanted)
            assert got_events == kept_events and got_logs == kept_logs
            assert 0 < len(got_events) < len(window_events)
        assert store.events(entities=[], limit=100) == [] and store.logs(entities=set(), limit=100) == []
        assert store.events(entities={"gpu/n0000/0"}, kind="nope", limit=100) == []


def test_the_entity_read_goes_through_the_entity_and_time_index(db_url: str) -> None:
    # a window holding the records of a cluster (800 entities), four of them asked for
    events, logs = records(entities=800, per_entity=4)
    with opened(db_url) as store:
        store.add_events(events)
        store.add_logs(logs)
        if on_postgresql(db_url):
            with store.engine.begin() as conn:
                conn.execute(text("ANALYZE events"))
                conn.execute(text("ANALYZE logs"))
        names = ", ".join(f"'gpu/n0000/{n}'" for n in range(4))
        with store.engine.connect() as conn:
            for table in ("events", "logs"):
                query = (f"SELECT * FROM {table} WHERE ts >= 1000 AND ts <= 1400 AND entity IN ({names}) "
                         "ORDER BY ts, id LIMIT 100000")
                if on_postgresql(db_url):
                    plan = " ".join(r[0] for r in conn.execute(text(f"EXPLAIN {query}")))
                else:
                    plan = " ".join(str(r[-1]) for r in conn.execute(text(f"EXPLAIN QUERY PLAN {query}")))
                assert f"ix_{table}_entity_ts" in plan, plan


def test_the_anomalies_named_by_id_are_those_of_the_window_kept_by_id(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An incident's anomalies, looked up by id in the database, are the window's filtered in Python: the same, in
    the same order (equal starts in the order stored, on SQLite), across the IN-list chunks."""
    from vigil.model import Anomaly

    monkeypatch.setattr(sql, "ENTITY_CHUNK", 7)
    rng = random.Random(11)
    found = [Anomaly(entity=f"gpu/n{n // 8:04d}/{n % 8}", start=1000.0 + rng.randrange(0, 20) * 30.0,
                     end=1000.0 + 600 + rng.randrange(0, 600), detector="rules", fault_type="gpu_lost",
                     level=FaultLevel.DRAIN, score=1.0) for n in range(120)]
    with opened(db_url) as store:
        store.add_anomalies(found)
        ids = [a.id for a in found[::3]] + ["an-missing"]
        for since in (None, 1400.0):
            window = [a.id for a in store.anomalies(since=since, limit=100_000) if a.id in set(ids)]
            named = [a.id for a in store.anomalies(since=since, limit=100_000, ids=ids)]
            if on_postgresql(db_url):  # equal starts come in no set order there, before as now
                assert sorted(named) == sorted(window)
            else:
                assert named == window
            assert len(named) >= 20
        assert store.anomalies(ids=[]) == []
