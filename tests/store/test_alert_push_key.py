"""Revision 0008 on a database whose alerts were stored before the Alertmanager webhook keyed them (every repeat a
row of its own): their rows are kept and the first of each alert keyed as the webhook keys it now, so Alertmanager
sending them again after the upgrade stores nothing new."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from fastapi.testclient import TestClient

from tests.serve.conftest import REPO, TOKEN, fresh_database
from tests.serve.conftest import postgres_url as postgres_url
from tests.store.test_migrations import assert_at_head_with_the_events_kept, upgrade_to
from vigil.config import Settings
from vigil.faces.api.alertmanager import alerts_to_events, parse_payload
from vigil.faces.api.app import create_app
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
    settings = Settings(home=tmp_path, db_url=store.url, api_token=TOKEN)
    with TestClient(create_app(store, settings=settings), headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        answers = [client.post("/api/v1/alertmanager", json=n).json() for n in notifications()]
    assert [(a["stored"], a["duplicates"]) for a in answers] == [(1, 1)] * 7
    assert len(store.events(limit=1000)) == stored


def test_alerts_stored_before_their_key_are_keyed_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'v.db'}"
    stored = alerts_at_revision_0007(url)
    store = Store(url)
    assert_every_alert_sent_again_is_a_duplicate(store, tmp_path, stored)
    store.close()


def test_alerts_are_keyed_beside_a_server_storing_a_repeat_on_postgresql(postgres_url: str, tmp_path: Path) -> None:
    """A server still on 0007's code stores a repeat of an old alert, keyed, after revision 0008 read the keys
    taken and before it gives its own (a second connection commits it when the upgrading one sends its first
    UPDATE): the upgrade leaves that key to the repeat and goes on (rolled back on ux_events_push_key before), and
    every alert sent again after it is a duplicate."""
    url = fresh_database(postgres_url, "alert_push_key_race")
    stored = alerts_at_revision_0007(url)
    payload = parse_payload(notifications()[0])
    event, key = alerts_to_events(payload)[0], alert_key(payload.alerts[0])
    upgrading, server = sa.create_engine(url), sa.create_engine(url)
    repeats: list[int] = []

    def a_repeat_arrives(conn: sa.Connection, cursor: Any, statement: str, *args: Any) -> None:
        if statement.startswith("UPDATE events") and not repeats:
            with server.begin() as writer:
                repeats.extend(writer.execute(sa.text(
                    "INSERT INTO events (ts, entity, kind, source, level, message, attrs, push_key) VALUES "
                    "(:ts, :entity, :kind, 'alertmanager', 1, 'repeat', '{}', :key) "
                    "ON CONFLICT (push_key) DO NOTHING RETURNING id"),
                    {"ts": event.ts, "entity": event.entity, "kind": event.kind, "key": key}).scalars())

    sa.event.listen(upgrading, "before_cursor_execute", a_repeat_arrives)
    with upgrading.connect() as conn:
        upgrade_to(conn, "0008")
    upgrading.dispose()
    server.dispose()
    assert len(repeats) == 1  # the repeat was stored while the revision ran
    store = Store(url)
    with store.engine.connect() as conn:
        holder = conn.execute(sa.text("SELECT id FROM events WHERE push_key = :key"), {"key": key}).scalar_one()
    assert holder == repeats[0]
    assert_every_alert_sent_again_is_a_duplicate(store, tmp_path, stored + 1)
    store.close()


def test_alerts_stored_before_their_key_are_keyed_on_postgresql(postgres_url: str, tmp_path: Path) -> None:
    url = fresh_database(postgres_url, "alert_push_key")
    stored = alerts_at_revision_0007(url)
    store = Store(url)
    assert_every_alert_sent_again_is_a_duplicate(store, tmp_path, stored)
    store.close()
