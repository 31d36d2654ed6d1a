"""Events and metric pushes carry the transaction that wrote them (``xid``), so that a consumer reads them in an
order no commit can fall behind. On PostgreSQL row ids come from a sequence at INSERT time while transactions
commit in any order: a reader that moved its cursor past id 11 (committed) never read id 10, committed a moment
later. Readers now go by (xid, id) and pass only transactions older than every one still running (the snapshot's
xmin), which are all finished (vigil.store.sql.Store.events_after).

The column is added with the constant default 0 - PostgreSQL and SQLite change only the table's definition, no row
is rewritten - and the rows stored before keep it; on PostgreSQL the default then becomes the writing transaction's
id (``pg_current_xact_id()``, PostgreSQL 13 or later), so every writer sets it, whatever statement it sends. The
(xid, id) indexes are built beside the writers (CONCURRENTLY on PostgreSQL).

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from vigil.store.migrations import create_index_beside_writers

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

TABLES = ("events", "metric_pushes")
# The writing transaction's 64-bit id (epoch and xid: never wraps around), as a plain bigint.
XACT_ID = "(pg_current_xact_id()::text::bigint)"


def upgrade() -> None:
    bind = op.get_bind()
    for table in TABLES:
        if "xid" not in {c["name"] for c in sa.inspect(bind).get_columns(table)}:
            with op.batch_alter_table(table) as batch:
                batch.add_column(sa.Column("xid", sa.BigInteger, nullable=False, server_default="0"))
        if bind.dialect.name == "postgresql":
            op.execute(f"ALTER TABLE {table} ALTER COLUMN xid SET DEFAULT {XACT_ID}")
    for table in TABLES:
        create_index_beside_writers(f"ix_{table}_xid_id", table, ["xid", "id"])


def downgrade() -> None:
    for table in TABLES:
        op.drop_index(f"ix_{table}_xid_id", table)
        with op.batch_alter_table(table) as batch:
            batch.drop_column("xid")
