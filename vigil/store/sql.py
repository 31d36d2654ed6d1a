"""The relational store: events, logs, anomalies, incidents, actions, diagnoses and topology.

SQLAlchemy Core on SQLite (a file under ./.vigil by default) or PostgreSQL (by URL). The schema is owned
by alembic migrations, applied when the store opens. Every write commits before it returns, and a batch is
validated as a whole before anything is written, so a bad record never costs what was already stored.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple

from alembic import command
from alembic.config import Config
from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Connection,
    Engine,
    Integer,
    Table,
    any_,
    bindparam,
    case,
    create_engine,
    delete,
    event,
    func,
    insert,
    literal,
    literal_column,
    or_,
    select,
    text,
    true,
    tuple_,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from vigil.config import Settings
from vigil.config import settings as default_settings
from vigil.model import (
    Action,
    ActionStatus,
    Anomaly,
    Diagnosis,
    Event,
    FaultLevel,
    IdempotencyKeyReused,
    Incident,
    IncidentMemory,
    IncidentStatus,
    Job,
    LogRecord,
    Node,
    Sample,
    Topology,
    VigilConflictError,
    VigilInputError,
    parse_entity,
)
from vigil.store import schema as t

_migrate_lock = threading.Lock()
# The PostgreSQL advisory lock every Vigil process takes to upgrade a database's schema ("vigi" in ASCII).
MIGRATION_LOCK = 0x76696769
# How often a process waiting for another's upgrade asks for the migration lock again, in seconds.
MIGRATION_LOCK_POLL_S = 0.05
log = logging.getLogger("vigil.store")

# Old metric-push keys are dropped at most once per this share of push_key_window_s (a key is kept for the window
# and at most this share more).
PUSH_KEY_PRUNE_EVERY = 0.1
# How many ids of a table one transaction of Store.renumber_moved renumbers: each holds its rows' locks that long.
RENUMBER_BATCH = 20_000
# The statuses of a stored action still waiting for its verdict; a verdict (executed, skipped, refused, failed) is
# final, and no later write takes its place.
OPEN_ACTION_STATUSES = frozenset({ActionStatus.PROPOSED, ActionStatus.APPROVED})
# the verdicts of a run that a retry of the action may follow: the retry's verdict replaces them (settle_action keeps
# each replaced one in params.earlier_verdicts)
RETRIED_STATUSES = frozenset({ActionStatus.REFUSED, ActionStatus.SKIPPED, ActionStatus.FAILED})
# the newest replaced verdicts an action keeps (params.earlier_verdicts); older ones are counted in
# params.earlier_verdicts_dropped, so an action retried without end does not grow without end
EARLIER_VERDICTS_KEPT = 20
# the lease of a diagnosis claim its owner gave up before running it: lapsed on every server's clock, and never
# renewed again
RELEASED = 0.0
# Node labels that place a node in the fabric (the Kubernetes well-known topology labels' style).
RACK_LABEL = "topology.vigil.io/rack"
SWITCH_LABEL = "topology.vigil.io/leaf"
# Node versions written before the topology is written whole again, at the least (see Store.register_node).
WHOLE_AFTER = 64


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.close()


def migrate(engine: Engine, lock_wait_s: float | None = None) -> None:
    """Bring the schema to the latest alembic revision. Processes opening one database at once (``vigil serve
    --no-engine`` beside ``vigil engine``) upgrade it one after the other: each holds the database's migration lock
    from before it reads the revision until its upgrade is committed, so the second finds the schema at the
    revision the first left instead of running the same changes again. On PostgreSQL the wait for the lock lasts
    at most ``lock_wait_s`` (default: the setting store_migration_lock_wait_s)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(resources.files("vigil.store") / "migrations"))
    with _migrate_lock, engine.connect() as conn:
        cfg.attributes["connection"] = conn
        if engine.dialect.name != "postgresql":
            with conn.begin():
                # SQLite: the write lock now, not at the first change (a reader's snapshot shows the old revision)
                conn.exec_driver_sql("BEGIN IMMEDIATE")
                command.upgrade(cfg, "head")
            return
        wait_s = default_settings().store_migration_lock_wait_s if lock_wait_s is None else lock_wait_s
        with _migration_lock(engine, wait_s):
            try:
                command.upgrade(cfg, "head")
            finally:
                conn.rollback()


@contextmanager
def _migration_lock(engine: Engine, wait_s: float) -> Iterator[None]:
    """PostgreSQL's migration lock: a lock of a session, not of a transaction, since each revision commits its own
    (migrations/env.py). It is asked for again and again outside any transaction, because a revision that builds an
    index CONCURRENTLY waits for every transaction open when it starts: a process waiting in pg_advisory_lock (a
    transaction) and the holder building the index would each wait for the other. After ``wait_s`` the wait ends
    with one line naming the session that holds it (a process stalled mid-upgrade would otherwise hold every other
    one up for good)."""
    with engine.connect() as lock:
        lock.execution_options(isolation_level="AUTOCOMMIT")
        deadline = time.monotonic() + wait_s
        while not lock.execute(text("SELECT pg_try_advisory_lock(:lock)"), {"lock": MIGRATION_LOCK}).scalar_one():
            if time.monotonic() >= deadline:
                raise VigilInputError(
                    f"cannot open the store at {engine.url.render_as_string(hide_password=True)!r}: waited "
                    f"{wait_s:g} s for its migration lock, held by {_lock_holder(lock)}, which is upgrading the "
                    "schema or stalled doing so; stop that process, or wait longer (store_migration_lock_wait_s)")
            time.sleep(MIGRATION_LOCK_POLL_S)
        try:
            yield
        finally:
            lock.execute(text("SELECT pg_advisory_unlock(:lock)"), {"lock": MIGRATION_LOCK})


def _lock_holder(conn: Connection) -> str:
    """The session holding the migration lock, as pg_locks and pg_stat_activity name it."""
    holder = conn.execute(text(
        "SELECT l.pid, a.application_name, a.client_addr, a.backend_start FROM pg_locks l "
        "LEFT JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE l.locktype = 'advisory' AND l.granted AND l.classid::bigint = 0 AND l.objid::bigint = :lock "
        "AND l.objsubid = 1 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"),
        {"lock": MIGRATION_LOCK}).first()
    if holder is None:
        return "a session that let it go as the wait ended"
    client = f"from {holder.client_addr}" if holder.client_addr else "over a local socket"
    application = f", application {holder.application_name!r}" if holder.application_name else ""
    since = f", connected {holder.backend_start:%Y-%m-%d %H:%M:%S %Z}" if holder.backend_start else ""
    return f"PostgreSQL backend pid {holder.pid} ({client}{application}{since})"


def open_database(url: str, lock_wait_s: float | None = None) -> Engine:
    """An engine on the database at ``url`` (an SQLite file's directory made where missing), its schema brought to
    the latest revision. Every table of Vigil's database is under the revisions, the remedy package's included."""
    try:
        if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
            Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise VigilInputError(f"cannot create the store at {url!r}: {err.strerror or err}") from None
    try:
        engine = create_engine(url, future=True, pool_pre_ping=True)
    except (SQLAlchemyError, ValueError) as err:
        raise VigilInputError(f"bad database URL {url!r}: {err}") from None
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
    try:
        migrate(engine, lock_wait_s)
    except BaseException as err:
        engine.dispose()  # the caller gets no engine to close: the connections the upgrade opened end here
        if isinstance(err, SQLAlchemyError):
            raise VigilInputError(f"cannot open the store at {url!r}: {str(err).splitlines()[0]}") from None
        raise
    return engine


class DiagnosisClaim(NamedTuple):
    """A background diagnosis of one incident: ``state`` running (held by ``owner`` until ``lease_until``), done,
    retrying (failed ``failures`` times, ``error`` says why, due again at ``lease_until``) or failed (for good)."""

    incident_id: str
    state: str
    owner: str
    claimed_at: float
    lease_until: float
    attempts: int
    error: str
    failures: int = 0


