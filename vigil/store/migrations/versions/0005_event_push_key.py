"""Events a push may send again carry a unique key, so a retried push stores them once.

The unique index is built beside the writers (CONCURRENTLY on PostgreSQL: agents' pushes go on while it reads the
events table). Its build commits the new column before it, so a revision cut short between the two is run again
over a table that has the column: it is added only where missing.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from vigil.store.migrations import create_index_beside_writers

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if "push_key" not in {c["name"] for c in sa.inspect(op.get_bind()).get_columns("events")}:
        with op.batch_alter_table("events") as batch:
            batch.add_column(sa.Column("push_key", sa.String(64), nullable=True))
    create_index_beside_writers("ux_events_push_key", "events", ["push_key"], unique=True)


def downgrade() -> None:
    op.drop_index("ux_events_push_key", "events")
    with op.batch_alter_table("events") as batch:
        batch.drop_column("push_key")
