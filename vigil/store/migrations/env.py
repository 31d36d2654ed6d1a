"""Alembic environment: run against the connection Vigil hands over (see vigil.store.sql.migrate)."""

from __future__ import annotations

from alembic import context

from vigil.store.schema import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
