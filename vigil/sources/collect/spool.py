"""The agent's events spool: the events queued for the server, on disk, so that an agent restarted - stopped,
crashed, or the node rebooted after a GPU fell off the bus - sends what it had not delivered yet.

An event is written (one SQLite transaction a read of the sources, fsynced: ``synchronous=FULL`` in WAL mode)
before it joins the queue the push thread sends, and removed once the server has answered for it (taken, or
refused for good); the agent started again loads what the spool holds and sends it first. A crash between the
server storing a batch and the spool forgetting it sends the batch again, and the server stores each event once
(``POST /api/v1/events`` keys an event by all its fields, ``POST /api/v1/rank-logs`` a line by where it was read).
A write torn by a crash is a transaction SQLite rolls back on the next open (its WAL frames carry checksums); a
spool of its own that is no SQLite database, or a damaged one, is found read-only before anything writes to it,
moved aside to ``<name>.corrupt-<unix time>`` with its -wal and -shm as they were, and an empty spool started,
with one warning. The spool is
bounded by events and bytes: beyond either the oldest events are dropped, and the agent counts them
(``vigil_agent_events_dropped_total{reason="spool_full"}``). One agent holds a state directory's spool at a time (an
exclusive lock on ``events-spool.lock``); a second one (a rollout's surge, a restart overlapping) spools to a file of
its own beside it, with a warning, and an agent that finds a spool file no agent holds takes its rows over
(``Spool.orphans``) and removes it - or, where it is no SQLite database or a damaged one (a dead agent's file
cut short), moves it aside the same way, once, with a warning. A spool that cannot be opened now (locked by
another program, a disk full or failing, no permission) is left as it is for the next start, or, another agent's,
for the next look - warned about once until the file changes or has been read. The
samples pushes the server has not taken (``EventPusher``'s backlog) are a second table of the same file, with the
same locking, writes and bounds (``SpoolQueue``). The
spool's files are the agent's alone (mode 0600, a directory it creates 0700): events name nodes and carry kernel and
training log lines.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import logging
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from pydantic import ValidationError

from vigil.model import Event

log = logging.getLogger("vigil.agent")

SPOOL_STEM = "events-spool"
SPOOL_FILE = f"{SPOOL_STEM}.sqlite"
LOCK_FILE = f"{SPOOL_STEM}.lock"
# How long a write waits for a lock another program holds on the spool (a sqlite3 shell reading it): the agent's
# loop writes under it, so not long; past it the write fails and its events are queued in memory only.
BUSY_TIMEOUT_S = 1.0
# The WAL is cut back to this after a checkpoint (SQLite otherwise keeps it at the largest it has been).
WAL_SIZE_LIMIT = 4 * 2**20


class SpoolUnavailable(Exception):
    """The state directory cannot hold a spool (not writable, or another agent holds it)."""


class Spool:
    """An agent's spool file in ``directory``: locked for this agent alone, opened in WAL mode with every commit on
    disk, moved aside when it is no SQLite database; it holds ``SpoolQueue`` tables (the events, the samples
    pushes), which share its connection and its lock."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._lock = threading.Lock()
        self.unreadable_orphans = UnreadableFiles()
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            held = _take_lock(directory / LOCK_FILE)
            self.path = directory / SPOOL_FILE
            if held is None:
                # another agent holds the directory's spool (a rollout's surge, a restart overlapping): a file of
                # this agent's own, which an agent that finds it unlocked later takes over (``orphans``)
                own = f"{SPOOL_STEM}-{secrets.token_hex(4)}"
                held = _take_lock(directory / f"{own}.lock")
                self.path = directory / f"{own}.sqlite"
                if held is None:
                    raise OSError(f"{directory / own}.lock is locked")
                log.warning("another agent holds %s: this one spools to %s, which the agent holding the directory's "
                            "spool next (or the next to start) takes over once this one has stopped",
                            directory / LOCK_FILE, self.path)
            self._lock_file: IO[bytes] = held
        except OSError as err:
            raise SpoolUnavailable(f"cannot use {directory}: {err}") from None
        try:
            for suffix in ("", "-wal", "-shm"):  # SQLite gives its -wal and -shm files the database file's mode
                if suffix == "" or Path(f"{self.path}{suffix}").exists():
                    os.close(_private(Path(f"{self.path}{suffix}")))
            # read-only first: opened to write, a damaged file's WAL is folded into it or dropped on close
            _check_read_only(self.path)
            self._conn = self._open()
        except sqlite3.OperationalError as err:
            # locked, a disk full or failing, no permission: the file may hold events, and is left for the next start
            self.close()
            raise SpoolUnavailable(f"cannot open {self.path}: {err}") from None
        except sqlite3.DatabaseError as err:  # no SQLite database, or a damaged one
            try:
                aside = _move_aside(self.path)
            except OSError as move_err:
                self.close()
                raise SpoolUnavailable(f"{self.path} is unreadable ({err}) and cannot be moved aside ({move_err})"
                                       ) from None
            log.warning("the events spool %s is unreadable (%s): moved aside to %s as it was and started empty; the "
                        "events it held are not sent", self.path, err, aside)
            try:
                os.close(_private(self.path))
                self._conn = self._open()
            except (OSError, sqlite3.Error) as again:
                self.close()
                raise SpoolUnavailable(f"cannot open {self.path}: {again}") from None
        except OSError as err:
            self.close()
            raise SpoolUnavailable(f"cannot open {self.path}: {err}") from None

    def _open(self, path: Path | None = None) -> sqlite3.Connection:
        conn = sqlite3.connect(path or self.path, timeout=BUSY_TIMEOUT_S, check_same_thread=False,
                               isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")  # a transaction is on disk when its commit returns
            conn.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            check = conn.execute("PRAGMA quick_check").fetchone()
            if check is None or check[0] != "ok":
                raise sqlite3.DatabaseError(f"quick_check: {check}")
        except BaseException:
            conn.close()
            raise
        return conn

    def orphans(self) -> Iterator[OrphanSpool]:
        """The other spool files of the directory no agent holds (their agent stopped or was killed while this one
        ran on a file of its own, or the other way round), each locked for this agent while it is read: take its
        rows, then ``discard`` it. A file another agent holds is left alone; one that cannot be read now (locked, a
        disk failing, no permission) is tried again at the next look, warned about once until it changes or has
        been read (``unreadable_orphans``); one that is no SQLite database, or a damaged one, is moved aside once
        (``set_aside``), never tried again nor deleted."""
        for path in sorted(self.directory.glob(f"{SPOOL_STEM}*.sqlite")):
            if path == self.path:
                continue
            lock_path = path.with_suffix(".lock") if path.name != SPOOL_FILE else self.directory / LOCK_FILE
            try:
                held = _take_lock(lock_path)
            except OSError as err:
                self.unreadable_orphans.warn(path, err)
                continue
            if held is None:
                continue
            if not path.exists():  # taken over and removed by another agent meanwhile
                if lock_path.name != LOCK_FILE:  # the lock file taking the lock made again: not left behind
                    lock_path.unlink(missing_ok=True)
                held.close()
                continue
            try:
                _check_read_only(path)  # before opening it to write: SQLite may fold its WAL in, or drop it
                conn = self._open(path)
            except sqlite3.DatabaseError as err:
                if isinstance(err, sqlite3.OperationalError):  # locked, a disk failing: may be read later
                    held.close()
                    self.unreadable_orphans.warn(path, err)
                else:  # no SQLite database, or a damaged one: no later look reads it either
                    set_aside(path, lock_path, held, err, self.unreadable_orphans)
                continue
            except (OSError, sqlite3.Error) as err:
                held.close()
                self.unreadable_orphans.warn(path, err)
                continue
            yield OrphanSpool(path, lock_path, conn, held, self.unreadable_orphans)

    def queue(self, table: str, columns: Sequence[tuple[str, str]], max_rows: int, max_bytes: int) -> SpoolQueue:
        """A bounded queue in ``table`` of this file (created if new), rows of a body and ``columns``."""
        return SpoolQueue(self, table, columns, max_rows, max_bytes)

    def _rollback(self) -> None:
        """End a transaction that failed (a full disk): SQLite may have rolled it back already, and a ROLLBACK that
        fails must not hide the error that did it nor leave the next BEGIN inside a transaction."""
        if self._conn.in_transaction:
            try:
                self._conn.execute("ROLLBACK")
            except sqlite3.Error as err:
                log.debug("the spool %s: ROLLBACK failed (%s)", self.path, err)

    def close(self) -> None:
        """Close the file and let go of its lock; a file of this agent's own (not the directory's) left empty is
        removed, so that a clean stop beside another agent leaves nothing to take over."""
        conn = getattr(self, "_conn", None)
        if conn is not None:
            with self._lock:
                empty = self.path.name != SPOOL_FILE and self._empty(conn)
                conn.close()
                if empty:
                    for suffix in ("", "-wal", "-shm"):
                        Path(f"{self.path}{suffix}").unlink(missing_ok=True)
                    self.path.with_suffix(".lock").unlink(missing_ok=True)
        self._lock_file.close()  # releases the lock

    @staticmethod
    def _empty(conn: sqlite3.Connection) -> bool:
        try:
            tables = [name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                                       "AND name NOT LIKE 'sqlite_%'")]
            return all(conn.execute(f"SELECT 1 FROM {name} LIMIT 1").fetchone() is None for name in tables)
        except sqlite3.Error:
            return False


