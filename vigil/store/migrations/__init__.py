"""Alembic migrations of Vigil's relational store."""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op


def create_index_beside_writers(name: str, table: str, columns: Sequence[str], *, unique: bool = False) -> None:
    """``op.create_index`` for a table that may be large and written to while the upgrade runs (events). On
    PostgreSQL the index is built CONCURRENTLY: writers go on while it reads the table, where a plain build
    holds off every INSERT until it ends. A concurrent build cannot run in a transaction, so it runs in an
    autocommit block, which commits the revision's changes before it (each revision has its own transaction,
    migrations/env.py); a build cut short leaves an INVALID index of that name behind, which is dropped first, so
    the revision can run again. On SQLite a build is plain: its writers wait for any write, and the upgrade holds
    the write lock anyway."""
    if op.get_bind().dialect.name != "postgresql":
        op.create_index(name, table, list(columns), unique=unique)
        return
    with op.get_context().autocommit_block():
        op.drop_index(name, table_name=table, if_exists=True, postgresql_concurrently=True)
        op.create_index(name, table, list(columns), unique=unique, postgresql_concurrently=True)
