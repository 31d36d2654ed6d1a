"""The remedy package's tables (the audit log, the node lifecycle and the execution journal) come under the
store's revisions.

The audit log made them itself until now, on the same database as the store: ``create_all`` for a missing table
and an ``ALTER TABLE ... ADD COLUMN`` outside the revisions for the journal's ``owner`` and ``lease_expires``
columns. A database it opened has some or all of them, with or without either column; one it never opened has
none. Each table is made only where it is missing and each column added only where it lacks, so every one of them
reaches the same schema.

Downgrading leaves the tables: before this revision they were not the store's, and dropping them would drop the
audit trail.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    tables = sa.inspect(op.get_bind())
    present = set(tables.get_table_names())
    if "remedy_actions" not in present:
        op.create_table(
            "remedy_actions",
            sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("id", sa.String(40), nullable=False, unique=True),
            sa.Column("ts", sa.Float, nullable=False),
            sa.Column("kind", sa.String(40), nullable=False),
            sa.Column("target", sa.String(300), nullable=False),
            sa.Column("incident_id", sa.String(60)),
            sa.Column("reason", sa.Text, nullable=False),
            sa.Column("requested_by", sa.String(200), nullable=False),
            sa.Column("dry_run", sa.Boolean, nullable=False),
            sa.Column("status", sa.String(20), nullable=False),
            sa.Column("result", sa.Text, nullable=False),
            sa.Column("params", sa.JSON, nullable=False),
        )
        op.create_index("ix_remedy_actions_ts", "remedy_actions", ["ts"])
        op.create_index("ix_remedy_actions_target", "remedy_actions", ["target"])
    if "remedy_node_states" not in present:
        op.create_table(
            "remedy_node_states",
            sa.Column("node", sa.String(300), primary_key=True),
            sa.Column("state", sa.String(30), nullable=False),
            sa.Column("since", sa.Float, nullable=False),
            sa.Column("reason", sa.Text, nullable=False),
            sa.Column("repair_attempts", sa.Integer, nullable=False),
        )
    if "remedy_node_transitions" not in present:
        op.create_table(
            "remedy_node_transitions",
            sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("node", sa.String(300), nullable=False),
            sa.Column("ts", sa.Float, nullable=False),
            sa.Column("from_state", sa.String(30), nullable=False),
            sa.Column("to_state", sa.String(30), nullable=False),
            sa.Column("trigger", sa.String(60), nullable=False),
            sa.Column("reason", sa.Text, nullable=False),
        )
        op.create_index("ix_remedy_node_transitions_node", "remedy_node_transitions", ["node"])
    if "remedy_intents" not in present:
        op.create_table(
            "remedy_intents",
            sa.Column("key", sa.String(120), primary_key=True),
            sa.Column("action_id", sa.String(40), nullable=False),
            sa.Column("state", sa.String(20), nullable=False),
            sa.Column("started", sa.Float, nullable=False),
            sa.Column("finished", sa.Float),
            sa.Column("action", sa.JSON, nullable=False),
            sa.Column("owner", sa.String(120)),
            sa.Column("lease_expires", sa.Float),
        )
        return
    journal = {c["name"] for c in tables.get_columns("remedy_intents")}
    if "owner" not in journal:
        op.add_column("remedy_intents", sa.Column("owner", sa.String(120)))
    if "lease_expires" not in journal:
        op.add_column("remedy_intents", sa.Column("lease_expires", sa.Float))


def downgrade() -> None:
    pass