class UnreadableFiles:
    """The spool files other agents left that could not be read (locked, a disk failing, no permission), each with
    the state it was warned about in: a file is warned about once, again only once it has changed (its -wal
    included) or after it has been read and gone."""

    def __init__(self) -> None:
        self._warned: dict[str, tuple[tuple[int, int, int] | None, ...]] = {}

    def warn(self, path: Path, err: Exception, move_err: OSError | None = None) -> None:
        state = tuple(_file_state(Path(f"{path}{suffix}")) for suffix in ("", "-wal"))
        if self._warned.get(str(path)) == state:
            return
        self._warned[str(path)] = state
        if move_err is None:
            log.warning("cannot take over the spool %s another agent left (%s); tried again later", path, err)
        else:
            log.warning("the spool %s another agent left is unreadable (%s) and cannot be moved aside (%s); "
                        "tried again later", path, err, move_err)

    def forget(self, path: Path) -> None:
        """``path`` was read (or moved aside): a file found there later that cannot be read is warned about."""
        self._warned.pop(str(path), None)


def _file_state(path: Path) -> tuple[int, int, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


class OrphanSpool:
    """A spool file another agent left, locked by this one: ``rows`` of a table, then ``discard`` the file - or
    ``leave`` it, where its rows cannot be read now."""

    def __init__(self, path: Path, lock_path: Path, conn: sqlite3.Connection, lock_file: IO[bytes],
                 unreadable: UnreadableFiles | None = None) -> None:
        self.path = path
        self._unreadable = UnreadableFiles() if unreadable is None else unreadable
        self._lock_path = lock_path
        self._conn = conn
        self._lock_file = lock_file

    def rows(self, table: str, columns: Sequence[str] = ()) -> list[tuple[Any, ...]]:
        """(id, body, *columns) of every row of ``table``, oldest first (none where the file has no such table)."""
        names = "".join(f", {name}" for name in columns)
        try:
            return list(self._conn.execute(f"SELECT id, body{names} FROM {table} ORDER BY id"))
        except sqlite3.OperationalError as err:
            if "no such table" in str(err):  # a file made before it, or left empty
                return []
            raise  # locked, a disk failing: the file is not to be discarded as if read

    def discard(self) -> None:
        """Remove the file (its rows are in this agent's spool now), then its lock file, then let go of the lock:
        an agent that opened the lock file before it was removed finds it gone (``_take_lock``)."""
        self._conn.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        self._lock_path.unlink(missing_ok=True)
        self._lock_file.close()
        self._unreadable.forget(self.path)

    def leave(self, err: Exception) -> None:
        """Leave the file as it is for the next look (its rows could not be read or kept now: ``err``), warned
        about once until it changes."""
        self._conn.close()
        self._lock_file.close()
        self._unreadable.warn(self.path, err)

    def set_aside(self, err: sqlite3.Error) -> None:
        """Move the file aside (it opened, but its rows cannot be read: a damaged database), as ``set_aside``."""
        self._conn.close()
        set_aside(self.path, self._lock_path, self._lock_file, err, self._unreadable)


def set_aside(path: Path, lock_path: Path, lock_file: IO[bytes], err: sqlite3.Error,
              unreadable: UnreadableFiles) -> None:
    """Move a spool file another agent left that is no SQLite database, or a damaged one, aside (``_move_aside``),
    where no agent looks at it again; its lock file is removed (but the directory's) and its lock let go. One
    warning. A file that cannot be moved is left, warned about once until it changes (``unreadable``), and looked
    at again at the next look."""
    try:
        aside = _move_aside(path)
    except OSError as move_err:
        unreadable.warn(path, err, move_err)
        lock_file.close()
        return
    unreadable.forget(path)
    if lock_path.name != LOCK_FILE:
        lock_path.unlink(missing_ok=True)
    lock_file.close()
    log.warning("the spool %s another agent left is unreadable (%s): moved aside to %s, not looked at again; the "
                "events and samples pushes it held are not sent", path, err, aside)


def _move_aside(path: Path) -> Path:
    """Move the SQLite file at ``path`` with its -wal and -shm files, their bytes as they are, to
    ``<name>.corrupt-<unix time>`` (``-<n>`` added where that is taken), kept for whoever wants to read what it
    held and never deleted. Returns the new path; raises OSError where a file cannot be moved."""
    aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
    for n in itertools.count(1):
        if not any(Path(f"{aside}{suffix}").exists() for suffix in ("", "-wal", "-shm")):
            break
        aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}-{n}")
    for suffix in ("", "-wal", "-shm"):
        source = Path(f"{path}{suffix}")
        if source.exists():
            os.replace(source, f"{aside}{suffix}")
    return aside


