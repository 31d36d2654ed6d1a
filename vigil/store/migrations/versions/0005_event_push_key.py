"""Events a push may send again carry a unique key, so a retried push stores them once.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("events") as batch:
        batch.add_column(sa.Column("push_key", sa.String(64), nullable=True))
    op.create_index("ux_events_push_key", "events", ["push_key"], unique=True)


def downgrade() -> None:
    op.drop_index("ux_events_push_key", "events")
    with op.batch_alter_table("events") as batch:
        batch.drop_column("push_key")