class Store:
    def __init__(self, url: str, push_key_window_s: float | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        """``push_key_window_s``: how long a metric push's key is kept (default: the setting of that name);
        ``clock``: the time keys are stamped with and forgotten by."""
        self.url = url
        self.engine = open_database(url)
        self.closed = False
        self._whole_cache: tuple[int, dict[str, dict[str, Any]]] | None = None
        self.push_key_window_s = (default_settings().push_key_window_s if push_key_window_s is None
                                  else push_key_window_s)
        self.clock = clock
        self._next_key_prune = float("-inf")

    def close(self) -> None:
        self.closed = True
        self.engine.dispose()

    # ---------------------------------------------------------------- events and logs

    def add_events(self, events: Iterable[Event], keys: Sequence[str | None] | None = None) -> int:
        """Store events; returns how many were written. ``keys`` (one per event, or None for an event without one)
        name events a push may send again: an event whose key is stored already, or came earlier in the batch, is
        not written again."""
        return sum(self.add_events_once(events, keys))

    def add_events_once(self, events: Iterable[Event], keys: Sequence[str | None] | None = None) -> list[bool]:
        """``add_events`` saying which events were written: one flag per event, False for one whose key was stored
        already or came earlier in the batch."""
        items = _validated(Event, events)
        if keys is not None and len(keys) != len(items):
            raise VigilInputError(f"{len(keys)} push keys for {len(items)} events")
        rows = [{"ts": e.ts, "entity": e.entity, "kind": e.kind, "source": e.source, "level": int(e.level),
                 "message": e.message, "attrs": e.attrs, "push_key": None if keys is None else keys[i]}
                for i, e in enumerate(items)]
        if not rows:
            return []
        # The unique key skips a stored event, one repeated in the batch and one a racing push stored first; the
        # keys the insert returns say what it wrote (PEP 249 leaves an executemany's rowcount undefined, and
        # psycopg's did not count the skipped rows).
        statement = _insert_ignoring_duplicates(self.engine.dialect.name, t.events)
        with self.engine.begin() as conn:
            new_keys = {r.push_key for r in conn.execute(statement, rows) if r.push_key is not None}
        written = []
        for row in rows:
            key = row["push_key"]
            written.append(key is None or key in new_keys)
            new_keys.discard(key)  # a key repeated later in the batch was not written again
        return written

    def held_event_keys(self, keys: Iterable[str]) -> set[str]:
        """Which of ``keys`` a stored event holds as its push key."""
        wanted = sorted(set(keys))
        held: set[str] = set()
        with self.engine.connect() as conn:
            for start in range(0, len(wanted), 500):  # bounded IN lists
                chunk = wanted[start:start + 500]
                held.update(conn.execute(select(t.events.c.push_key).where(t.events.c.push_key.in_(chunk))).scalars())
        return held

    def events(self, entity: str | None = None, kind: str | None = None, since: float | None = None,
               until: float | None = None, limit: int = 1000, entities: Collection[str] | None = None,
               ) -> list[Event]:
        """Events in time order (at most ``limit``, the first by time); with ``entities``, only those of these
        entities, selected in the database through ``ix_events_entity_ts`` (a diagnosis reads the few entities of
        its incident's footprint out of a window holding tens of thousands of events across the cluster)."""
        q = select(t.events)
        if entity is not None:
            q = q.where(t.events.c.entity == entity)
        if kind is not None:
            q = q.where(t.events.c.kind == kind)
        if since is not None:
            q = q.where(t.events.c.ts >= since)
        if until is not None:
            q = q.where(t.events.c.ts <= until)
        with self.engine.connect() as conn:
            return [Event(ts=r.ts, entity=r.entity, kind=r.kind, source=r.source, level=FaultLevel(r.level),
                          message=r.message, attrs=r.attrs)
                    for r in _of_entities(conn, q, t.events, entities, limit)]

    def add_logs(self, records: Iterable[LogRecord]) -> int:
        rows = [{"ts": r.ts, "entity": r.entity, "source": r.source, "line": r.line, "lineno": r.lineno}
                for r in _validated(LogRecord, records)]
        if rows:
            with self.engine.begin() as conn:
                conn.execute(insert(t.logs), rows)
        return len(rows)

    def logs(self, entity: str | None = None, contains: str | None = None, since: float | None = None,
             until: float | None = None, limit: int = 1000, entities: Collection[str] | None = None,
             ) -> list[LogRecord]:
        """Log lines in time order (at most ``limit``); ``entity`` takes the lines of it and of what sits under
        it, ``entities`` only those of exactly these entities (selected in the database, ``ix_logs_entity_ts``)."""
        q = select(t.logs)
        if entity is not None:
            q = q.where((t.logs.c.entity == entity) | t.logs.c.entity.startswith(entity.rstrip("/") + "/"))
        if contains:
            q = q.where(t.logs.c.line.contains(contains, autoescape=True))
        if since is not None:
            q = q.where(t.logs.c.ts >= since)
        if until is not None:
            q = q.where(t.logs.c.ts <= until)
        with self.engine.connect() as conn:
            return [LogRecord(ts=r.ts, entity=r.entity, source=r.source, line=r.line, lineno=r.lineno)
                    for r in _of_entities(conn, q, t.logs, entities, limit)]

    def events_after(self, after: ReadPosition | int, limit: int = 10_000) -> list[tuple[ReadPosition, Event]]:
        """Events in read order after ``after`` (a position this returned, or a row id: see ``ReadPosition``), each
        with its position: what a consumer reads with a cursor. No event read later sorts before one read now, so
        a consumer that keeps the last position it read misses none and reads none twice."""
        q = _read_after(self.engine.dialect.name, t.events, after).limit(limit)
        with self.engine.connect() as conn:
            return [(ReadPosition(int(r.xid), int(r.id)),
                     Event(ts=r.ts, entity=r.entity, kind=r.kind, source=r.source, level=FaultLevel(r.level),
                           message=r.message, attrs=r.attrs))
                    for r in conn.execute(q)]

    def events_read(self, after: ReadPosition | int, limit: int = 10_000, skip: Collection[ReadPosition] = (),
                    settled_only: bool = False) -> list[tuple[ReadPosition, Event, bool]]:
        """Every committed event after ``after`` in read order, each with its position and whether it is settled:
        its transaction older than every one still running (``ReadPosition``), so no row can commit before it any
        more. The settled ones come first. A consumer may judge the others at once, keeping its position at the last
        settled one and remembering the others' positions so as not to judge them again (``Engine``): those in
        ``skip`` are left out while unsettled, and with ``settled_only`` every unsettled row. All settled on
        SQLite."""
        with self.engine.connect() as conn:
            return [(ReadPosition(int(r.xid), int(r.id)),
                     Event(ts=r.ts, entity=r.entity, kind=r.kind, source=r.source, level=FaultLevel(r.level),
                           message=r.message, attrs=r.attrs), bool(r.settled))
                    for r in conn.execute(_read_ahead(self.engine.dialect.name, t.events, after, skip, settled_only)
                                          .limit(limit))]

    def position_of(self, table: str, row_id: int) -> ReadPosition:
        """The position of a cursor saved as a row id alone (before revision 0011) in ``table`` ("events" or
        "metric_pushes"): the last of the rows up to that id in read order, so a cursor saved by an engine that read
        rows written since 0011 by their ids reads on after them; (0, ``row_id``) where no such row was written
        (every row since has a higher xid), and always on SQLite."""
        rows = t.metadata.tables[table]
        if self.engine.dialect.name != "postgresql" or row_id <= 0:
            return ReadPosition(0, row_id)
        with self.engine.connect() as conn:
            last = conn.execute(select(rows.c.xid, rows.c.id).where(rows.c.id <= row_id, rows.c.xid > 0)
                                .order_by(rows.c.xid.desc(), rows.c.id.desc()).limit(1)).first()
        return ReadPosition(0, row_id) if last is None else ReadPosition(int(last.xid), int(last.id))

    def next_xid(self) -> int | None:
        """The xid the PostgreSQL server gives next (the current snapshot's xmax: every xid it has given lies below);
        None on SQLite. A read position at or past it was saved on another server (``renumber_moved``)."""
        if self.engine.dialect.name != "postgresql":
            return None
        with self.engine.connect() as conn:
            return int(conn.execute(text("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint")).scalar_one())

    def renumber_moved(self, table: str, position: ReadPosition, remembered: Collection[ReadPosition] = (),
                       progress: Callable[[], None] | None = None) -> tuple[ReadPosition, set[ReadPosition]] | None:
        """Place a read position in ``table`` ("events" or "metric_pushes") saved on another PostgreSQL server (the
        store moved by pg_dump/pg_restore or a logical-replication cutover: rows keep the xids the old server gave
        them, the new server's counter runs lower): its xid at or past the current snapshot's xmax, which no
        transaction of this server has reached. The rows read - at or before it in read order, the old server's
        (an xid past xmax, or 0) or, finished, no later in id - get xid 0, every other row of a finished transaction
        (or of the old server) xid 1, those of transactions still running keep theirs. Returns the position in the
        new order (0, the last id read) and ``remembered`` (positions read past it) as renumbered; None where
        nothing moved, and always on SQLite.

        One snapshot fixes what is renumbered (its xmin, its xmax, the highest id it sees: a row written later has a
        higher id and is left as written); the UPDATEs then go ``RENUMBER_BATCH`` ids a transaction, each holding
        its rows' locks for its own span only (1,000,000 events in one transaction held them for 50 s, and any
        row deleted meanwhile - retention - failed the whole of it: bench/renumber.py). Only rows not renumbered yet
        (an xid of 2 or more; PostgreSQL gives none below 3) are touched, so a renumbering cut short (the engine
        killed, the server restarting) is finished by the next, which reads the position still saved. ``progress``
        is called after each span (the engine's loop marks its progress: a big table's renumbering is no hung loop)."""
        if self.engine.dialect.name != "postgresql":
            return None
        rows = t.metadata.tables[table]
        with self.engine.connect() as conn:
            xmin, xmax, top = conn.execute(select(
                literal_column("pg_snapshot_xmin(pg_current_snapshot())::text::bigint", BigInteger),
                literal_column("pg_snapshot_xmax(pg_current_snapshot())::text::bigint", BigInteger),
                select(func.coalesce(func.max(rows.c.id), 0)).scalar_subquery())).one()
        if position.xid < xmax:
            return None
        finished = or_(rows.c.xid < xmin, rows.c.xid >= xmax)
        read = (_read_key(rows) <= _at(position)) & or_(
            rows.c.xid >= xmax, (rows.c.id <= position.id) & (rows.c.xid < xmin))
        for low in range(0, int(top), RENUMBER_BATCH):
            span = (rows.c.id > low) & (rows.c.id <= low + RENUMBER_BATCH) & (rows.c.xid >= 2)
            self._renumber_span(rows, span, read, finished)
            if progress is not None:
                progress()
        with self.engine.connect() as conn:
            last = conn.execute(select(func.max(rows.c.id)).where(rows.c.xid == 0, rows.c.id <= top)).scalar()
            ids = [p.id for p in remembered]
            moved = {ReadPosition(int(r.xid), int(r.id))
                     for r in conn.execute(select(rows.c.xid, rows.c.id).where(rows.c.id.in_(ids)))} if ids else set()
        return ReadPosition(0, max(int(last or 0), position.id)), moved

    def _renumber_span(self, rows: Table, span: Any, read: Any, finished: Any) -> None:
        """One transaction of ``renumber_moved``: the rows of ``span`` read get xid 0, the other finished ones 1."""
        with self.engine.begin() as conn:
            conn.execute(update(rows).where(span, or_(read, finished))
                         .values(xid=case((read, literal(0, BigInteger)), else_=literal(1, BigInteger))))

    def held_back(self, events_after: ReadPosition | int, pushes_after: ReadPosition | int) -> int | None:
        """The xid of the transaction holding reads back when events or pushes after these positions are committed
        but not yet readable, since it, older, still runs (``ReadPosition``); None when none waits, and always on
        SQLite."""
        if self.engine.dialect.name != "postgresql":
            return None
        waiting = [select(table.c.id).where(_read_key(table) > _at(after),
                                            table.c.xid >= _SNAPSHOT_XMIN).limit(1).exists()
                   for table, after in ((t.events, events_after), (t.metric_pushes, pushes_after))]
        with self.engine.connect() as conn:
            row = conn.execute(select(waiting[0] | waiting[1], _SNAPSHOT_XMIN)).one()
        return int(row[1]) if row[0] else None

    def oldest_writer(self) -> str:
        """The session whose transaction holds reads back on PostgreSQL (the oldest one running that wrote), as
        pg_stat_activity names it."""
        with self.engine.connect() as conn:
            row = conn.execute(text(
                "SELECT pid, datname, application_name, client_addr, xact_start, state FROM pg_stat_activity "
                "WHERE backend_xid = xid(pg_snapshot_xmin(pg_current_snapshot()))")).first()
        if row is None:
            return "a transaction that has ended, or a prepared one (pg_prepared_xacts)"
        client = f"from {row.client_addr}" if row.client_addr else "over a local socket"
        application = f", application {row.application_name!r}" if row.application_name else ""
        since = f", transaction begun {row.xact_start:%Y-%m-%d %H:%M:%S %Z}" if row.xact_start else ""
        return (f"PostgreSQL backend pid {row.pid} (database {row.datname!r}, {client}{application}{since}, "
                f"{row.state})")

    # ---------------------------------------------------------------- agents' metric pushes

    def add_samples(self, node: str, samples: Iterable[Sample], key: str | None = None,
                    body_digest: str | None = None) -> int:
        """One agent push: the node's latest samples, kept as one row (a consumer reads them in order); returns how
        many were written. ``key`` names a push its sender may send again: a push whose key was stored in the last
        ``push_key_window_s`` (``metric_push_keys``, kept however soon the engine prunes the push itself), or
        whose push is still held, is not written again (0). ``body_digest`` says what a keyed push holds: a push
        under a key stored with another digest is not the push sent again but another under a reused key, and
        raises IdempotencyKeyReused, nothing written."""
        items = _validated(Sample, samples)
        if not items:
            return 0
        # A NaN loss is news, and JSON (PostgreSQL's above all) has no NaN: non-finite values go as text.
        points = [[s.metric, s.entity, s.value if math.isfinite(s.value) else str(s.value)] for s in items]
        row = {"ts": max(s.ts for s in items), "node": node, "points": points, "push_key": key}
        dialect = self.engine.dialect.name
        now = self.clock()
        with self.engine.begin() as conn:
            if key is not None:
                new_key = conn.execute(_insert_ignoring_duplicates(dialect, t.metric_push_keys),
                                       {"push_key": key, "stored_at": now, "body_digest": body_digest}).first()
                if new_key is None:
                    held = conn.execute(select(t.metric_push_keys.c.body_digest)
                                        .where(t.metric_push_keys.c.push_key == key)).scalar()
                    if held is not None and body_digest is not None and held != body_digest:
                        raise IdempotencyKeyReused(f"push key {key} was stored with other samples")
                    return 0
            written = conn.execute(_insert_ignoring_duplicates(dialect, t.metric_pushes), row).all()
        if key is not None:
            self._forget_push_keys(now)
        return len(items) if written else 0

    def _forget_push_keys(self, now: float) -> None:
        """Drop the push keys stored more than ``push_key_window_s`` before ``now``, at most once every
        ``PUSH_KEY_PRUNE_EVERY`` of the window, in a transaction of its own after the push's (which holds no lock
        while it runs; two servers pruning at once delete the same rows, one after the other). A prune that fails
        (a deadlock, a busy database) is logged and left to the next keyed push: the push it follows is stored, and
        its sender must not be told otherwise and send it again."""
        if now < self._next_key_prune:
            return
        self._next_key_prune = now + self.push_key_window_s * PUSH_KEY_PRUNE_EVERY
        try:
            with self.engine.begin() as conn:
                conn.execute(delete(t.metric_push_keys).where(
                    t.metric_push_keys.c.stored_at < now - self.push_key_window_s))
        except SQLAlchemyError as err:
            self._next_key_prune = float("-inf")
            log.warning("dropping push keys older than %g s failed (%s); the next keyed push tries again",
                        self.push_key_window_s, str(err).splitlines()[0])

    def pushes_after(self, after: ReadPosition | int, limit: int = 10_000) -> list[MetricPush]:
        """Metric pushes in read order after ``after``, as ``events_after`` reads events (``MetricPush.position``)."""
        q = _read_after(self.engine.dialect.name, t.metric_pushes, after).limit(limit)
        with self.engine.connect() as conn:
            return [_push(r) for r in conn.execute(q)]

    def pushes_read(self, after: ReadPosition | int, limit: int = 10_000, skip: Collection[ReadPosition] = (),
                    settled_only: bool = False) -> list[tuple[MetricPush, bool]]:
        """Every committed metric push after ``after`` in read order, with whether it is settled, as ``events_read``
        reads events."""
        with self.engine.connect() as conn:
            return [(_push(r), bool(r.settled))
                    for r in conn.execute(_read_ahead(self.engine.dialect.name, t.metric_pushes, after, skip,
                                                      settled_only).limit(limit))]

    def prune_pushes(self, up_to_id: int) -> None:
        """Drop pushes every consumer has read (they live on in the metric store or Prometheus)."""
        with self.engine.begin() as conn:
            conn.execute(delete(t.metric_pushes).where(t.metric_pushes.c.id <= up_to_id))

    def latest_pushes(self, up_to: ReadPosition | int, since: float, limit: int = 10_000) -> list[MetricPush]:
        """The newest ``limit`` pushes up to the position ``up_to`` stamped at ``since`` or after, in read order:
        what a consumer that read up to ``up_to`` replays after a restart."""
        c = t.metric_pushes.c
        dialect = self.engine.dialect.name
        q = (select(t.metric_pushes).where(_up_to(dialect, t.metric_pushes, up_to), c.ts >= since)
             .order_by(*(column.desc() for column in _read_order(dialect, t.metric_pushes))).limit(limit))
        with self.engine.connect() as conn:
            rows = list(conn.execute(q))
        return [_push(r) for r in reversed(rows)]

    def prune_pushes_outside(self, up_to: ReadPosition | int, older_than: float, newer_than: float,
                             limit: int = 10_000) -> int:
        """Drop at most ``limit`` of the pushes up to the position ``up_to`` (read by every consumer) stamped before
        ``older_than`` or after ``newer_than``, first read first; returns how many. Their keys stay in
        ``metric_push_keys`` for ``push_key_window_s`` however soon a push is dropped."""
        c = t.metric_pushes.c
        dialect = self.engine.dialect.name
        doomed = (select(c.id).where(_up_to(dialect, t.metric_pushes, up_to),
                                     (c.ts < older_than) | (c.ts > newer_than))
                  .order_by(*_read_order(dialect, t.metric_pushes)).limit(limit))
        with self.engine.begin() as conn:
            return int(conn.execute(delete(t.metric_pushes).where(c.id.in_(doomed))).rowcount or 0)

    # ---------------------------------------------------------------- consumer cursors

    def cursor(self, name: str) -> tuple[float, dict[str, Any]]:
        with self.engine.connect() as conn:
            row = conn.execute(select(t.cursors).where(t.cursors.c.name == name)).first()
        return (float(row.position), dict(row.state)) if row else (0.0, {})

    def set_cursor(self, name: str, position: float, state: dict[str, Any],
                   lease: tuple[str, str, float] | None = None) -> None:
        """Write the cursor ``name``; with ``lease`` (its name, the owner, when it lapses) only while that owner
        holds it, renewed in the same transaction - else LeaseLost, nothing written: an engine that stalled past its
        lease while another took over cannot move the cursor from under it."""
        with self.engine.begin() as conn:
            if lease is not None:
                self._renew(conn, *lease)
            done = conn.execute(update(t.cursors).where(t.cursors.c.name == name)
                                .values(position=position, state=state))
            if done.rowcount == 0:
                conn.execute(insert(t.cursors).values(name=name, position=position, state=state))

    def take_lease(self, name: str, owner: str, now: float, expires: float, gone: Callable[[str], bool]) -> bool:
        """Take or renew the lease ``name`` (a row of ``cursors``: its position when it lapses, its state the owner)
        for ``owner`` until ``expires``: one compare-and-set UPDATE that wins while it is ``owner``'s already, has
        lapsed by ``now``, or its owner is ``gone`` (a process of this host that has ended), as the remediator's
        claims are taken (vigil.remedy.audit.AuditLog.claim); the first taker inserts the row. True for one owner
        at a time."""
        holder = self.lease_holder(name)
        if holder is None:
            with self.engine.begin() as conn:
                written = conn.execute(_insert_ignoring_name(self.engine.dialect.name).values(
                    name=name, position=expires, state={"owner": owner})).first()
            if written is not None:
                return True
            holder = self.lease_holder(name)
            if holder is None:
                return False
        seen, lapses = holder
        if seen != owner and lapses >= now and not gone(seen):
            return False
        with self.engine.begin() as conn:
            done = conn.execute(update(t.cursors).where(t.cursors.c.name == name,
                                                        t.cursors.c.state["owner"].as_string() == seen,
                                                        t.cursors.c.position == lapses)
                                .values(position=expires, state={"owner": owner}))
            return done.rowcount == 1

    def renew_lease(self, name: str, owner: str, expires: float) -> None:
        """Extend ``owner``'s lease ``name`` until ``expires``, lapsed or not, while no other owner has taken it since
        (even one that has given it up again); else LeaseLost."""
        with self.engine.begin() as conn:
            self._renew(conn, name, owner, expires)

    def _renew(self, conn: Connection, name: str, owner: str, expires: float) -> None:
        held = conn.execute(update(t.cursors).where(t.cursors.c.name == name,
                                                    t.cursors.c.state["owner"].as_string() == owner)
                            .values(position=expires))
        if held.rowcount != 1:
            holder = self.lease_holder(name, conn)
            raise LeaseLost(f"the lease {name} is {holder[0] if holder else 'no one'}'s now, not {owner}'s")

    def lease_holder(self, name: str, conn: Connection | None = None) -> tuple[str, float] | None:
        """Who holds the lease ``name`` and until when (None: never taken)."""
        q = select(t.cursors.c.state, t.cursors.c.position).where(t.cursors.c.name == name)
        if conn is None:
            with self.engine.connect() as own:
                row = own.execute(q).first()
        else:
            row = conn.execute(q).first()
        return None if row is None else (str(dict(row.state).get("owner", "")), float(row.position))

    def release_lease(self, name: str, owner: str) -> None:
        """End ``owner``'s lease ``name`` now (a clean stop): another takes it without waiting for it to lapse."""
        with self.engine.begin() as conn:
            conn.execute(update(t.cursors).where(t.cursors.c.name == name,
                                                 t.cursors.c.state["owner"].as_string() == owner)
                         .values(position=0.0))

    # ---------------------------------------------------------------- anomalies and incidents

    def add_anomalies(self, anomalies: Iterable[Anomaly]) -> int:
        items = _validated(Anomaly, anomalies)
        rows = [{"id": a.id, "entity": a.entity, "start": a.start, "end": a.end, "detector": a.detector,
                 "fault_type": a.fault_type, "level": int(a.level), "body": a.model_dump(mode="json")} for a in items]
        if rows:
            with self.engine.begin() as conn:
                conn.execute(delete(t.anomalies).where(t.anomalies.c.id.in_([r["id"] for r in rows])))
                conn.execute(insert(t.anomalies), rows)
        return len(rows)

    def anomalies(self, entity: str | None = None, since: float | None = None, limit: int = 1000,
                  ids: Collection[str] | None = None) -> list[Anomaly]:
        """Anomalies by start time (at most ``limit``, the first), those ending at or after ``since``; with ``ids``,
        only those, looked up by id in the database (an incident's few among the window's whole cluster). Equal
        starts keep the order they were stored in on SQLite."""
        q = select(t.anomalies.c.body, t.anomalies.c.start)
        if self.engine.dialect.name == "sqlite":
            q = q.add_columns(literal_column("anomalies.rowid").label("stored"))
        if entity is not None:
            q = q.where(t.anomalies.c.entity == entity)
        if since is not None:
            q = q.where(t.anomalies.c.end >= since)
        order = [t.anomalies.c.start, *([literal_column("stored")] if self.engine.dialect.name == "sqlite" else [])]
        with self.engine.connect() as conn:
            if ids is None:
                rows = list(conn.execute(q.order_by(*order).limit(limit)))
            else:
                wanted = sorted(set(ids))
                rows = [r for start in range(0, len(wanted), ENTITY_CHUNK)
                        for r in conn.execute(q.where(t.anomalies.c.id.in_(wanted[start:start + ENTITY_CHUNK])))]
                rows.sort(key=lambda r: (r.start, *r[2:]))
                del rows[limit:]
            return [Anomaly.model_validate(r.body) for r in rows]

    def upsert_incident(self, incident: Incident) -> None:
        """The engine's own write: an incident it grouped grows as its anomalies do."""
        row = _incident_row(_validated(Incident, [incident])[0])
        with self.engine.begin() as conn:
            done = conn.execute(update(t.incidents).where(t.incidents.c.id == row["id"]).values(**row))
            if done.rowcount == 0:
                conn.execute(insert(t.incidents).values(**row))

    def create_incident(self, incident: Incident) -> None:
        """Create-only: an incident with an id already stored is refused, never replaced."""
        row = _incident_row(_validated(Incident, [incident])[0])
        try:
            with self.engine.begin() as conn:
                conn.execute(insert(t.incidents).values(**row))
        except IntegrityError:
            raise VigilConflictError(f"incident {row['id']!r} already exists; change it through its own routes "
                                     "(status, diagnosis)") from None

    def set_incident_status(self, incident_id: str, status: IncidentStatus, by: str) -> Incident:
        """Move an incident to ``status`` and record who did it as an ``incident_status`` event (the audit)."""
        with self.engine.begin() as conn:
            row = conn.execute(select(t.incidents.c.body).where(t.incidents.c.id == incident_id)).first()
            if row is None:
                raise KeyError(incident_id)
            incident = Incident.model_validate(row.body)
            before, incident.status = incident.status, status
            conn.execute(update(t.incidents).where(t.incidents.c.id == incident_id).values(**_incident_row(incident)))
            conn.execute(insert(t.events).values(
                ts=time.time(), entity=incident.scope, kind="incident_status", source="api", level=0,
                message=f"incident {incident_id} {before.value} -> {status.value} by {by}",
                attrs={"incident_id": incident_id, "from": before.value, "to": status.value, "by": by}))
        return incident

    def incidents(self, status: IncidentStatus | str | None = None, limit: int = 1000) -> list[Incident]:
        q = select(t.incidents.c.body).order_by(t.incidents.c.start.desc()).limit(limit)
        if status is not None:
            q = q.where(t.incidents.c.status == IncidentStatus(status).value)
        with self.engine.connect() as conn:
            return [Incident.model_validate(r.body) for r in conn.execute(q)]

    def incident(self, incident_id: str) -> Incident | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(t.incidents.c.body).where(t.incidents.c.id == incident_id)).first()
        return Incident.model_validate(row.body) if row else None

    def count_incidents(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(t.incidents)).scalar_one())

    # ---------------------------------------------------------------- actions and diagnoses

    def add_action(self, action: Action) -> None:
        action = _validated(Action, [action])[0]
        with self.engine.begin() as conn:
            conn.execute(insert(t.actions).values(**_action_row(action)))

    def settle_action(self, action_id: str, expected: Collection[ActionStatus], status: ActionStatus, *,
                      result: str | None = None, params: Mapping[str, Any] | None = None,
                      dry_run: bool | None = None) -> tuple[bool, Action | None]:
        """``settle_action`` in a transaction of its own."""
        with self.engine.begin() as conn:
            return settle_action(conn, action_id, expected, status, result=result, params=params, dry_run=dry_run)

    def actions(self, incident_id: str | None = None, limit: int = 1000) -> list[Action]:
        q = select(t.actions.c.body).order_by(t.actions.c.ts).limit(limit)
        if incident_id is not None:
            q = q.where(t.actions.c.incident_id == incident_id)
        with self.engine.connect() as conn:
            return [Action.model_validate(r.body) for r in conn.execute(q)]

    def action(self, action_id: str) -> Action | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(t.actions.c.body).where(t.actions.c.id == action_id)).first()
        return Action.model_validate(row.body) if row else None

    def save_diagnosis(self, diagnosis: Diagnosis) -> None:
        diagnosis = _validated(Diagnosis, [diagnosis])[0]
        with self.engine.begin() as conn:
            conn.execute(delete(t.diagnoses).where(t.diagnoses.c.incident_id == diagnosis.incident_id))
            conn.execute(insert(t.diagnoses).values(incident_id=diagnosis.incident_id,
                                                    body=diagnosis.model_dump(mode="json")))

    def diagnosis(self, incident_id: str) -> Diagnosis | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(t.diagnoses.c.body).where(t.diagnoses.c.incident_id == incident_id)).first()
        return Diagnosis.model_validate(row.body) if row else None

    # ---------------------------------------------------------------- diagnoses run in the background

    def undiagnosed(self, limit: int = 20, now: float | None = None) -> list[str]:
        """Incidents, unresolved ones first and newest first, that have no diagnosis and no claim on one, a
        running claim whose lease lapsed (its server died) or a retrying one now due: what a background diagnoser
        should claim next. A failed one (its retries spent) waits for a rerun (``claim_diagnosis(again=True)``)."""
        now = time.time() if now is None else now
        c = t.diagnosis_claims.c
        q = (
            select(t.incidents.c.id)
            .outerjoin(t.diagnoses, t.diagnoses.c.incident_id == t.incidents.c.id)
            .outerjoin(t.diagnosis_claims, c.incident_id == t.incidents.c.id)
            .where(t.diagnoses.c.incident_id.is_(None))
            .where(or_(c.incident_id.is_(None), c.state.in_(("running", "retrying")) & (c.lease_until < now)))
            # open and acknowledged ones first: someone may be on them now
            .order_by((t.incidents.c.status == IncidentStatus.RESOLVED.value).asc(), t.incidents.c.start.desc())
            .limit(limit)
        )
        with self.engine.connect() as conn:
            return [r.id for r in conn.execute(q)]

    def claim_diagnosis(self, incident_id: str, owner: str, lease_s: float, *, again: bool = False) -> int | None:
        """Claim the diagnosis of ``incident_id`` for ``owner`` until ``lease_s`` from now; the claim's attempt
        number (1, 2, ...: its token for ``finish_diagnosis``) when claimed, else None.
        The row's primary key and a conditional UPDATE decide between concurrent claimers on SQLite and
        PostgreSQL alike: exactly one of them gets it. Without ``again`` an incident already diagnosed, done,
        failed, retrying later or claimed by a live owner is not claimed; ``again`` (a rerun asked for) takes
        anything but a live running claim, and starts the count of failures over."""
        now = time.time()
        c = t.diagnosis_claims.c
        dialect = self.engine.dialect.name
        with self.engine.begin() as conn:
            if not again and conn.execute(
                select(t.diagnoses.c.incident_id).where(t.diagnoses.c.incident_id == incident_id)
            ).first() is not None:
                return None
            statement = postgresql.insert(t.diagnosis_claims) if dialect == "postgresql" else sqlite.insert(
                t.diagnosis_claims)
            row = {"incident_id": incident_id, "state": "running", "owner": owner, "claimed_at": now,
                   "lease_until": now + lease_s, "attempts": 1, "error": "", "failures": 0}
            # RETURNING, not rowcount: a skipped row's rowcount is not 0 on every driver (psycopg)
            inserted = conn.execute(statement.values(**row).on_conflict_do_nothing(index_elements=[c.incident_id])
                                    .returning(c.incident_id)).first()
            if inserted is not None:
                return 1
            lapsed = c.state.in_(("running", "retrying")) & (c.lease_until < now)
            taken = conn.execute(
                update(t.diagnosis_claims)
                .where(c.incident_id == incident_id)
                .where(or_(c.state != "running", lapsed) if again else lapsed)
                .values(state="running", owner=owner, claimed_at=now, lease_until=now + lease_s,
                        attempts=c.attempts + 1, error="", failures=0 if again else c.failures)
                .returning(c.attempts)
            ).first()
            return int(taken.attempts) if taken is not None else None

    def renew_diagnosis_claims(self, owner: str, incident_ids: Collection[str], lease_s: float) -> int:
        """Push the leases of ``owner``'s running claims on ``incident_ids`` to ``lease_s`` from now; a claim it
        released is left released (the renewing thread's list may have been read before the release)."""
        if not incident_ids:
            return 0
        c = t.diagnosis_claims.c
        with self.engine.begin() as conn:
            return int(conn.execute(
                update(t.diagnosis_claims)
                .where(c.incident_id.in_(list(incident_ids)), c.owner == owner, c.state == "running",
                       c.lease_until != RELEASED)
                .values(lease_until=time.time() + lease_s)
            ).rowcount)

    def release_diagnosis(self, incident_id: str, owner: str, attempt: int) -> bool:
        """Give up ``owner``'s running claim ``attempt`` before it ran: its lease lapses, so the next claimer
        (a background thread of any server, a rerun asked for) takes it at once; nothing is counted, neither a
        failure nor the attempt (the next claim is attempt ``attempt`` again: a rerun that no thread could start
        counted one attempt more). False when that claim is no longer ``owner``'s running one."""
        c = t.diagnosis_claims.c
        with self.engine.begin() as conn:
            return bool(conn.execute(
                update(t.diagnosis_claims)
                .where(c.incident_id == incident_id, c.owner == owner, c.state == "running", c.attempts == attempt)
                .values(lease_until=RELEASED, attempts=c.attempts - 1)
            ).rowcount)

    def finish_diagnosis(self, incident_id: str, owner: str, diagnosis: Diagnosis | None, *, error: str = "",
                         again: bool = False, attempt: int | None = None, retries: int = 0,
                         retry_s: float = 30.0) -> bool:
        """End ``owner``'s claim ``attempt`` (what ``claim_diagnosis`` answered): store ``diagnosis`` (done) or
        ``error``: one more failure, ``retrying`` after ``retry_s`` doubled per failure before it while the
        incident has no diagnosis and ``retries`` are left, else failed for good. False, and nothing stored, when
        that claim is no longer running (its lease lapsed and another took it over - another server, or this one
        again: the same owner's newer attempt). Without ``again`` a diagnosis stored meanwhile by another writer
        (the engine, a PUT) is kept, not replaced."""
        if diagnosis is not None:
            diagnosis = _validated(Diagnosis, [diagnosis])[0]
        c = t.diagnosis_claims.c
        mine = (c.incident_id == incident_id, c.owner == owner, c.state == "running",
                true() if attempt is None else c.attempts == attempt)
        now = time.time()
        with self.engine.begin() as conn:
            values: dict[str, Any] = {"state": "done", "error": error[:4000], "lease_until": now}
            if diagnosis is None:
                held = conn.execute(select(c.failures).where(*mine)).first()
                if held is None:
                    return False
                failures = int(held.failures) + 1
                stored = conn.execute(select(t.diagnoses.c.incident_id)
                                      .where(t.diagnoses.c.incident_id == incident_id)).first()
                retry = failures <= retries and stored is None
                values.update(state="retrying" if retry else "failed", failures=failures,
                              lease_until=now + retry_s * 2 ** (failures - 1) if retry else now)
            # the conditions again: a claim taken over between the read and this write is left to its new owner
            ended = conn.execute(update(t.diagnosis_claims).where(*mine).values(**values))
            if not ended.rowcount:
                return False
            if diagnosis is not None:
                if again:
                    conn.execute(delete(t.diagnoses).where(t.diagnoses.c.incident_id == incident_id))
                statement = (postgresql.insert(t.diagnoses) if self.engine.dialect.name == "postgresql"
                             else sqlite.insert(t.diagnoses))
                conn.execute(statement.values(incident_id=incident_id, body=diagnosis.model_dump(mode="json"))
                             .on_conflict_do_nothing(index_elements=[t.diagnoses.c.incident_id]))
        return True

    def diagnosis_claim(self, incident_id: str) -> DiagnosisClaim | None:
        """The claim on ``incident_id``'s diagnosis as stored (None: never claimed)."""
        c = t.diagnosis_claims.c
        with self.engine.connect() as conn:
            row = conn.execute(select(t.diagnosis_claims).where(c.incident_id == incident_id)).first()
        if row is None:
            return None
        return DiagnosisClaim(row.incident_id, row.state, row.owner, row.claimed_at, row.lease_until, row.attempts,
                              row.error, row.failures)

    # ---------------------------------------------------------------- incident memory

    def save_memory(self, memory: IncidentMemory) -> None:
        """Remember a resolved incident (a second summary of the same incident replaces the first)."""
        memory = _validated(IncidentMemory, [memory])[0]
        with self.engine.begin() as conn:
            conn.execute(delete(t.incident_memories).where(t.incident_memories.c.incident_id == memory.incident_id))
            conn.execute(insert(t.incident_memories).values(incident_id=memory.incident_id, end=memory.end,
                                                            body=memory.model_dump(mode="json")))

    def memories(self, limit: int = 100_000) -> list[IncidentMemory]:
        """Remembered incidents, oldest resolution first."""
        q = select(t.incident_memories.c.body).order_by(t.incident_memories.c.end).limit(limit)
        with self.engine.connect() as conn:
            return [IncidentMemory.model_validate(r.body) for r in conn.execute(q)]

    def remembered_ids(self) -> set[str]:
        with self.engine.connect() as conn:
            return {r.incident_id for r in conn.execute(select(t.incident_memories.c.incident_id))}

    # ---------------------------------------------------------------- topology and health

    def save_topology(self, topology: Topology, source: str = "file") -> int:
        """Make ``topology`` the current one, as a whole version; every version is kept. Returns the new version
        number."""
        topology = _validated(Topology, [topology])[0]
        body = topology.model_dump(mode="json")
        with self.engine.begin() as conn:
            conn.execute(delete(t.topology))
            conn.execute(insert(t.topology).values(id=1, body=body))
            done = conn.execute(insert(t.topology_versions).values(ts=time.time(), source=source, body=body))
            return int(done.inserted_primary_key[0])  # type: ignore[index]

    def topology_version(self) -> int:
        """The current topology's version (0: none stored yet); cheap enough to poll every tick."""
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.max(t.topology_versions.c.version))).scalar_one() or 0)

    def topology_at(self, version: int) -> Topology | None:
        """The topology as it was at ``version``: the whole version at or before it with the registered nodes
        after that applied."""
        v = t.topology_versions.c
        with self.engine.connect() as conn:
            if conn.execute(select(v.version).where(v.version == version)).first() is None:
                return None
            whole = conn.execute(select(v.version, v.body).where(v.node.is_(None), v.version <= version)
                                 .order_by(v.version.desc()).limit(1)).first()
            base = whole.version if whole else 0
            nodes = conn.execute(select(v.body).where(v.node.is_not(None), v.version > base, v.version <= version)
                                 .order_by(v.version)).all()
        return _with_nodes(whole.body if whole else None, [r.body for r in nodes])

    def _whole_nodes(self, conn: Any) -> tuple[int, dict[str, dict[str, Any]]]:
        """The newest whole version's number and its nodes' bodies by name; parsed once per whole version."""
        v = t.topology_versions.c
        version = int(conn.execute(select(func.max(v.version)).where(v.node.is_(None))).scalar_one() or 0)
        cached = self._whole_cache
        if cached is None or cached[0] != version:
            row = conn.execute(select(t.topology.c.body).where(t.topology.c.id == 1)).first()
            cached = (version, {n["name"]: n for n in row.body["nodes"]} if row else {})
            self._whole_cache = cached
        return cached

    def register_node(self, node: Node, source: str = "agent") -> int:
        """A node's inventory as its agent reports it, merged into the current topology: its GPUs and NICs
        replace the stored ones; rack and switch stay as a topology file or labels set them unless the
        report names them. Returns the topology version (unchanged when the report changes nothing).

        A changed node is stored as a version of that node alone, so registering every agent of a cluster costs
        time linear in the nodes; once the node versions outnumber the nodes of the whole version they apply
        to, the current topology is written whole again (amortized, each registration still costs one node)."""
        node = _validated(Node, [node])[0]
        v = t.topology_versions.c
        with self.engine.begin() as conn:
            # the write first, so the reads below see what no concurrent registration can change under them
            done = conn.execute(update(t.inventory).where(t.inventory.c.node == node.name)
                                .values(ts=time.time(), body=node.model_dump(mode="json")))
            if done.rowcount == 0:
                conn.execute(insert(t.inventory).values(node=node.name, ts=time.time(),
                                                        body=node.model_dump(mode="json")))
            whole_version, whole_nodes = self._whole_nodes(conn)
            row = conn.execute(select(v.body).where(v.node == node.name, v.version > whole_version)
                               .order_by(v.version.desc()).limit(1)).first()
            old_body = row.body if row else whole_nodes.get(node.name)
            old = Node.model_validate(old_body) if old_body else None
            merged = node.model_copy(update={
                "rack": node.rack or (old.rack if old else "") or node.labels.get(RACK_LABEL, ""),
                "switch": node.switch or (old.switch if old else "") or node.labels.get(SWITCH_LABEL, ""),
                "labels": {**(old.labels if old else {}), **node.labels},
            })
            if old == merged:
                return int(conn.execute(select(func.max(v.version))).scalar_one() or 0)
            done = conn.execute(insert(t.topology_versions).values(
                ts=time.time(), source=source, body=merged.model_dump(mode="json"), node=node.name))
            version = int(done.inserted_primary_key[0])  # type: ignore[index]
        if version - whole_version > max(WHOLE_AFTER, len(whole_nodes)):
            current = self.topology()
            if current is not None:
                return self.save_topology(current, source=source)
        return version

    def place_nodes(self, layout: Topology, source: str = "file") -> int:
        """Rack, leaf switch and labels of the nodes a topology file names, and its switches, merged into the
        current topology (GPUs and NICs stay as the agents registered them; a node no agent registered yet
        is added as the file gives it). Returns the topology version (unchanged when nothing changed)."""
        layout = _validated(Topology, [layout])[0]
        topology = self.topology() or Topology()
        nodes = {n.name: n for n in topology.nodes}
        for placed in layout.nodes:
            old = nodes.get(placed.name)
            nodes[placed.name] = placed if old is None else old.model_copy(update={
                "rack": placed.rack or old.rack, "switch": placed.switch or old.switch,
                "labels": {**old.labels, **placed.labels}})
        merged = topology.model_copy(update={
            "cluster": layout.cluster if layout.cluster != "vigil" else topology.cluster,
            "nodes": sorted(nodes.values(), key=lambda n: n.name),
            "switches": layout.switches or topology.switches})
        if merged == topology:
            return self.topology_version()
        return self.save_topology(merged, source=source)

    def register_job(self, job: Job, source: str = "launch") -> int:
        """A job and its ranks' placement as its launcher reports it, replacing the stored job of that id. A
        node the job runs on that no agent registered yet is added bare (its agent fills in GPUs and NICs), so
        incidents on the job have a node to be diagnosed on. Returns the topology version."""
        job = _validated(Job, [job])[0]
        topology = self.topology() or Topology()
        nodes = {n.name: n for n in topology.nodes}
        for placed in job.placement:
            name = parse_entity(placed)[1][0]
            nodes.setdefault(name, Node(name=name))
        jobs = [job if j.id == job.id else j for j in topology.jobs]
        merged = topology.model_copy(update={
            "nodes": sorted(nodes.values(), key=lambda n: n.name),
            "jobs": jobs if job in jobs else [*jobs, job]})
        if merged == topology:
            return self.topology_version()
        return self.save_topology(merged, source=source)

    def inventory(self) -> list[Node]:
        with self.engine.connect() as conn:
            return [Node.model_validate(r.body) for r in conn.execute(select(t.inventory.c.body)
                                                                     .order_by(t.inventory.c.node))]

    def topology(self) -> Topology | None:
        """The current topology: the newest whole version with the nodes registered since applied."""
        v = t.topology_versions.c
        with self.engine.connect() as conn:
            whole_version = int(conn.execute(select(func.max(v.version)).where(v.node.is_(None))).scalar_one() or 0)
            row = conn.execute(select(t.topology.c.body).where(t.topology.c.id == 1)).first()
            nodes = conn.execute(select(v.body).where(v.node.is_not(None), v.version > whole_version)
                                 .order_by(v.version)).all()
        return _with_nodes(row.body if row else None, [r.body for r in nodes])

    def node_health(self, include_resolved: bool = False) -> dict[str, FaultLevel]:
        """Worst level of open incidents per node and per GPU / NIC (every entity of the topology listed)."""
        health: dict[str, FaultLevel] = {}
        topo = self.topology()
        if topo is not None:
            for node in topo.nodes:
                health[node.id] = FaultLevel.HEALTHY
                for gpu in node.gpus:
                    health[gpu.id] = FaultLevel.HEALTHY
        statuses = None if include_resolved else IncidentStatus.OPEN
        for incident in self.incidents(status=statuses, limit=100_000):
            for entity in incident.entities:
                kind, parts = parse_entity(entity)
                if kind not in ("gpu", "nic", "node"):
                    continue
                for key in {entity, f"node/{parts[0]}"}:
                    health[key] = max(health.get(key, FaultLevel.HEALTHY), incident.level)
        return health


