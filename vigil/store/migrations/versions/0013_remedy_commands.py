"""The back-end commands a remediation run started, with their process group, host and the leader's start time
(``remedy_commands``): a server or engine killed outright (SIGKILL, the OOM killer) runs no exit handler, so the run's
next owner finds its commands here and adopts or kills those still running on its host (``vigil.remedy.commands``).

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if "remedy_commands" in sa.inspect(op.get_bind()).get_table_names():
        return
    op.create_table(
        "remedy_commands",
        sa.Column("marker", sa.String(40), primary_key=True),
        sa.Column("key", sa.String(120), nullable=False),
        sa.Column("owner", sa.String(120), nullable=False),
        sa.Column("kind", sa.String(40), nullable=False),
        sa.Column("argv", sa.JSON, nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer),
        sa.Column("pgid", sa.Integer),
        sa.Column("start_time", sa.BigInteger),
        sa.Column("state", sa.String(20), nullable=False),
        sa.Column("started", sa.Float, nullable=False),
        sa.Column("finished", sa.Float),
        sa.Column("result", sa.Text),
    )
    op.create_index("ix_remedy_commands_key", "remedy_commands", ["key"])


def downgrade() -> None:
    op.drop_index("ix_remedy_commands_key", "remedy_commands")
    op.drop_table("remedy_commands")
