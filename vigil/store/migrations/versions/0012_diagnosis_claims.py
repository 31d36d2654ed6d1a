"""Who is diagnosing an incident stored without a diagnosis: `vigil serve` diagnoses such incidents in the
background, and a server (or two, or a viewer asking again) claims one in this table before running the
diagnosis, so that it runs once. A row is ``running`` under its owner until ``lease_until``, then ``done`` or
``failed`` with the error; a running claim whose lease lapsed (its server died) is taken over.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if "diagnosis_claims" not in set(sa.inspect(op.get_bind()).get_table_names()):
        op.create_table(
            "diagnosis_claims",
            sa.Column("incident_id", sa.String(64), primary_key=True),
            sa.Column("state", sa.String(16), nullable=False),
            sa.Column("owner", sa.String(200), nullable=False),
            sa.Column("claimed_at", sa.Float, nullable=False),
            sa.Column("lease_until", sa.Float, nullable=False),
            sa.Column("attempts", sa.Integer, nullable=False),
            sa.Column("error", sa.Text, nullable=False),
        )


def downgrade() -> None:
    op.drop_table("diagnosis_claims")
