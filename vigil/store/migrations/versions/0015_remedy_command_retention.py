"""Indexes for the retention of the back-end commands' records (``vigil.remedy.commands``): settled rows are deleted
by when they ended (``prune_settled``: ``finished``), rows left open past the kept age are found by their state and
start (``abandon_unsettled``: ``state``, ``started``) - each query read the whole table before, hourly. Rows marked
``abandoned`` stay as they are on a downgrade: 0014 prunes every row not starting or running by its ``finished``.

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

INDEXES = {"ix_remedy_commands_finished": ["finished"], "ix_remedy_commands_state_started": ["state", "started"]}


def upgrade() -> None:
    present = {index["name"] for index in sa.inspect(op.get_bind()).get_indexes("remedy_commands")}
    for name, columns in INDEXES.items():
        if name not in present:
            op.create_index(name, "remedy_commands", columns)


def downgrade() -> None:
    for name in INDEXES:
        op.drop_index(name, "remedy_commands")
