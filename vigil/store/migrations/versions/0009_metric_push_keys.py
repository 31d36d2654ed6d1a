"""The keys of metric pushes are kept in a table of their own for a bounded window (the setting
``push_key_window_s``), not only on the push rows the engine prunes a few minutes after reading them: a launch
report or an agent's push sent again after its push was pruned was stored again.

The keys the pushes hold already are copied in, stamped with the time of the upgrade, so each is kept for a whole
window from then. The table is new: a plain build, no writer waits on it.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import time

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

pushes = sa.table("metric_pushes", sa.column("push_key", sa.String))


def upgrade() -> None:
    bind = op.get_bind()
    if "metric_push_keys" not in sa.inspect(bind).get_table_names():
        op.create_table(
            "metric_push_keys",
            sa.Column("push_key", sa.String(64), primary_key=True),
            sa.Column("stored_at", sa.Float, nullable=False),
        )
        op.create_index("ix_metric_push_keys_stored_at", "metric_push_keys", ["stored_at"])
    keys = sa.table("metric_push_keys", sa.column("push_key", sa.String), sa.column("stored_at", sa.Float))
    held = sa.select(pushes.c.push_key, sa.literal(time.time(), sa.Float)).where(pushes.c.push_key.is_not(None))
    known = sa.select(keys.c.push_key)
    bind.execute(sa.insert(keys).from_select(["push_key", "stored_at"], held.where(pushes.c.push_key.not_in(known))))


def downgrade() -> None:
    op.drop_table("metric_push_keys")
