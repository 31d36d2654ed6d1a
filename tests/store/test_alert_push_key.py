"""Revision 0008 on a database whose alerts were stored before the Alertmanager webhook keyed them (every repeat a
row of its own): their rows are kept and the first of each alert keyed as the webhook keys it now, so Alertmanager
sending them again after the upgrade stores nothing new."""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.conftest import wait_for
from tests.serve.conftest import REPO, fresh_database
from tests.serve.conftest import postgres_url as postgres_url
from tests.store.conftest import api_client, opened
from tests.store.revisions import assert_at_head_with_the_events_kept, downgrade_to, statements, upgrade_to
from vigil.faces.api.alertmanager import alerts_to_events, parse_payload
from vigil.faces.api.push_keys import alert_key
from vigil.store.sql import Store

# Debian's Alertmanager 0.25 notifying one alert: firing three times, resolved, firing again (a new start).
RECORDED = REPO / "tests" / "fixtures" / "serve" / "alertmanager" / "repeat_resolve_refire.json"
events = sa.table("events", sa.column("ts", sa.Float), sa.column("entity", sa.String), sa.column("kind", sa.String),
                  sa.column("source", sa.String), sa.column("level", sa.Integer), sa.column("message", sa.Text),
                  sa.column("attrs", sa.JSON), sa.column("push_key", sa.String))


def notifications() -> list[dict[str, Any]]:
    """The recorded notifications, and the first two again for an alert without a fingerprint (another GPU)."""
    recorded: list[dict[str, Any]] = json.loads(RECORDED.read_text())
    unfingerprinted = []
    for notification in recorded[:2]:
        other = copy.deepcopy(notification)
        other["alerts"][0].pop("fingerprint")
        other["alerts"][0]["labels"]["gpu"] = other["commonLabels"]["gpu"] = "6"
        unfingerprinted.append(other)
    return recorded + unfingerprinted


def alerts_at_revision_0007(url: str) -> int:
    """The store at revision 0007 holding every notification's alert as the webhook stored it before its key (the
    first notification twice: its answer was lost), but the last firing of the recorded alert, which the keyed
    webhook stored; returns how many events it holds."""
    rows = []
    sent = notifications()
    for i, notification in enumerate([sent[0], *sent]):
        payload = parse_payload(notification)
        keyed = i == 5  # the recorded alert firing anew, after the server was upgraded (0007's code)
        rows += [{"ts": e.ts, "entity": e.entity, "kind": e.kind, "source": e.source, "level": int(e.level),
                  "message": e.message, "attrs": e.attrs, "push_key": alert_key(alert) if keyed else None}
                 for alert, e in zip(payload.alerts, alerts_to_events(payload), strict=True)]
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        upgrade_to(conn, "0007")
        conn.execute(sa.insert(events), rows)
        conn.commit()
    engine.dispose()
    return len(rows)


def assert_every_alert_sent_again_is_a_duplicate(store: Store, tmp_path: Path, stored: int) -> None:
    assert_at_head_with_the_events_kept(store, stored)  # nothing deleted
    with api_client(store, tmp_path) as client:
        answers = [client.post("/api/v1/alertmanager", json=n).json() for n in notifications()]
    assert [(a["stored"], a["duplicates"]) for a in answers] == [(1, 1)] * 7
    assert len(store.events(limit=stored + 1)) == stored


def test_alerts_stored_before_their_key_are_keyed(db_url: str, tmp_path: Path) -> None:
    stored = alerts_at_revision_0007(db_url)
    with opened(db_url) as store:
        assert_every_alert_sent_again_is_a_duplicate(store, tmp_path, stored)


def _without_fingerprint_and_a_label_in_common_labels_only(notification: dict[str, Any]) -> None:
    notification["alerts"][0].pop("fingerprint")
    notification["commonLabels"]["source_cluster"] = "east"


def _started_in_another_offset(notification: dict[str, Any]) -> None:
    started = datetime.fromisoformat(notification["alerts"][0]["startsAt"])
    notification["alerts"][0]["startsAt"] = started.astimezone(timezone(timedelta(hours=2))).isoformat()


@pytest.mark.parametrize("sender", [_without_fingerprint_and_a_label_in_common_labels_only,
                                    _started_in_another_offset])
def test_the_webhook_keys_an_alert_as_revision_0008_keyed_it(tmp_path: Path,
                                                            sender: Callable[[dict[str, Any]], None]) -> None:
    """A sender that puts a label in commonLabels only (of an alert without a fingerprint), or gives startsAt in an
    offset other than UTC: the alert stored before the key and keyed by revision 0008 is a duplicate when it is
    sent again (the webhook keyed the alert's own labels and the offset it was sent in before: stored again)."""
    notification = copy.deepcopy(json.loads(RECORDED.read_text())[0])
    sender(notification)
    url = f"sqlite:///{tmp_path / 'v.db'}"
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        upgrade_to(conn, "0007")
        conn.execute(sa.insert(events), [{"ts": e.ts, "entity": e.entity, "kind": e.kind, "source": e.source,
                                          "level": int(e.level), "message": e.message, "attrs": e.attrs,
                                          "push_key": None} for e in alerts_to_events(parse_payload(notification))])
        conn.commit()
    engine.dispose()
    with opened(url) as store:
        with api_client(store, tmp_path) as client:
            answer = client.post("/api/v1/alertmanager", json=notification).json()
        assert (answer["stored"], answer["duplicates"]) == (1, 1), answer
        assert len(store.events(limit=10)) == 1


