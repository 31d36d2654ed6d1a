"""The store's revisions as the store tests drive them: a database migrated up or down to a revision, the
statements sent meanwhile, and the check that a database stands at the head revision with its events kept."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources

import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

from vigil.store.schema import metadata
from vigil.store.sql import Store


def upgrade_to(conn: sa.Connection, revision: str) -> None:
    """Run the store's migrations on ``conn`` up to ``revision``, committed: a database as an older Vigil left it."""
    command.upgrade(_config(conn), revision)
    conn.commit()


def downgrade_to(conn: sa.Connection, revision: str) -> None:
    """Run the store's downgrades on ``conn`` down to ``revision``, committed."""
    command.downgrade(_config(conn), revision)
    conn.commit()


def _config(conn: sa.Connection) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(resources.files("vigil.store") / "migrations"))
    cfg.attributes["connection"] = conn
    return cfg


@contextmanager
def statements() -> Iterator[list[str]]:
    """Every statement any engine of this process sends while the block runs."""
    sent: list[str] = []

    def record(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        sent.append(" ".join(statement.split()))

    sa.event.listen(sa.Engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        sa.event.remove(sa.Engine, "before_cursor_execute", record)


def head_revision() -> str | None:
    return ScriptDirectory(str(resources.files("vigil.store") / "migrations")).get_current_head()


def assert_at_head_with_the_events_kept(store: Store, rows: int) -> None:
    with store.engine.connect() as conn:
        context = MigrationContext.configure(conn)
        assert context.get_current_revision() == head_revision()
        assert compare_metadata(context, metadata) == []
        assert conn.execute(sa.text("SELECT count(*) FROM events")).scalar_one() == rows
