"""Incident memory: each resolved incident summarized with its root cause, actions and outcome.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "incident_memories",
        sa.Column("incident_id", sa.String(64), primary_key=True),
        sa.Column("end", sa.Float, nullable=False),
        sa.Column("body", sa.JSON, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("incident_memories")