class SpoolQueue:
    """Rows not yet answered by the server, oldest first, in one table of a ``Spool``: each a body (JSON text) and
    the queue's own ``columns``. ``add`` before sending, ``remove`` once answered, ``load`` on start; bounded by
    ``max_rows`` and ``max_bytes`` of bodies (``add`` returns the ids of the oldest rows it dropped beyond them,
    never the newest)."""

    def __init__(self, spool: Spool, table: str, columns: Sequence[tuple[str, str]], max_rows: int,
                 max_bytes: int) -> None:
        self.spool = spool
        self.table = table
        self.columns = [name for name, _ in columns]
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self._sizes: dict[int, int] = {}  # id -> bytes of each body held, oldest first
        self.bytes = 0
        declared = "".join(f", {name} {kind}" for name, kind in columns)
        with spool._lock:
            spool._conn.execute(f"CREATE TABLE IF NOT EXISTS {table} "
                                f"(id INTEGER PRIMARY KEY AUTOINCREMENT, body TEXT NOT NULL{declared})")

    def rows(self) -> list[tuple[Any, ...]]:
        """Every row held, oldest first: (id, body, *columns). Not yet counted against the bounds: ``keep`` the
        ones that are readable, ``remove`` the rest."""
        names = "".join(f", {name}" for name in self.columns)
        with self.spool._lock:
            return list(self.spool._conn.execute(f"SELECT id, body{names} FROM {self.table} ORDER BY id"))

    def keep(self, rows: Sequence[tuple[Any, ...]]) -> None:
        """Count rows ``rows`` returned against the bounds (a spool read at start holds them)."""
        with self.spool._lock:
            for row in rows:
                self._sizes[row[0]] = len(row[1])
                self.bytes += len(row[1])

    def add(self, rows: Sequence[tuple[Any, ...]]) -> tuple[list[int], list[int]]:
        """Write ``rows`` ((body, *columns) each) in one transaction, on disk when this returns. Returns their ids,
        in order, and the ids of the oldest rows dropped to keep the queue within its bounds."""
        spool = self.spool
        names = "".join(f", {name}" for name in self.columns)
        marks = ", ?" * len(self.columns)
        with spool._lock:
            ids: list[int] = []
            spool._conn.execute("BEGIN IMMEDIATE")
            try:
                for row in rows:
                    cursor = spool._conn.execute(f"INSERT INTO {self.table} (body{names}) VALUES (?{marks})", row)
                    ids.append(int(cursor.lastrowid or 0))
                evicted = self._over_bounds([(i, len(r[0])) for i, r in zip(ids, rows, strict=True)])
                if evicted:
                    self._delete(evicted, in_transaction=True)
                spool._conn.execute("COMMIT")
            except BaseException:
                spool._rollback()
                raise
            for row_id, row in zip(ids, rows, strict=True):
                self._sizes[row_id] = len(row[0])
                self.bytes += len(row[0])
            for row_id in evicted:
                self.bytes -= self._sizes.pop(row_id, 0)
        return ids, evicted

    def _over_bounds(self, new: list[tuple[int, int]]) -> list[int]:
        """The oldest ids to drop once the ``new`` (id, bytes) are added (not yet in ``_sizes``): the held ones,
        then the new ones, never the newest."""
        count = len(self._sizes) + len(new)
        size = self.bytes + sum(n for _, n in new)
        evicted: list[int] = []
        for row_id, row_bytes in [*self._sizes.items(), *new[:-1]]:
            if count <= self.max_rows and size <= self.max_bytes:
                break
            evicted.append(row_id)
            count -= 1
            size -= row_bytes
        return evicted

    def remove(self, ids: Sequence[int]) -> None:
        """Forget rows the server answered for (or the agent dropped)."""
        if not ids:
            return
        with self.spool._lock:
            self._delete(list(ids))
            for row_id in ids:
                self.bytes -= self._sizes.pop(row_id, 0)

    def _delete(self, ids: list[int], in_transaction: bool = False) -> None:
        conn = self.spool._conn
        if not in_transaction:
            conn.execute("BEGIN IMMEDIATE")
        try:
            for start in range(0, len(ids), 500):
                chunk = ids[start:start + 500]
                conn.execute(f"DELETE FROM {self.table} WHERE id IN ({','.join('?' * len(chunk))})", chunk)
            if not in_transaction:
                conn.execute("COMMIT")
        except BaseException:
            if not in_transaction:
                self.spool._rollback()
            raise

    def __len__(self) -> int:
        return len(self._sizes)