@dataclass(frozen=True)
class MetricPush:
    """One agent push as stored: (metric, entity, value) points of one node at ``ts``; ``xid``: the transaction
    that wrote it (see ``ReadPosition``)."""

    id: int
    ts: float
    node: str
    points: list[tuple[str, str, float]]
    xid: int = 0

    @property
    def position(self) -> ReadPosition:
        return ReadPosition(self.xid, self.id)


class LeaseLost(RuntimeError):
    """A write fenced by a lease (``Store.set_cursor``) refused: another owner holds it now."""


class ReadPosition(NamedTuple):
    """Where a consumer of events or metric pushes has read to: the writing transaction's id and the row id of the
    last row read. Rows are read in (xid, id) order. On PostgreSQL ids are drawn from a sequence at INSERT while
    transactions commit in any order, so a row with a lower id can become visible after one with a higher id; a
    read passes only rows whose transaction is older than every transaction still running (the xmin of the
    statement's snapshot): those are all finished, so every row they wrote is visible, and every row written from
    then on has a higher xid. A row is thus read once its transaction and every older one have ended, never
    skipped, never twice. On SQLite writers take turns, ids follow commits, and xid is 0 throughout (as for the
    rows stored before revision 0011): the order is the ids'. A bare row id ``n`` stands for (0, n): a cursor
    saved before revision 0011 (every row written since has a higher xid; ``Store.position_of`` places one saved by an
engine that read such rows), and 0 reads everything."""

    xid: int
    id: int

    @classmethod
    def of(cls, position: ReadPosition | int) -> ReadPosition:
        return position if isinstance(position, ReadPosition) else cls(0, int(position))