def test_alerts_are_keyed_stretch_by_stretch_of_the_table(tmp_path: Path) -> None:
    """Revision 0008 walks the events table in stretches of its primary key and keys the alerts of each before it
    reads the next, so it holds one stretch at a time, not every key (its chunks were read first and keyed at the
    end before, by a query PostgreSQL answered with a scan and sort of the whole table per chunk). The recorded
    notifications, 45,000 other events and one more alert after them are keyed as the webhook keys them, and
    keyed again to the same (0008 run a second time changes nothing)."""
    url = f"sqlite:///{tmp_path / 'v.db'}"
    stored = alerts_at_revision_0007(url)
    late = copy.deepcopy(notifications()[0])
    late["alerts"][0]["fingerprint"] = "late0000alert000"
    late["alerts"][0]["labels"]["gpu"] = late["commonLabels"]["gpu"] = "7"
    late_event = alerts_to_events(parse_payload(late))[0]
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        conn.execute(sa.insert(events), [{"ts": float(i), "entity": "gpu/n001/0", "kind": "xid", "source": "kernel",
                                          "level": 4, "message": "Xid 79", "attrs": {}, "push_key": None}
                                         for i in range(45_000)])
        conn.execute(sa.insert(events), {"ts": late_event.ts, "entity": late_event.entity, "kind": late_event.kind,
                                         "source": late_event.source, "level": int(late_event.level),
                                         "message": late_event.message, "attrs": late_event.attrs,
                                         "push_key": None})
        conn.commit()
        with statements() as sent:
            upgrade_to(conn, "0008")
        keyed = conn.execute(sa.text("SELECT id, push_key FROM events WHERE push_key IS NOT NULL ORDER BY id")).all()
        reads = [i for i, statement in enumerate(sent) if statement.startswith("SELECT events.id, events.ts")]
        updates = [i for i, statement in enumerate(sent) if statement.startswith("UPDATE events")]
        assert len(reads) >= 3 and len(updates) == 2 and updates[0] < reads[-1], sent
        downgrade_to(conn, "0007")  # 0008 leaves the keys in place
        upgrade_to(conn, "0008")
        assert conn.execute(sa.text("SELECT id, push_key FROM events WHERE push_key IS NOT NULL ORDER BY id")
                            ).all() == keyed
    engine.dispose()
    with opened(url) as store:
        assert_every_alert_sent_again_is_a_duplicate(store, tmp_path, stored + 45_001)
        with api_client(store, tmp_path) as client:
            assert client.post("/api/v1/alertmanager", json=late).json()["duplicates"] == 1


@pytest.mark.parametrize("in_flight", [False, True], ids=["committed", "in_flight"])
def test_alerts_are_keyed_beside_a_server_storing_a_repeat_on_postgresql(postgres_url: str, tmp_path: Path,
                                                                         in_flight: bool) -> None:
    """A server still on 0007's code stores a repeat of an old alert, keyed, while revision 0008 runs: committed
    when the upgrading connection sends its first UPDATE, or inserted then and committed only once that UPDATE waits
    for it on the unique index (pg_locks). The upgrade leaves that key to the repeat and goes on (rolled back on
    ux_events_push_key before), and every alert sent again after it is a duplicate."""
    url = fresh_database(postgres_url, f"alert_push_key_race_{int(in_flight)}")
    stored = alerts_at_revision_0007(url)
    payload = parse_payload(notifications()[0])
    event, key = alerts_to_events(payload)[0], alert_key(payload.alerts[0])
    upgrading, server = sa.create_engine(url), sa.create_engine(url)
    repeats: list[int] = []
    committing: list[threading.Thread] = []

    def a_repeat_arrives(conn: sa.Connection, cursor: Any, statement: str, *args: Any) -> None:
        if not statement.startswith("UPDATE events") or repeats:
            return
        writer = server.connect()
        repeats.extend(writer.execute(sa.text(
            "INSERT INTO events (ts, entity, kind, source, level, message, attrs, push_key) VALUES "
            "(:ts, :entity, :kind, 'alertmanager', 1, 'repeat', '{}', :key) "
            "ON CONFLICT (push_key) DO NOTHING RETURNING id"),
            {"ts": event.ts, "entity": event.entity, "kind": event.kind, "key": key}).scalars())
        if not in_flight:
            writer.commit()
            writer.close()
            return
        upgrading_pid = cursor.connection.info.backend_pid

        def commit_once_the_upgrade_waits() -> None:
            with server.connect() as watcher:
                wait_for(lambda: watcher.execute(sa.text("SELECT count(*) FROM pg_locks WHERE pid = :pid AND NOT "
                                                         "granted"), {"pid": upgrading_pid}).scalar_one() > 0,
                         30.0, "the upgrade to wait for the repeat's key")
            writer.commit()
            writer.close()

        committing.append(threading.Thread(target=commit_once_the_upgrade_waits))
        committing[0].start()

    sa.event.listen(upgrading, "before_cursor_execute", a_repeat_arrives)
    with upgrading.connect() as conn:
        upgrade_to(conn, "0008")
    for thread in committing:
        thread.join()
    upgrading.dispose()
    server.dispose()
    assert len(repeats) == 1 and len(committing) == int(in_flight)  # the repeat was stored while the revision ran
    with opened(url) as store:
        with store.engine.connect() as conn:
            holder = conn.execute(sa.text("SELECT id FROM events WHERE push_key = :key"), {"key": key}).scalar_one()
        assert holder == repeats[0]
        assert_every_alert_sent_again_is_a_duplicate(store, tmp_path, stored + 1)