class EventSpool(Spool):
    """Events not yet answered by the server, oldest first, in ``directory``: ``add`` before sending, ``remove``
    once answered, ``load`` on start; bounded by ``max_events`` and ``max_bytes`` (``add`` returns the ids of the
    oldest events it dropped beyond them). The samples pushes the server has not taken are a second queue of the
    same file (``samples``)."""

    def __init__(self, directory: Path, max_events: int, max_bytes: int) -> None:
        super().__init__(directory)
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.unreadable = 0  # rows that were no event (written by another version, damaged): dropped on load
        try:
            self.events = self.queue("events", (), max_events, max_bytes)
        except BaseException:
            self.close()
            raise

    def load(self) -> list[tuple[int, Event]]:
        """The events held, oldest first, with their ids (an agent started again sends them first); a row that is
        no event is dropped and counted in ``unreadable``."""
        loaded: list[tuple[int, Event]] = []
        good: list[tuple[Any, ...]] = []
        bad: list[int] = []
        for row in self.events.rows():
            try:
                loaded.append((row[0], Event.model_validate(json.loads(row[1]))))
            except (ValueError, RecursionError, ValidationError):  # RecursionError: nested too deep to parse
                bad.append(row[0])
                continue
            good.append(row)
        self.events.keep(good)
        self.events.remove(bad)
        self.unreadable += len(bad)
        if bad:
            log.warning("the events spool %s held %d row(s) that are no event; dropped", self.path, len(bad))
        return loaded

    def add(self, events: Sequence[Event]) -> tuple[list[int], list[int]]:
        """Write ``events`` in one transaction, on disk when this returns. Returns their ids, in order, and the ids
        of the oldest events dropped to keep the spool within its bounds (the newest event is always kept)."""
        return self.events.add([(json.dumps(e.model_dump(mode="json"), separators=(",", ":")),) for e in events])

    def remove(self, ids: Sequence[int]) -> None:
        """Forget events the server answered for (or the agent dropped)."""
        self.events.remove(ids)

    @property
    def bytes(self) -> int:
        return self.events.bytes

    def __len__(self) -> int:
        return len(self.events)

    def samples(self, max_pushes: int, max_bytes: int) -> SpoolQueue:
        """The samples pushes the server has not taken: each its body, its ``Idempotency-Key`` and the wall-clock
        time it was made (``EventPusher``)."""
        return self.queue("samples", (("key", "TEXT NOT NULL"), ("made", "REAL NOT NULL")), max_pushes, max_bytes)