# The xid of the oldest transaction still running as the statement's snapshot sees it (PostgreSQL 13 or later): every
# transaction with a lower xid has ended. A subquery: worked out once a statement, not once a row.
_SNAPSHOT_XMIN: ColumnElement[int] = select(
    literal_column("pg_snapshot_xmin(pg_current_snapshot())::text::bigint", BigInteger)).scalar_subquery()


ENTITY_CHUNK = 500  # entities named in one IN list: within SQLite's oldest bound on a statement's parameters (999)


def _of_entities(conn: Connection, q: Any, table: Table, entities: Collection[str] | None, limit: int) -> list[Any]:
    """The rows ``q`` selects from ``table`` (events or logs), in (ts, id) order, at most ``limit``; with
    ``entities``, only the rows of those entities: an IN list per ``ENTITY_CHUNK`` of them, each read through the
    table's (entity, ts) index, merged in the same order (NULL times first on SQLite, last on PostgreSQL, as
    each orders them)."""
    order = (table.c.ts, table.c.id)
    if entities is None:
        return list(conn.execute(q.order_by(*order).limit(limit)))
    wanted = sorted(set(entities))
    rows: list[Any] = []
    for start in range(0, len(wanted), ENTITY_CHUNK):
        chunk = q.where(table.c.entity.in_(wanted[start:start + ENTITY_CHUNK]))
        rows.extend(conn.execute(chunk.order_by(*order).limit(limit)))
    if len(wanted) > ENTITY_CHUNK:
        nulls_first = conn.dialect.name == "sqlite"
        rows.sort(key=lambda r: (r.ts is not None if nulls_first else r.ts is None, r.ts or 0.0, r.id))
        del rows[limit:]
    return rows


