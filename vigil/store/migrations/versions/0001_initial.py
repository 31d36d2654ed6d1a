"""Initial schema: events, logs, anomalies, incidents, actions, diagnoses, topology.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("ts", sa.Float, nullable=False),
        sa.Column("entity", sa.String(300), nullable=False),
        sa.Column("kind", sa.String(100), nullable=False),
        sa.Column("source", sa.String(100), nullable=False),
        sa.Column("level", sa.Integer, nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("attrs", sa.JSON, nullable=False),
    )
    op.create_index("ix_events_ts", "events", ["ts"])
    op.create_index("ix_events_entity_ts", "events", ["entity", "ts"])
    op.create_table(
        "logs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("ts", sa.Float),
        sa.Column("entity", sa.String(300), nullable=False),
        sa.Column("source", sa.String(100), nullable=False),
        sa.Column("line", sa.Text, nullable=False),
        sa.Column("lineno", sa.Integer),
    )
    op.create_index("ix_logs_entity_ts", "logs", ["entity", "ts"])
    op.create_table(
        "anomalies",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("entity", sa.String(300), nullable=False),
        sa.Column("start", sa.Float, nullable=False),
        sa.Column("end", sa.Float, nullable=False),
        sa.Column("detector", sa.String(100), nullable=False),
        sa.Column("fault_type", sa.String(100), nullable=False),
        sa.Column("level", sa.Integer, nullable=False),
        sa.Column("body", sa.JSON, nullable=False),
    )
    op.create_index("ix_anomalies_entity_start", "anomalies", ["entity", "start"])
    op.create_table(
        "incidents",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("start", sa.Float, nullable=False),
        sa.Column("end", sa.Float, nullable=False),
        sa.Column("level", sa.Integer, nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("scope", sa.String(300), nullable=False),
        sa.Column("title", sa.Text, nullable=False),
        sa.Column("body", sa.JSON, nullable=False),
    )
    op.create_index("ix_incidents_start", "incidents", ["start"])
    op.create_table(
        "actions",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("ts", sa.Float, nullable=False),
        sa.Column("incident_id", sa.String(64)),
        sa.Column("kind", sa.String(50), nullable=False),
        sa.Column("target", sa.String(300), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("body", sa.JSON, nullable=False),
    )
    op.create_index("ix_actions_incident", "actions", ["incident_id"])
    op.create_table(
        "diagnoses",
        sa.Column("incident_id", sa.String(64), primary_key=True),
        sa.Column("body", sa.JSON, nullable=False),
    )
    op.create_table(
        "topology",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("body", sa.JSON, nullable=False),
    )


def downgrade() -> None:
    for table in ("topology", "diagnoses", "actions", "incidents", "anomalies", "logs", "events"):
        op.drop_table(table)
