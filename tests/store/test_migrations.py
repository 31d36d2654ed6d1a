"""The store's revisions on a database that already holds events: the push-key index of revision 0005 is built
beside the writers on PostgreSQL (CONCURRENTLY) and plainly on SQLite, a concurrent build cut short is built
again when the store next opens, and two processes upgrading one database at once both open it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.conftest import REPO, wait_for
from tests.serve.conftest import fresh_database
from tests.serve.conftest import postgres_url as postgres_url
from tests.store.revisions import assert_at_head_with_the_events_kept, downgrade_to, statements, upgrade_to
from vigil.config import settings
from vigil.model import VigilInputError
from vigil.store.sql import MIGRATION_LOCK, Store

# One process opening the store: it prints how many index builds it sent CONCURRENTLY, or fails.
UPGRADER = """
import json, sys
import sqlalchemy as sa
from vigil.store.sql import Store
sent = []
sa.event.listen(sa.Engine, "before_cursor_execute", lambda _c, _k, statement, *_a: sent.append(statement))
Store(sys.argv[1]).close()
print(json.dumps(sum("CONCURRENTLY" in s and s.startswith("CREATE") for s in sent)))
"""


def events_at_revision_0004(url: str, rows: int = 2000) -> None:
    """A database as it stood before the push key: the store's schema at revision 0004, holding events."""
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        upgrade_to(conn, "0004")
        conn.execute(sa.text("INSERT INTO events (ts, entity, kind, source, level, message, attrs) "
                             "VALUES (:ts, 'gpu/n01/0', 'xid', 'kernel', 4, 'Xid 79', '{}')"),
                     [{"ts": float(i)} for i in range(rows)])
        conn.commit()
    engine.dispose()


def push_key_index_is_valid(conn: sa.Connection) -> bool:
    found = conn.execute(sa.text("SELECT indisvalid FROM pg_index WHERE indexrelid = 'ux_events_push_key'::regclass"))
    return bool(found.scalar_one())


def test_the_push_key_index_is_built_concurrently_on_postgresql(postgres_url: str) -> None:
    url = fresh_database(postgres_url, "push_key_concurrently")
    events_at_revision_0004(url)
    with statements() as sent:
        store = Store(url)
    assert "CREATE UNIQUE INDEX CONCURRENTLY ux_events_push_key ON events (push_key)" in sent
    assert_at_head_with_the_events_kept(store, 2000)
    with store.engine.connect() as conn:
        assert push_key_index_is_valid(conn)
    store.close()


def test_a_concurrent_build_cut_short_is_built_again_on_postgresql(postgres_url: str) -> None:
    """Revision 0005 ran up to its index build, which failed (here: two rows sharing a key), so it was never
    recorded: the column is there, and so is an INVALID index of that name. The next open runs it again."""
    url = fresh_database(postgres_url, "push_key_cut_short")
    events_at_revision_0004(url)
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(sa.text("ALTER TABLE events ADD COLUMN push_key VARCHAR(64)"))
        conn.execute(sa.text("UPDATE events SET push_key = 'same' WHERE ts < 2"))
        with pytest.raises(sa.exc.IntegrityError):
            conn.execute(sa.text("CREATE UNIQUE INDEX CONCURRENTLY ux_events_push_key ON events (push_key)"))
        assert not push_key_index_is_valid(conn)
        conn.execute(sa.text("UPDATE events SET push_key = NULL"))
    engine.dispose()
    store = Store(url)
    assert_at_head_with_the_events_kept(store, 2000)
    with store.engine.connect() as conn:
        assert push_key_index_is_valid(conn)
    assert store.add_events(store.events(limit=1), ["k"]) == 1 and store.add_events(store.events(limit=1), ["k"]) == 0
    store.close()


def test_the_push_key_index_is_built_plainly_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'v.db'}"
    events_at_revision_0004(url)
    with statements() as sent:
        store = Store(url)
    assert "CREATE UNIQUE INDEX ux_events_push_key ON events (push_key)" in sent
    assert not any("CONCURRENTLY" in statement for statement in sent)
    assert_at_head_with_the_events_kept(store, 2000)
    store.close()