def _read_key(table: Table) -> Any:
    return tuple_(table.c.xid, table.c.id)


def _at(position: ReadPosition | int) -> Any:
    """A position as SQL, its xid a bigint (PostgreSQL's run past 2**31 in a busy server's life)."""
    xid, row_id = ReadPosition.of(position)
    return tuple_(literal(xid, BigInteger), literal(row_id, Integer))


def _read_order(dialect: str, table: Table) -> tuple[Any, ...]:
    """The columns rows are read in: (xid, id) on PostgreSQL; the id on SQLite, where every xid is 0 (its primary
    key serves, where SQLite would scan the (xid, id) index from its start for a row value)."""
    return (table.c.xid, table.c.id) if dialect == "postgresql" else (table.c.id,)


def _up_to(dialect: str, table: Table, position: ReadPosition | int) -> Any:
    """The rows of ``table`` at or before ``position`` in read order."""
    if dialect == "postgresql":
        return _read_key(table) <= _at(position)
    return table.c.id <= ReadPosition.of(position).id


def _read_after(dialect: str, table: Table, after: ReadPosition | int) -> Any:
    """The rows of ``table`` (events, metric pushes) after the position ``after`` in read order, those of a
    transaction that may not have ended (or an older one) left for a later read on PostgreSQL (``ReadPosition``);
    one statement, so one snapshot gives both the rows and the bound."""
    if dialect != "postgresql":
        return select(table).where(table.c.id > ReadPosition.of(after).id).order_by(table.c.id)
    return (select(table).where(_read_key(table) > _at(after), table.c.xid < _SNAPSHOT_XMIN)
            .order_by(table.c.xid, table.c.id))


