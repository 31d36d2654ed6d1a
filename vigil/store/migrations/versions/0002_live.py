"""The live path: agents' metric pushes, consumer cursors, node inventory, topology versions.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "metric_pushes",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("ts", sa.Float, nullable=False),
        sa.Column("node", sa.String(300), nullable=False),
        sa.Column("points", sa.JSON, nullable=False),
        # ids are a consumer's cursor: never hand out an id again after the newest rows were pruned
        sqlite_autoincrement=True,
    )
    op.create_table(
        "cursors",
        sa.Column("name", sa.String(100), primary_key=True),
        sa.Column("position", sa.Float, nullable=False),
        sa.Column("state", sa.JSON, nullable=False),
    )
    op.create_table(
        "inventory",
        sa.Column("node", sa.String(300), primary_key=True),
        sa.Column("ts", sa.Float, nullable=False),
        sa.Column("body", sa.JSON, nullable=False),
    )
    op.create_table(
        "topology_versions",
        sa.Column("version", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("ts", sa.Float, nullable=False),
        sa.Column("source", sa.String(100), nullable=False),
        sa.Column("body", sa.JSON, nullable=False),
    )


def downgrade() -> None:
    for table in ("topology_versions", "inventory", "cursors", "metric_pushes"):
        op.drop_table(table)