def test_two_processes_upgrading_from_0004_at_once_both_open_it_on_postgresql(postgres_url: str) -> None:
    """Two processes (`vigil serve --no-engine` and `vigil engine`) start together on a database at revision 0004.
    Both queue for the migration lock (held here until both have asked for it); then one builds 0005's index
    CONCURRENTLY while the other waits. A concurrent build waits for every transaction open when it starts, so a
    waiter that asked for the lock inside a transaction (pg_advisory_lock) and the builder waited for each other:
    PostgreSQL cancelled one upgrade with "deadlock detected". Both now open the database, and each index is built
    once."""
    url = fresh_database(postgres_url, "push_key_two_upgraders")
    events_at_revision_0004(url)
    holder = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with holder.connect() as conn:
        conn.execute(sa.text("SELECT pg_advisory_lock(:lock)"), {"lock": MIGRATION_LOCK})
        upgraders = [subprocess.Popen([sys.executable, "-c", UPGRADER, url], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
        try:
            # both asked for the lock: their sessions' last statement (waiting in it, or a try refused)
            asking = sa.text("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                             "AND pid <> pg_backend_pid() AND query LIKE '%advisory_lock(%'")
            wait_for(lambda: conn.execute(asking).scalar_one() == 2 or any(p.poll() is not None for p in upgraders),
                     60, "both processes to ask for the migration lock")
            conn.execute(sa.text("SELECT pg_advisory_unlock(:lock)"), {"lock": MIGRATION_LOCK})
            answers = [p.communicate(timeout=60) for p in upgraders]
        finally:
            for p in upgraders:
                p.kill()
    holder.dispose()
    assert [p.returncode for p in upgraders] == [0, 0], [err.strip().splitlines()[-1:] for _, err in answers]
    # one built the indexes (0005's, 0007's and 0011's two), the other found them built
    assert sorted(json.loads(out) for out, _ in answers) == [0, 4]
    store = Store(url)
    assert_at_head_with_the_events_kept(store, 2000)
    with store.engine.connect() as conn:
        assert push_key_index_is_valid(conn)
    store.close()


def test_waiting_for_the_migration_lock_ends_naming_its_holder_on_postgresql(
        postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A session holds the migration lock and never lets go (a process stalled mid-upgrade). A process opening the
    store with store_migration_lock_wait_s 0.5 stops after half a second with one line naming the holder's backend
    pid; before, it asked for the lock every 50 ms for good. Once the holder lets go, the store opens."""
    url = fresh_database(postgres_url, "migration_lock_wait")
    monkeypatch.setenv("VIGIL_STORE_MIGRATION_LOCK_WAIT_S", "0.5")
    settings.cache_clear()
    holder = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with holder.connect() as conn:
            conn.execute(sa.text("SELECT pg_advisory_lock(:lock)"), {"lock": MIGRATION_LOCK})
            pid = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
            with pytest.raises(VigilInputError) as stopped:
                Store(url)
            message = str(stopped.value)
            assert len(message.splitlines()) == 1
            assert f"waited 0.5 s for its migration lock, held by PostgreSQL backend pid {pid} (from 127.0.0.1" \
                in message
            assert message.endswith("stop that process, or wait longer (store_migration_lock_wait_s)")
            # the store that could not open left no connection behind (before: the two its upgrade had opened)
            wait_for(lambda: conn.execute(sa.text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid()")).scalar_one() == 0, 10, "the failed opening's connections to end")
            conn.execute(sa.text("SELECT pg_advisory_unlock(:lock)"), {"lock": MIGRATION_LOCK})
        Store(url).close()
    finally:
        holder.dispose()
        settings.cache_clear()


def test_a_retrying_claim_downgraded_below_0014_waits_as_a_failed_one(tmp_path: Path) -> None:
    # revision 0013's servers take only lapsed running claims and know no "retrying": left as it is, the
    # incident would be neither retried nor shown as failed (with Diagnose again) on the server downgraded to
    url = f"sqlite:///{tmp_path / 'v.db'}"
    Store(url).close()
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        conn.execute(sa.text("INSERT INTO diagnosis_claims (incident_id, state, owner, claimed_at, lease_until, "
                             "attempts, error, failures) VALUES ('inc-1', 'retrying', 'a', 1, 2, 1, 'boom', 1), "
                             "('inc-2', 'running', 'a', 1, 2, 1, '', 0)"))
        conn.commit()
        downgrade_to(conn, "0013")
        rows = dict(conn.execute(sa.text("SELECT incident_id, state FROM diagnosis_claims")).all())
        columns = {c["name"] for c in sa.inspect(conn).get_columns("diagnosis_claims")}
    engine.dispose()
    assert rows == {"inc-1": "failed", "inc-2": "running"}
    assert "failures" not in columns


def test_the_command_retention_indexes_go_on_a_downgrade_below_0015_with_every_row_kept(tmp_path: Path) -> None:
    # an abandoned row (revision 0015's retention) is settled for 0014's prune too: kept, pruned by its end
    url = f"sqlite:///{tmp_path / 'v.db'}"
    Store(url).close()
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        conn.execute(sa.text("INSERT INTO remedy_commands (marker, key, owner, kind, argv, host, state, started, "
                             "finished, result) VALUES ('m1', 'k', 'o', 'drain', '[]', 'h', 'abandoned', 1, 2, 'x'), "
                             "('m2', 'k', 'o', 'drain', '[]', 'h', 'running', 1, NULL, NULL)"))
        conn.commit()
        downgrade_to(conn, "0014")
        rows = dict(conn.execute(sa.text("SELECT marker, state FROM remedy_commands")).all())
        indexes = {index["name"] for index in sa.inspect(conn).get_indexes("remedy_commands")}
        upgrade_to(conn, "head")
        indexes_again = {index["name"] for index in sa.inspect(conn).get_indexes("remedy_commands")}
    engine.dispose()
    assert rows == {"m1": "abandoned", "m2": "running"}
    assert indexes == {"ix_remedy_commands_key"}
    assert indexes_again == {"ix_remedy_commands_key", "ix_remedy_commands_finished",
                             "ix_remedy_commands_state_started"}