def _read_ahead(dialect: str, table: Table, after: ReadPosition | int, skip: Collection[ReadPosition] = (),
                settled_only: bool = False) -> Any:
    """Every committed row of ``table`` after the position ``after`` in read order, with ``settled``: whether its
    transaction is older than every one still running (below the snapshot's xmin, ``ReadPosition``); one statement,
    so one snapshot gives the rows and the bound. Unsettled rows in ``skip`` (judged already) are left out, and
    with ``settled_only`` all unsettled ones: a tick does not read again, in full, rows it need not judge. On SQLite
    every row is settled."""
    if dialect != "postgresql":
        return (select(table, literal(True).label("settled")).where(table.c.id > ReadPosition.of(after).id)
                .order_by(table.c.id))
    q = select(table, (table.c.xid < _SNAPSHOT_XMIN).label("settled")).where(_read_key(table) > _at(after))
    if settled_only:
        q = q.where(table.c.xid < _SNAPSHOT_XMIN)
    elif skip:
        ids = bindparam("skip_ids", sorted({p.id for p in skip}), type_=postgresql.ARRAY(BigInteger))
        q = q.where(~((table.c.id == any_(ids)) & (table.c.xid >= _SNAPSHOT_XMIN)))
    return q.order_by(table.c.xid, table.c.id)


