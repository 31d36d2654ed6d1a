"""Topology versions of one node: an agent's registration stores its node, not a copy of the whole cluster.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("topology_versions") as batch:
        batch.add_column(sa.Column("node", sa.String(300), nullable=True))
    op.create_index("ix_topology_versions_node_version", "topology_versions", ["node", "version"])


def downgrade() -> None:
    op.drop_index("ix_topology_versions_node_version", "topology_versions")
    with op.batch_alter_table("topology_versions") as batch:
        batch.drop_column("node")
