"""The agent's events spool: the events queued for the server, on disk, so that an agent restarted - stopped,
crashed, or the node rebooted after a GPU fell off the bus - sends what it had not delivered yet.

An event is written (one SQLite transaction a read of the sources, fsynced: ``synchronous=FULL`` in WAL mode)
before it joins the queue the push thread sends, and removed once the server has answered for it (taken, or
refused for good); the agent started again loads what the spool holds and sends it first. A crash between the
server storing a batch and the spool forgetting it sends the batch again, and the server stores each event once
(``POST /api/v1/events`` keys an event by all its fields, ``POST /api/v1/rank-logs`` a line by where it was read).
A write torn by a crash is a transaction SQLite rolls back on the next open (its WAL frames carry checksums); a
file that is no SQLite database at all is moved aside and an empty spool started, with a warning. The spool is
bounded by events and bytes: beyond either the oldest events are dropped, and the agent counts them
(``vigil_agent_events_dropped_total{reason="spool_full"}``). One agent holds a state directory at a time (an
exclusive lock on ``events-spool.lock``); a second one runs without the spool, with a warning. A spool that
cannot be opened now (locked by another program, a disk full or failing) is left as it is for the next start. The
spool's files are the agent's alone (mode 0600, a directory it creates 0700): events name nodes and carry kernel and
training log lines.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from pydantic import ValidationError

from vigil.model import Event

log = logging.getLogger("vigil.agent")

SPOOL_FILE = "events-spool.sqlite"
LOCK_FILE = "events-spool.lock"
# How long a write waits for a lock another program holds on the spool (a sqlite3 shell reading it): the agent's
# loop writes under it, so not long; past it the write fails and its events are queued in memory only.
BUSY_TIMEOUT_S = 1.0
# The WAL is cut back to this after a checkpoint (SQLite otherwise keeps it at the largest it has been).
WAL_SIZE_LIMIT = 4 * 2**20


class SpoolUnavailable(Exception):
    """The state directory cannot hold a spool (not writable, or another agent holds it)."""


class EventSpool:
    """Events not yet answered by the server, oldest first, in ``directory``: ``add`` before sending, ``remove``
    once answered, ``load`` on start; bounded by ``max_events`` and ``max_bytes`` (``add`` returns the ids of the
    oldest events it dropped beyond them)."""

    def __init__(self, directory: Path, max_events: int, max_bytes: int) -> None:
        self.directory = directory
        self.max_events = max_events
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._sizes: dict[int, int] = {}  # id -> bytes of each event held, oldest first
        self.bytes = 0
        self.unreadable = 0  # rows that were no event (written by another version, damaged): dropped on load
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._lock_file: IO[bytes] = os.fdopen(_private(directory / LOCK_FILE), "ab")
        except OSError as err:
            raise SpoolUnavailable(f"cannot use {directory}: {err}") from None
        try:
            fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock_file.close()
            raise SpoolUnavailable(f"another agent holds {directory / LOCK_FILE}") from None
        self.path = directory / SPOOL_FILE
        try:
            for suffix in ("", "-wal", "-shm"):  # SQLite gives its -wal and -shm files the database file's mode
                if suffix == "" or Path(f"{self.path}{suffix}").exists():
                    os.close(_private(Path(f"{self.path}{suffix}")))
            self._conn = self._open()
        except sqlite3.OperationalError as err:
            # locked, a disk full or failing, no permission: the file may hold events, and is left for the next start
            self.close()
            raise SpoolUnavailable(f"cannot open {self.path}: {err}") from None
        except sqlite3.DatabaseError as err:  # no SQLite database, or a damaged one
            aside = self.path.with_name(f"{SPOOL_FILE}.unreadable-{int(time.time())}")
            log.warning("the events spool %s is unreadable (%s): moved aside to %s and started empty; the events it "
                        "held are not sent", self.path, err, aside)
            for suffix in ("", "-wal", "-shm"):
                source = Path(f"{self.path}{suffix}")
                if source.exists():
                    os.replace(source, f"{aside}{suffix}")
            try:
                os.close(_private(self.path))
                self._conn = self._open()
            except (OSError, sqlite3.Error) as again:
                self.close()
                raise SpoolUnavailable(f"cannot open {self.path}: {again}") from None
        except OSError as err:
            self.close()
            raise SpoolUnavailable(f"cannot open {self.path}: {err}") from None

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, check_same_thread=False, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")  # a transaction is on disk when its commit returns
            conn.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
            conn.execute("CREATE TABLE IF NOT EXISTS events (id INTEGER PRIMARY KEY AUTOINCREMENT, body TEXT NOT NULL)")
            check = conn.execute("PRAGMA quick_check").fetchone()
            if check is None or check[0] != "ok":
                raise sqlite3.DatabaseError(f"quick_check: {check}")
        except BaseException:
            conn.close()
            raise
        return conn

    def load(self) -> list[tuple[int, Event]]:
        """The events held, oldest first, with their ids (an agent started again sends them first); a row that is
        no event is dropped and counted in ``unreadable``."""
        loaded: list[tuple[int, Event]] = []
        bad: list[int] = []
        with self._lock:
            for row_id, body in self._conn.execute("SELECT id, body FROM events ORDER BY id"):
                try:
                    loaded.append((row_id, Event.model_validate(json.loads(body))))
                except (ValueError, RecursionError, ValidationError):  # RecursionError: nested too deep to parse
                    bad.append(row_id)
                    continue
                self._sizes[row_id] = len(body)
                self.bytes += len(body)
            if bad:
                self._delete(bad)
        self.unreadable += len(bad)
        if bad:
            log.warning("the events spool %s held %d row(s) that are no event; dropped", self.path, len(bad))
        return loaded

    def add(self, events: Sequence[Event]) -> tuple[list[int], list[int]]:
        """Write ``events`` in one transaction, on disk when this returns. Returns their ids, in order, and the ids
        of the oldest events dropped to keep the spool within its bounds (the newest event is always kept)."""
        bodies = [json.dumps(e.model_dump(mode="json"), separators=(",", ":")) for e in events]
        with self._lock:
            ids: list[int] = []
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                for body in bodies:
                    cursor = self._conn.execute("INSERT INTO events (body) VALUES (?)", (body,))
                    ids.append(int(cursor.lastrowid or 0))
                evicted = self._over_bounds([(i, len(b)) for i, b in zip(ids, bodies, strict=True)])
                if evicted:
                    self._delete(evicted, in_transaction=True)
                self._conn.execute("COMMIT")
            except BaseException:
                self._rollback()
                raise
            for row_id, body in zip(ids, bodies, strict=True):
                self._sizes[row_id] = len(body)
                self.bytes += len(body)
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
            if count <= self.max_events and size <= self.max_bytes:
                break
            evicted.append(row_id)
            count -= 1
            size -= row_bytes
        return evicted

    def remove(self, ids: Sequence[int]) -> None:
        """Forget events the server answered for (or the agent dropped)."""
        if not ids:
            return
        with self._lock:
            self._delete(list(ids))
            for row_id in ids:
                self.bytes -= self._sizes.pop(row_id, 0)

    def _delete(self, ids: list[int], in_transaction: bool = False) -> None:
        if not in_transaction:
            self._conn.execute("BEGIN IMMEDIATE")
        try:
            for start in range(0, len(ids), 500):
                chunk = ids[start:start + 500]
                self._conn.execute(f"DELETE FROM events WHERE id IN ({','.join('?' * len(chunk))})", chunk)
            if not in_transaction:
                self._conn.execute("COMMIT")
        except BaseException:
            if not in_transaction:
                self._rollback()
            raise

    def _rollback(self) -> None:
        """End a transaction that failed (a full disk): SQLite may have rolled it back already, and a ROLLBACK that
        fails must not hide the error that did it nor leave the next BEGIN inside a transaction."""
        if self._conn.in_transaction:
            try:
                self._conn.execute("ROLLBACK")
            except sqlite3.Error as err:
                log.debug("the events spool %s: ROLLBACK failed (%s)", self.path, err)

    def __len__(self) -> int:
        return len(self._sizes)

    def close(self) -> None:
        conn = getattr(self, "_conn", None)
        if conn is not None:
            with self._lock:
                conn.close()
        self._lock_file.close()  # releases the lock


def _private(path: Path) -> int:
    """Open (creating) ``path`` for appending, readable and writable by its owner alone (0600, an existing file
    too: one left by an agent before this rule). Returns the descriptor."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        os.fchmod(fd, 0o600)
    except OSError as err:  # a filesystem without modes: the spool works all the same
        log.warning("cannot make %s readable by its owner alone (%s)", path, err)
    return fd