def _push(row: Any) -> MetricPush:
    return MetricPush(int(row.id), row.ts, row.node, [(str(m), str(e), float(v)) for m, e, v in row.points],
                      int(row.xid))


def _incident_row(incident: Incident) -> dict[str, Any]:
    return {"id": incident.id, "start": incident.start, "end": incident.end, "level": int(incident.level),
            "status": incident.status.value, "scope": incident.scope, "title": incident.title,
            "body": incident.model_dump(mode="json")}


def settle_action(conn: Connection, action_id: str, expected: Collection[ActionStatus], status: ActionStatus, *,
                  result: str | None = None, params: Mapping[str, Any] | None = None,
                  dry_run: bool | None = None) -> tuple[bool, Action | None]:
    """Move the stored action ``action_id`` to ``status`` (with ``result``, ``dry_run`` and ``params`` merged into its
    own) only from one of the ``expected`` statuses: a compare-and-set on its status column, never a write-back of
    the row as read, so of two processes writing one action at once (two approvals, a run's close and a server's
    verdict) one wins and the other finds what the winner wrote. Returns whether this write won and the action as
    stored after it (None: no such action). A verdict replaced (an ``expected`` status not proposed or approved: a
    retry's verdict over an earlier run's) is kept in ``params.earlier_verdicts``, oldest first, the newest
    ``EARLIER_VERDICTS_KEPT`` only (those dropped counted in ``params.earlier_verdicts_dropped``)."""
    while True:
        row = conn.execute(select(t.actions.c.status, t.actions.c.body).where(t.actions.c.id == action_id)).first()
        if row is None:
            return False, None
        stored = Action.model_validate(row.body)
        if stored.status not in expected:
            return False, stored
        merged = {**stored.params, **(params or {})}
        if stored.status not in OPEN_ACTION_STATUSES:
            earlier = stored.params.get("earlier_verdicts")
            verdicts = [*(earlier if isinstance(earlier, list) else []),
                        {"status": stored.status.value, "result": stored.result}]
            merged["earlier_verdicts"] = verdicts[-EARLIER_VERDICTS_KEPT:]
            dropped = len(verdicts) - len(merged["earlier_verdicts"])
            if dropped:
                before = stored.params.get("earlier_verdicts_dropped")
                merged["earlier_verdicts_dropped"] = (before if isinstance(before, int) else 0) + dropped
        settled = stored.model_copy(update={
            "status": status, "result": stored.result if result is None else result,
            "dry_run": stored.dry_run if dry_run is None else dry_run, "params": merged})
        settled = _validated(Action, [settled])[0]
        done = conn.execute(update(t.actions).where(t.actions.c.id == action_id, t.actions.c.status == row.status)
                            .values(status=settled.status.value, body=settled.model_dump(mode="json")))
        if done.rowcount == 1:
            return True, settled
        # another writer moved it between the read and the write: judge what it left


