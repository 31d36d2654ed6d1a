"""Alerts stored before the Alertmanager webhook keyed them get the key it gives them now, so a notification of one
of them sent after the upgrade (Alertmanager repeats a firing alert every ``repeat_interval``) is a duplicate, not
a second event.

The key is the alert (its fingerprint; its labels where it had none), its start and its status
(``vigil.faces.api.push_keys.alert_key``, written out here: a revision means what it meant when it ran). The stored
event keeps them: a firing alert's event is stamped with its ``startsAt``, and ``attrs`` hold the fingerprint and
labels. A resolved alert's event is stamped with its end; its start is that of the latest firing event of the
same alert stored before it (the start it resolved), and a resolution with no firing event before it is left
unkeyed. A start is written back in UTC, as the webhook keys it whatever offset it was sent in, and the labels are
the stored ones (the alert's under the notification's common labels), as the webhook keys an alert without a
fingerprint.

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

# Ids of the events table walked per step: the alerts among them are read and keyed together.
CHUNK = 20_000
# Tries of one chunk's keys while writers store some of them: a chunk refused this often is refused for another
# reason.
ATTEMPTS = 5

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
    # the start of the latest firing event of each alert (its identity on its entity), in the order they came: one
    # entry an alert, not an event
    firing_start: dict[str, float] = {}
    # Rows stored after this are keyed already (0007's webhook keys them).
    last = bind.execute(sa.select(sa.func.max(events.c.id))).scalar() or 0
    after = 0
    while after < last:
        # A stretch of CHUNK ids of the primary key (Vigil deletes no event: the ids are dense, a gap costs an empty
        # stretch), its alerts keyed before the next is read: a filtered "ORDER BY id LIMIT" had PostgreSQL scan and
        # sort the whole table for each chunk where alerts are sparse, and every key was held in memory to the end.
        end = after + CHUNK
        rows = bind.execute(sa.select(events.c.id, events.c.ts, events.c.entity, events.c.kind, events.c.attrs,
                                      events.c.push_key)
                            .where(events.c.id > after, events.c.id <= end, events.c.source == "alertmanager",
                                   events.c.kind.in_(("alert_firing", "alert_resolved")))
                            .order_by(events.c.id)).all()
        keys: dict[str, int] = {}  # key -> the first row of the stretch it belongs to
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
            keys.setdefault(alert_key(identity, _start(started), status), row.id)
        _key(bind, [{"row_id": row_id, "key": key} for key, row_id in keys.items()])
        after = end


def _key(bind: sa.Connection, keys: list[dict[str, object]]) -> None:
    """Give each row its key, but a key some row holds: one the keyed webhook gave before this revision ran, one
    given to an earlier row here, or one a server still on 0007's code gave while this runs (a repeat of an old
    alert). A key held when its UPDATE runs is skipped by the UPDATE itself; one a concurrent writer commits after
    that makes the unique index refuse the chunk, which is tried again from a savepoint. No table lock: a writer
    waits only when it stores a key just given here (and then finds it a duplicate), where a SHARE ROW EXCLUSIVE
    lock would hold every event written until the revision commits."""
    if not keys:
        return
    holder = events.alias("holder")
    keyed = (sa.update(events).values(push_key=sa.bindparam("key"))
             .where(events.c.id == sa.bindparam("row_id"),
                    ~sa.exists().where(holder.c.push_key == sa.bindparam("key"))))
    for attempt in range(ATTEMPTS):
        try:
            with bind.begin_nested():
                bind.execute(keyed, keys)
            return
        except sa.exc.IntegrityError:
            if attempt == ATTEMPTS - 1:
                raise


def downgrade() -> None:
    """The keys stay: revision 0007's webhook gives the same ones."""
