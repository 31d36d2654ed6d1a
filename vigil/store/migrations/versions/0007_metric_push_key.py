"""Metric pushes a sender may send again carry a unique key, so a retried launch report stores its step telemetry
once.

The launch reports' pushes stored before it (node ``launch:<job>``) are keyed as the launch route keys them: the
job and the time of the report's newest look, which the row keeps as its ``ts``
(``vigil.faces.api.push_keys.launch_steps_key``, written out here: a revision means what it meant when it ran).
A database that stored a retried report twice holds two rows of one key: the later ones go first (the first is
the one the route would have kept), so the unique index can be built. Agents' pushes stay unkeyed.

The index is built beside the writers (CONCURRENTLY on PostgreSQL: every agent pushes into this table). Its build
commits the column and keys before it, so a revision cut short between the two is run again over a table that has
the column: it is added only where missing, and the keys are set again.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import hashlib
import json

import sqlalchemy as sa
from alembic import op

from vigil.store.migrations import create_index_beside_writers

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

LAUNCH_NODE = "launch:"
# Rows deleted or keyed per statement.
CHUNK = 1000

pushes = sa.table("metric_pushes", sa.column("id", sa.Integer), sa.column("node", sa.String),
                  sa.column("ts", sa.Float), sa.column("push_key", sa.String))


def launch_steps_key(job: str, newest: float) -> str:
    text = json.dumps(["launch_steps", job, newest], ensure_ascii=False, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def upgrade() -> None:
    bind = op.get_bind()
    if "push_key" not in {c["name"] for c in sa.inspect(bind).get_columns("metric_pushes")}:
        with op.batch_alter_table("metric_pushes") as batch:
            batch.add_column(sa.Column("push_key", sa.String(64), nullable=True))
    launches = bind.execute(sa.select(pushes.c.id, pushes.c.node, pushes.c.ts, pushes.c.push_key)
                            .where(pushes.c.node.startswith(LAUNCH_NODE, autoescape=True))
                            .order_by(pushes.c.id)).all()
    first: dict[str, int] = {}
    repeated: list[int] = []
    keys: list[dict[str, object]] = []
    for row in launches:
        key = launch_steps_key(row.node.removeprefix(LAUNCH_NODE), float(row.ts))
        if key in first:
            repeated.append(row.id)
        else:
            first[key] = row.id
            if row.push_key != key:
                keys.append({"row_id": row.id, "key": key})
    for start in range(0, len(repeated), CHUNK):
        bind.execute(sa.delete(pushes).where(pushes.c.id.in_(repeated[start:start + CHUNK])))
    keyed = sa.update(pushes).where(pushes.c.id == sa.bindparam("row_id")).values(push_key=sa.bindparam("key"))
    for start in range(0, len(keys), CHUNK):
        bind.execute(keyed, keys[start:start + CHUNK])
    create_index_beside_writers("ux_metric_pushes_push_key", "metric_pushes", ["push_key"], unique=True)


def downgrade() -> None:
    op.drop_index("ux_metric_pushes_push_key", "metric_pushes")
    with op.batch_alter_table("metric_pushes") as batch:
        batch.drop_column("push_key")