def _action_row(action: Action) -> dict[str, Any]:
    return {"id": action.id, "ts": action.ts, "incident_id": action.incident_id, "kind": action.kind.value,
            "target": action.target, "status": action.status.value, "body": action.model_dump(mode="json")}


def _with_nodes(whole: dict[str, Any] | None, nodes: Sequence[dict[str, Any]]) -> Topology | None:
    """A whole topology's body with registered nodes' bodies applied in order (each replaces its name's node)."""
    if whole is None and not nodes:
        return None
    topology = Topology.model_validate(whole) if whole is not None else Topology()
    if not nodes:
        return topology
    by_name = {n.name: n for n in topology.nodes}
    for body in nodes:
        node = Node.model_validate(body)
        by_name[node.name] = node
    return topology.model_copy(update={"nodes": sorted(by_name.values(), key=lambda n: n.name)})


def _insert_ignoring_name(dialect: str) -> Any:
    """An insert of a ``cursors`` row that writes nothing where its name is taken, returning the name written."""
    statement = postgresql.insert(t.cursors) if dialect == "postgresql" else sqlite.insert(t.cursors)
    return statement.on_conflict_do_nothing(index_elements=[t.cursors.c.name]).returning(t.cursors.c.name)


def _insert_ignoring_duplicates(dialect: str, table: Table) -> Any:
    """An insert into a table with a unique ``push_key`` (events, metric pushes, metric push keys) that skips a row
    whose key is stored already and returns the keys of the rows it wrote (SQLite and PostgreSQL both say ON
    CONFLICT DO NOTHING ... RETURNING; an unkeyed row's key is NULL)."""
    statement = postgresql.insert(table) if dialect == "postgresql" else sqlite.insert(table)
    return statement.on_conflict_do_nothing(index_elements=[table.c.push_key]).returning(table.c.push_key)


def _validated(model: Any, items: Iterable[Any]) -> Sequence[Any]:
    """Check a whole batch before writing any of it: one bad record rejects the batch with a clear message."""
    out = []
    for k, item in enumerate(items):
        if isinstance(item, model):
            item = model.model_validate(item.model_dump())
        elif isinstance(item, dict):
            item = model.from_dict(item)
        else:
            raise VigilInputError(f"record {k}: expected {model.__name__}, got {type(item).__name__}")
        out.append(item)
    return out


def store_exists(url: str) -> bool:
    """False for an SQLite file not written yet: a read command then answers "nothing stored" instead of
    creating directories and an empty store."""
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        return Path(url.removeprefix("sqlite:///")).is_file()
    return True


def open_store(config: Settings | None = None) -> Store:
    cfg = config or default_settings()
    return Store(cfg.database_url(), push_key_window_s=cfg.push_key_window_s)
