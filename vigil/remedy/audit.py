"""The audit log: every action Vigil proposes, refuses, skips or executes, with who / why / what / result.

SQLAlchemy Core on Vigil's database (``settings().database_url()``: ``<home>/vigil.db`` by default, any
SQLAlchemy URL otherwise). The tables belong to the remedy package alone (``remedy_*``), so they share the
database with other stages without touching their tables; their schema is the store's (``vigil.store.schema``),
made and changed by its revisions like every other table.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable
from typing import NamedTuple

from sqlalchemy import Column, ColumnElement, Connection, Engine, Executable, Table, func, insert, select, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from vigil.config import settings
from vigil.model import Action, ActionKind, ActionStatus, new_id
from vigil.store.schema import remedy_actions as actions_table
from vigil.store.schema import remedy_intents as intents_table
from vigil.store.sql import OPEN_ACTION_STATUSES, RETRIED_STATUSES, open_database, settle_action


class UnfinishedRun(NamedTuple):
    """A journal row still "started": the action, who ran it and until when their claim holds (None: a row from
    before leases, or journalled without an owner, which any process may claim)."""

    key: str
    owner: str | None
    lease_expires: float | None
    action: Action


_engines: dict[str, Engine] = {}
_engines_lock = threading.Lock()


def default_url() -> str:
    return settings().database_url()


def engine_for(url: str | None = None) -> Engine:
    """One engine per URL per process, the schema brought to the latest revision on first use."""
    url = url or default_url()
    with _engines_lock:
        engine = _engines.get(url)
        if engine is None:
            engine = _engines[url] = open_database(url)
        return engine


def close_engines() -> int:
    """Close the idle pooled connections of every engine ``engine_for`` keeps (they stay usable: a later use connects
    again); returns how many engines. A process that is done with a database - a test, before the next opens its own -
    leaves no connection to it open. An in-memory SQLite database lives only in its connection: kept."""
    with _engines_lock:
        engines = [engine for engine in _engines.values() if engine.url.database not in (None, "", ":memory:")]
    for engine in engines:
        engine.dispose()
    return len(engines)


class AuditLog:
    def __init__(self, url: str | None = None) -> None:
        self.engine = engine_for(url)

    def record(self, action: Action) -> None:
        with self.engine.begin() as conn:
            conn.execute(insert(actions_table).values(**_row(action)))

    def record_once(self, action: Action) -> bool:
        """``record``, unless a record of ``action``'s id exists already (False: another process's verdict on the same
        action, recorded first)."""
        with self.engine.begin() as conn:
            return _insert_new(conn, actions_table, _row(action), actions_table.c.id)

    def record_many(self, actions: Iterable[Action]) -> None:
        rows = [_row(a) for a in actions]
        if rows:
            with self.engine.begin() as conn:
                conn.execute(insert(actions_table), rows)

    def actions(
        self,
        *,
        target: str | None = None,
        kind: ActionKind | None = None,
        status: ActionStatus | None = None,
        since: float | None = None,
        limit: int | None = None,
        incident: str | None = None,
    ) -> list[Action]:
        query = select(actions_table).order_by(actions_table.c.seq)
        if incident is not None:
            query = query.where(actions_table.c.incident_id == incident)
        if target is not None:
            query = query.where(actions_table.c.target == target)
        if kind is not None:
            query = query.where(actions_table.c.kind == kind.value)
        if status is not None:
            query = query.where(actions_table.c.status == status.value)
        if since is not None:
            query = query.where(actions_table.c.ts >= since)
        if limit is not None:
            query = query.limit(limit)
        with self.engine.connect() as conn:
            return [_action(row._mapping) for row in conn.execute(query)]

    def begin(self, key: str, action: Action, owner: str | None = None, *, now: float | None = None,
              lease_expires: float | None = None) -> str | None:
        """Journal that ``action`` is about to run, by ``owner`` under a claim good until ``lease_expires``.

        Returns None when this is the first run under ``key``; else the state the previous run left: "done",
        "failed", "refused" or "skipped" (a resumed run stopped before the back end), "started" (a run a crash left,
        taken over now: its owner's lease had expired, or it was this owner's), or "running" - another owner's lease
        on it still holds, and nothing was changed."""
        now = time.time() if now is None else now
        row = {"key": key, "action_id": action.id, "state": "started", "started": now,
               "action": action.model_dump(mode="json"), "owner": owner, "lease_expires": lease_expires}
        with self.engine.begin() as conn:
            found = conn.execute(select(intents_table.c.state).where(intents_table.c.key == key)).first()
            if found is None:
                if _insert_new(conn, intents_table, row, intents_table.c.key):
                    return None
                # another process inserted the same new key between the look and the insert: judge its row
                found = conn.execute(select(intents_table.c.state).where(intents_table.c.key == key)).one()
            if found.state == "done":
                return "done"
            c = intents_table.c
            # a run that failed, or was refused or skipped before the back end was asked, is anyone's to retry; a
            # started one is this owner's, or its owner's lease has lapsed
            free = (c.state != "started") | (c.owner == owner) | _expired(now)
            taken = conn.execute(update(intents_table).where(c.key == key, c.state == found.state, free)
                                 .values(state="started", owner=owner, lease_expires=lease_expires))
            return str(found.state) if taken.rowcount == 1 else "running"

    def claim(self, key: str, owner: str, seen_owner: str | None, *, now: float, lease_expires: float) -> bool:
        """Take over the unfinished run under ``key`` for ``owner`` until ``lease_expires``: one UPDATE that changes
        the row only while it is still "started", still ``seen_owner``'s (what ``unfinished_runs`` read) and that
        owner's lease has expired by ``now``. True for one caller only; False when the lease still holds, or
        another process claimed or finished the run first."""
        was = (intents_table.c.owner.is_(None) if seen_owner is None else intents_table.c.owner == seen_owner)
        with self.engine.begin() as conn:
            changed = conn.execute(update(intents_table)
                                   .where(intents_table.c.key == key, intents_table.c.state == "started", was,
                                          _expired(now))
                                   .values(owner=owner, lease_expires=lease_expires))
            return changed.rowcount == 1

    def renew(self, key: str, owner: str, lease_expires: float) -> bool:
        """Extend ``owner``'s claim on the run under ``key``; False when the run is no longer its own (another
        process took it over after the lease expired) or has finished."""
        with self.engine.begin() as conn:
            changed = conn.execute(update(intents_table)
                                   .where(intents_table.c.key == key, intents_table.c.state == "started",
                                          intents_table.c.owner == owner)
                                   .values(lease_expires=lease_expires))
            return changed.rowcount == 1

    def finish(self, key: str, state: str, owner: str | None = None, *, record: Action | None = None,
               settle: Action | None = None, settle_record: bool = True) -> bool:
        """Close the run under ``key`` as ``state``, and with ``record`` audit the action's verdict in the same
        transaction: a process that finds the run closed finds its record too, and the stored action (the store's
        ``actions`` row the API approves and executes, where there is one) takes the verdict's status, result and
        params in that transaction too, whoever closes the run - the server that began it, or the process that
        resumed it - unless it holds a verdict already. With ``owner``, only while the run is still started and that
        owner's: False (nothing recorded) when its claim lapsed and another process took the run over (and maybe
        finished it), which is then left as that process has it. A ``record`` whose id holds a record already - an
        earlier run of the action that ended refused, skipped or failed, or another process's verdict on it written
        a moment ago - is written under an id of its own naming the action (``params.retry_of``; ``record`` is
        changed in place): the unique id decides in the insert, so no look before it can be overtaken. ``settle``
        settles the stored action with a verdict recorded apart (a close that must not fail on its record);
        ``settle_record`` False leaves the stored action to the run that follows at once (a failed run closed just
        before its action runs again: that run's verdict is the action's)."""
        c = intents_table.c
        mine = [] if owner is None else [c.state == "started", c.owner == owner]
        with self.engine.begin() as conn:
            changed = conn.execute(update(intents_table).where(c.key == key, *mine)
                                   .values(state=state, finished=time.time()))
            if changed.rowcount != 1:
                return False
            if record is not None:
                _record_in_close(conn, record)
                if settle_record:
                    _settle_stored(conn, record)
            if settle is not None:
                _settle_stored(conn, settle)
            return True

    def settle_from_run(self, action_id: str, key: str) -> None:
        """Bring the stored action ``action_id``, found still waiting for a verdict while its run under ``key`` is
        closed, to that run's record (a run closed before its close settled the stored action: a server that died
        between the two, or an older Vigil); without a record, to the journal's ``done``. Only an executed record
        speaks for the run: the record under the id can be an earlier run's failure, retried since under an id of
        its own (``params.retry_of``)."""
        with self.engine.begin() as conn:
            row = conn.execute(select(actions_table).where(actions_table.c.id == action_id)).first()
            if row is not None and (found := _action(row._mapping)).status == ActionStatus.EXECUTED:
                _settle_stored(conn, found)
                return
            state = conn.execute(select(intents_table.c.state).where(intents_table.c.key == key)).scalar()
            if state == "done":
                settle_action(conn, action_id, OPEN_ACTION_STATUSES, ActionStatus.EXECUTED, dry_run=False,
                              result=f"executed, per the execution journal (idempotency key {key})")

    def action_of(self, key: str) -> str | None:
        """The id of the action whose run the journal holds under ``key``; None for no such run."""
        with self.engine.connect() as conn:
            return conn.execute(select(intents_table.c.action_id).where(intents_table.c.key == key)).scalar()

    def owner_of(self, key: str) -> str | None:
        """Who holds (or last held) the run under ``key``; None for no such run or one journalled without owner."""
        with self.engine.connect() as conn:
            return conn.execute(select(intents_table.c.owner).where(intents_table.c.key == key)).scalar()

    def unfinished(self) -> list[Action]:
        """Actions whose execution started and never ended: the process died in the middle."""
        return [run.action for run in self.unfinished_runs()]

    def unfinished_runs(self) -> list[UnfinishedRun]:
        """Every run that started and never ended, oldest first."""
        c = intents_table.c
        with self.engine.connect() as conn:
            rows = conn.execute(select(c.key, c.owner, c.lease_expires, c.action)
                                .where(c.state == "started").order_by(c.started))
            return [UnfinishedRun(row.key, row.owner, row.lease_expires, Action.model_validate(row.action))
                    for row in rows]

    def count(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(actions_table)).scalar_one())


def _record_in_close(conn: Connection, record: Action) -> None:
    """Insert ``record``; when its id holds a record already, under an id of its own naming it (``params.retry_of``),
    in the same transaction. ON CONFLICT DO NOTHING waits for a record another transaction is writing under the id
    (PostgreSQL) and then skips, so two processes cannot both find the id free and both take it."""
    if not _insert_new(conn, actions_table, _row(record), actions_table.c.id):
        record.params["retry_of"] = record.id
        record.id = new_id("act")
        conn.execute(insert(actions_table).values(**_row(record)))


def _settle_stored(conn: Connection, record: Action) -> None:
    """The stored action of ``record`` - its id, or the action it retries (``params.retry_of``) - takes its verdict,
    unless it holds one already (none stored: a CLI run). A retry's verdict takes the place of an earlier run's
    refused, skipped or failed one (kept in ``params.earlier_verdicts``): the retry closes a run of its own, begun only
    once the journal had the earlier run closed, so it is the latest attempt - and never over ``executed``, since a run
    done is never run again."""
    retried = "retry_of" in record.params
    # the record's own bookkeeping stays in the audit log: the stored action is no retry of itself, and its replaced
    # verdicts are its own list (a copy the record took when it was read would write over a newer one)
    params = {k: v for k, v in record.params.items() if k not in _RECORD_ONLY_PARAMS}
    settle_action(conn, str(record.params.get("retry_of", record.id)),
                  OPEN_ACTION_STATUSES | (RETRIED_STATUSES if retried else frozenset()), record.status,
                  result=record.result, params=params, dry_run=record.dry_run)


_RECORD_ONLY_PARAMS = frozenset({"retry_of", "earlier_verdicts", "earlier_verdicts_dropped"})


def _insert_new(conn: Connection, table: Table, row: dict[str, object], unique: Column[str]) -> bool:
    """Insert a new row; False when a row of its ``unique`` value exists already (the row RETURNING gives back
    says which: through psycopg the row count of an INSERT ... ON CONFLICT reads -1). Two processes executing the same
    new action both find no journal row and both insert: ON CONFLICT DO NOTHING lets the second see the first's row
    (PostgreSQL waits for the first to commit) instead of failing on the key."""
    statement: Executable
    if conn.dialect.name == "postgresql":
        statement = (postgresql_insert(table).values(**row).on_conflict_do_nothing(index_elements=[unique.name])
                     .returning(unique))
    elif conn.dialect.name == "sqlite":
        statement = (sqlite_insert(table).values(**row).on_conflict_do_nothing(index_elements=[unique.name])
                     .returning(unique))
    else:  # a database without ON CONFLICT: the unique key still lets one insert win, the other fails
        conn.execute(insert(table).values(**row))
        return True
    return conn.execute(statement).first() is not None


def _expired(now: float) -> ColumnElement[bool]:
    """The row's lease has lapsed by ``now`` (a row without one, from before leases, is anyone's to claim)."""
    return intents_table.c.lease_expires.is_(None) | (intents_table.c.lease_expires < now)


def _row(action: Action) -> dict[str, object]:
    return {
        "id": action.id,
        "ts": action.ts,
        "kind": action.kind.value,
        "target": action.target,
        "incident_id": action.incident_id,
        "reason": action.reason,
        "requested_by": action.requested_by,
        "dry_run": action.dry_run,
        "status": action.status.value,
        "result": action.result,
        "params": json.loads(json.dumps(action.params, default=str)),
    }


def _action(row: object) -> Action:
    data = dict(row)  # type: ignore[call-overload]
    data.pop("seq")
    return Action.from_dict(data)
