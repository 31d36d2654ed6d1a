"""A failed background diagnosis is tried again a bounded number of times (``serve_diagnosis_retries``), each
later than the one before: ``failures`` counts the failed runs since the diagnosis was last asked for (a
*Diagnose again* starts the count over). A claim waiting for its next try is ``retrying`` until ``lease_until``.
The column is added with the constant default 0 (no row rewritten); the claims stored before keep it.

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if "failures" not in {c["name"] for c in sa.inspect(op.get_bind()).get_columns("diagnosis_claims")}:
        with op.batch_alter_table("diagnosis_claims") as batch:
            batch.add_column(sa.Column("failures", sa.Integer, nullable=False, server_default="0"))


def downgrade() -> None:
    # 0013's servers know no "retrying" and take only lapsed running claims: one waiting for its next try is
    # failed there (shown with its error, rerun by Diagnose again), not left undiagnosed for good
    op.execute("UPDATE diagnosis_claims SET state = 'failed' WHERE state = 'retrying'")
    with op.batch_alter_table("diagnosis_claims") as batch:
        batch.drop_column("failures")