def _check_read_only(path: Path) -> None:
    """Raise sqlite3.DatabaseError where the SQLite file at ``path`` is no database or a damaged one (its WAL
    included), reading it only: its file and WAL are left as they are (a -shm file may be made beside them). A file
    in rollback-journal mode with a hot journal (a writer died mid-transaction) passes unread: only a writer may
    roll it back, it has no WAL to lose, and the write open that follows judges it."""
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S)
    try:
        check = conn.execute("PRAGMA quick_check").fetchone()
        if check is None or check[0] != "ok":
            raise sqlite3.DatabaseError(f"quick_check: {check}")
    except sqlite3.OperationalError as err:
        if err.sqlite_errorcode != sqlite3.SQLITE_READONLY_ROLLBACK:
            raise
    finally:
        conn.close()


def _take_lock(path: Path) -> IO[bytes] | None:
    """Open (creating, 0600) and lock ``path`` for this process alone; None when another holds it. A lock taken on a
    file removed meanwhile (an agent that took over its spool removed it) is let go and taken again on the file now
    at ``path``."""
    for _ in range(5):
        handle = os.fdopen(_private(path), "ab")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            return None
        try:
            same = os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return handle
        handle.close()
    return None


def _private(path: Path) -> int:
    """Open (creating) ``path`` for appending, readable and writable by its owner alone (0600, an existing file
    too: one left by an agent before this rule). Returns the descriptor."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        os.fchmod(fd, 0o600)
    except OSError as err:  # a filesystem without modes: the spool works all the same
        log.warning("cannot make %s readable by its owner alone (%s)", path, err)
    return fd
