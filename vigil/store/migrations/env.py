"""Alembic environment: run against the connection Vigil hands over (see vigil.store.sql.migrate).

Each revision runs in its own transaction on PostgreSQL, so a revision that builds an index CONCURRENTLY (in an
autocommit block, vigil.store.migrations.create_index_beside_writers) commits only its own changes before the
build; on SQLite the whole upgrade is the one transaction migrate holds."""

from __future__ import annotations

from alembic import context

from vigil.store.schema import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True,
                  transaction_per_migration=True)
with context.begin_transaction():
    context.run_migrations()
