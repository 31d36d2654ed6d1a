"""A metric push's key is stored with a digest of what the push held (``metric_push_keys.body_digest``), so that an
agent's Idempotency-Key sent again with other samples - a sender that reuses keys - is refused, where it was
answered as a duplicate and its samples dropped. The keys stored before keep no digest and are taken as before.

A nullable column without a default: PostgreSQL and SQLite change only the table's definition, no row is
rewritten.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if "body_digest" not in {c["name"] for c in sa.inspect(op.get_bind()).get_columns("metric_push_keys")}:
        op.add_column("metric_push_keys", sa.Column("body_digest", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("metric_push_keys") as batch:
        batch.drop_column("body_digest")
