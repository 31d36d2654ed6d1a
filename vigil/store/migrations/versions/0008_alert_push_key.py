"""Alerts stored before the Alertmanager webhook keyed them get the key it gives them now, so a notification of one
of them sent after the upgrade (Alertmanager repeats a firing alert every ``repeat_interval``) is a duplicate, not
a second event.

The key is the alert (its fingerprint; its labels where it had none), its start and its status
(``vigil.faces.api.push_keys.alert_key``, written out here: a revision means what it meant when it ran). The stored
event keeps them: a firing alert's event is stamped with its ``startsAt``, and ``attrs`` hold the fingerprint and
labels. A resolved alert's event is stamped with its end; its start is that of the latest firing event of the
same alert stored before it (the start it resolved), and a resolution with no firing event before it is left
unkeyed. A start is written back as the webhook reads it (UTC; an Alertmanager sending another offset gave a key
this cannot rebuild, and such an alert is stored once more, as before).

A database that stored an alert more than once (every repeat, before the key) keeps every row: the events are
the record of what came, and the engine read them long ago. The first of each key is keyed; a key some row holds
already (a repeat stored by the keyed webhook before this revision ran, or by a server still on 0007's code
while it runs) is not given to another.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

# Rows read or keyed per statement.
CHUNK = 2000

events = sa.table("events", sa.column("id", sa.Integer), sa.column("ts", sa.Float), sa.column("entity", sa.String),
                  sa.column("kind", sa.String), sa.column("source", sa.String), sa.column("attrs", sa.JSON),
                  sa.column("push_key", sa.String))


def alert_key(identity: str | dict[str, Any], starts_at: str, status: str) -> str:
    text = json.dumps(["alert", identity, starts_at, status], ensure_ascii=False, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _start(ts: float) -> str:
    """A stored start as the webhook's parsed ``startsAt`` writes it (``datetime.isoformat`` in UTC)."""
    return datetime.fromtimestamp(ts, UTC).isoformat()


def upgrade() -> None:
    bind = op.get_bind()
    # the keys the keyed webhook gave already, wherever their rows stand
    taken = set(bind.execute(sa.select(events.c.push_key).where(events.c.source == "alertmanager",
                                                                events.c.push_key.is_not(None))).scalars())
    # the start of the latest firing event of each alert (its identity on its entity), in the order they came
    firing_start: dict[str, float] = {}
    keys: list[dict[str, object]] = []
    after = 0
    while True:
        rows = bind.execute(sa.select(events.c.id, events.c.ts, events.c.entity, events.c.kind, events.c.attrs,
                                      events.c.push_key)
                            .where(events.c.source == "alertmanager", events.c.id > after,
                                   events.c.kind.in_(("alert_firing", "alert_resolved")))
                            .order_by(events.c.id).limit(CHUNK)).all()
        if not rows:
            break
        after = rows[-1].id
        for row in rows:
            attrs = row.attrs if isinstance(row.attrs, dict) else {}
            identity: str | dict[str, Any] = attrs.get("fingerprint") or attrs.get("labels") or {}
            alert = json.dumps([identity, row.entity], sort_keys=True, default=str)
            status = row.kind.removeprefix("alert_")
            if status == "firing":
                firing_start[alert] = float(row.ts)
                started: float | None = float(row.ts)
            else:
                started = firing_start.get(alert)
                if started is not None and started > float(row.ts):
                    started = None
            if row.push_key is not None or started is None:
                continue
            key = alert_key(identity, _start(started), status)
            if key not in taken:
                taken.add(key)
                keys.append({"row_id": row.id, "key": key})
    for start in range(0, len(keys), CHUNK):
        _key(bind, keys[start:start + CHUNK])


def _key(bind: sa.Connection, keys: list[dict[str, object]]) -> None:
    """Give each row its key, but a key some row took meanwhile: a server still on 0007's code keeps storing keyed
    alerts while this runs, and a repeat of an old alert takes that alert's key. Each chunk is tried in a savepoint;
    where the unique index refuses it, the keys now held are read again and the chunk is tried without them. No
    table lock: a writer waits only when it stores a key just given here (and then finds it a duplicate), where a
    SHARE ROW EXCLUSIVE lock would hold every event written until the revision commits."""
    keyed = sa.update(events).where(events.c.id == sa.bindparam("row_id")).values(push_key=sa.bindparam("key"))
    while keys:
        try:
            with bind.begin_nested():
                bind.execute(keyed, keys)
            return
        except sa.exc.IntegrityError:
            held = set(bind.execute(sa.select(events.c.push_key).where(
                events.c.push_key.in_([k["key"] for k in keys]))).scalars())
            if not held:
                raise
            keys = [k for k in keys if k["key"] not in held]


def downgrade() -> None:
    """The keys stay: revision 0007's webhook gives the same ones."""
