"""The back-end commands a run started, recorded in the store, and what the run's next owner does with those a dead
owner left.

A process's exit kills the command groups it started (``vigil.procgroups``), but a server or engine killed outright
(SIGKILL, the OOM killer) runs no exit handler: its ``scontrol`` or ``nvidia-smi -r`` goes on, and the run's next owner
- the process that takes the run over once the dead owner's lease lapsed, at its start or a later round - would start
the same action beside it. So every command a run starts is recorded first (``CommandJournal``: a row before the
start, its marker in the command's environment, then its process group: the leader's pid, which is the group's id,
the leader's start time from /proc/<pid>/stat against pid reuse, and the host), and the next owner settles the
commands of the run it takes over before running it again (``settle_left_running``):

- on this host, a command no longer running is ``gone``; one still running is, by the action's kind, killed with its
  group (``KILLED_KINDS``: an update Slurm or Kubernetes applies at once and whose re-run converges - a cordon, a
  drain, a quota - killed and run again) or adopted (every other kind: a GPU reset, a reboot, a job's restart or
  migration, a preemption, a checkpoint's deletion - stopped half-way they may leave a GPU or a job in a state no
  re-run mends, and run twice they act twice): waited for, up to ``adopt_wait_s`` (then killed), and its end recorded
  (an orphan's exit status cannot be read by a process that is not its parent: the run that follows asks the back end
  whether the work is done, and skips it if so);
- on another host (another server or engine shared the database), it is marked ``unknown`` and the run is not run
  again: closed failed, saying which command may still run where, for an operator to check and execute again.

PR_SET_PDEATHSIG is not used: it fires when the thread that started the child exits, not the process (Vigil starts
commands from worker threads that end while the process lives on), and it reaches the direct child only, never a
grandchild the command started in its group.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import time
import uuid
from collections.abc import Iterable
from typing import Any

from sqlalchemy import Engine, delete, insert, update
from sqlalchemy import select as sql_select

from vigil.model import ActionKind
from vigil.remedy.actuators.base import COMMAND_MARKER_ENV, ActuatorError
from vigil.store.schema import remedy_commands, remedy_intents

# kinds whose command is killed when a dead owner left it running: one update the back end applies at once, run
# again to the same end; every other kind's is adopted (waited for)
KILLED_KINDS = frozenset({
    ActionKind.CORDON, ActionKind.UNCORDON, ActionKind.DRAIN, ActionKind.ALERT, ActionKind.RUN_DIAGNOSTICS,
    ActionKind.COLLECT_LOGS, ActionKind.SET_QUOTA, ActionKind.PREEMPT_NOTICE,
})
# how long a killed command's group is waited for to end
KILL_WAIT_S = 30.0
# the states of a command no owner will settle again (``OPEN``: those a run's next owner settles)
OPEN = ("starting", "running")
# how long a settled command's row is kept (setting remedy_commands_keep_days): ``prune_settled``
KEEP_S = 30 * 86400.0
# how much longer than the kept age a command's row may stay open (starting, running) before it is marked
# ``abandoned`` (``abandon_unsettled``): a week past it, far beyond any lease, adopt wait or back-end command
ABANDON_AFTER_KEEP_S = 7 * 86400.0


def this_host() -> str:
    """This host's name and pid namespace: a pid means the same process only within both."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = "pid:?"
    return f"{socket.gethostname()} {namespace}"


def start_time(pid: int) -> int | None:
    """The start time of process ``pid`` (clock ticks after boot, /proc/<pid>/stat field 22); None when there is no
    such process or it has ended (a zombie)."""
    try:
        stat = open(f"/proc/{pid}/stat", "rb").read()  # noqa: SIM115 - one read, closed by refcount
    except OSError:
        return None
    fields = stat.rsplit(b")", 1)[1].split()
    if fields[0] == b"Z":
        return None
    return int(fields[19])


def marked(marker: str) -> list[int]:
    """The live processes whose environment holds ``marker`` (every process a recorded command started and that kept
    its environment); this user's processes only (another's environment is not readable)."""
    needle = f"{COMMAND_MARKER_ENV}={marker}\0".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as environ:
                if needle in environ.read() and start_time(int(entry)) is not None:
                    found.append(int(entry))
        except OSError:
            continue
    return found


class CommandJournal:
    """Records the commands of the run under ``key`` by ``owner`` (``vigil.remedy.actuators.base.recording``)."""

    def __init__(self, engine: Engine, key: str, owner: str, kind: ActionKind) -> None:
        self.engine, self.key, self.owner, self.kind = engine, key, owner, kind
        self.host = this_host()

    def starting(self, argv: list[str]) -> str:
        marker = uuid.uuid4().hex
        with self.engine.begin() as conn:
            conn.execute(insert(remedy_commands).values(
                marker=marker, key=self.key, owner=self.owner, kind=self.kind.value, argv=list(argv), host=self.host,
                state="starting", started=time.time()))
        return marker

    def started(self, marker: str, pid: int) -> None:
        """The row of a command still starting becomes running, with its group - one conditional UPDATE: a row the
        run's next owner settled meanwhile (this owner stalled past its lease between the row and the start, and the
        next owner found no process: "gone") is left as that owner recorded it, not set back to running, and the
        command, which now runs beside the next owner's run, is refused (CommandSettled: the caller ends its group)."""
        with self.engine.begin() as conn:
            done = conn.execute(update(remedy_commands)
                                .where(remedy_commands.c.marker == marker, remedy_commands.c.state == "starting")
                                .values(pid=pid, pgid=pid, start_time=start_time(pid), state="running"))
            if done.rowcount == 1:
                return
            row = conn.execute(sql_select(remedy_commands.c.state, remedy_commands.c.owner, remedy_commands.c.result)
                               .where(remedy_commands.c.marker == marker)).first()
        said = "no longer recorded" if row is None else f"settled as {row.state} ({row.result})"
        raise CommandSettled(f"the command's record was {said} while it started: the run was taken over from this "
                             f"process ({self.owner}) meanwhile, so the command is ended, not run beside it")

    def ended(self, marker: str, returncode: int) -> None:
        """Only a row still open: an owner stalled past its lease whose command the next owner settled (killed, say)
        leaves what the next owner recorded, not "ended, exited -9"."""
        _close(self.engine, marker, "ended", f"exited {returncode}", only_open=True)


class CommandSettled(ActuatorError):
    """A command's row was settled by the run's next owner before its owner recorded the start
    (``CommandJournal.started``)."""


def _close(engine: Engine, marker: str, state: str, result: str, *, only_open: bool = False,
           only_if: str | None = None, at: float | None = None) -> bool:
    """Record a command's end (at ``at``, default now); ``only_open``: only on a row still starting or running;
    ``only_if``: only on a row still in that state. True when written."""
    query = update(remedy_commands).where(remedy_commands.c.marker == marker)
    if only_open:
        query = query.where(remedy_commands.c.state.in_(OPEN))
    if only_if is not None:
        query = query.where(remedy_commands.c.state == only_if)
    with engine.begin() as conn:
        return conn.execute(query.values(state=state, finished=time.time() if at is None else at,
                                         result=result)).rowcount == 1


def prune_settled(engine: Engine, older_than: float) -> int:
    """Delete the rows of commands settled (ended, gone, killed, adopted, unknown, abandoned) before ``older_than``;
    returns how many. A row still starting or running is never deleted: the run's next owner settles it, or
    ``abandon_unsettled`` marks it first."""
    c = remedy_commands.c
    with engine.begin() as conn:
        done = conn.execute(delete(remedy_commands).where(c.state.not_in(OPEN), c.finished < older_than))
        return int(done.rowcount or 0)


def abandon_unsettled(engine: Engine, started_before: float, now: float) -> list[dict[str, Any]]:
    """Mark ``abandoned`` the rows left starting or running by an owner that died (a crashed executor) when no owner
    will settle them any more: started before ``started_before``, their run no longer started in the journal (a run
    still started is settled by its next owner: left open for it), and, on this host, their process no longer running
    (one still running is a command that runs: left open). The row stays, saying where the command may still run, for
    an operator to check; ``prune_settled`` deletes it once it is older than the kept age from this mark (``now``).
    Returns the rows marked, as they were."""
    c, intents = remedy_commands.c, remedy_intents.c
    started_runs = sql_select(intents.key).where(intents.state == "started")
    with engine.connect() as conn:
        rows = [dict(row._mapping) for row in conn.execute(
            sql_select(remedy_commands).where(c.state.in_(OPEN), c.started < started_before,
                                              c.key.not_in(started_runs)))]
    host, marked_rows = this_host(), []
    for row in rows:
        if row["host"] == host and _live(row):
            continue
        pid = f" (pid {row['pid']})" if row["pid"] is not None else ""
        where = (f"its process{pid} is no longer running here" if row["host"] == host
                 else f"it may still run on {row['host']}{pid}: check there before running the action again")
        result = f"abandoned: left {row['state']} by {row['owner']}, its end never recorded, its run over; {where}"
        if _close(engine, str(row["marker"]), "abandoned", result, only_if=str(row["state"]), at=now):
            marked_rows.append(row)
    return marked_rows


def commands_of(engine: Engine, key: str) -> list[dict[str, Any]]:
    """Every command recorded for the run under ``key``, oldest first."""
    with engine.connect() as conn:
        rows = conn.execute(sql_select(remedy_commands).where(remedy_commands.c.key == key)
                            .order_by(remedy_commands.c.started))
        return [dict(row._mapping) for row in rows]


def _live(row: dict[str, Any]) -> list[int]:
    """The processes of ``row``'s command still running on this host: its leader (same pid and start time) and every
    process holding its marker."""
    pids = set(marked(str(row["marker"])))
    if row["pid"] is not None and row["start_time"] is not None and start_time(int(row["pid"])) == row["start_time"]:
        pids.add(int(row["pid"]))
    return sorted(pids)


def _wait_ended(pids: Iterable[int], timeout_s: float) -> bool:
    """Wait until every one of ``pids`` has ended (pidfds: readable once the process exits, whoever reaps it), at most
    ``timeout_s``; True when all did."""
    fds = []
    try:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                fds.append(os.pidfd_open(pid))
        deadline = time.monotonic() + timeout_s
        waiting = list(fds)
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            ready, _, _ = select.select(waiting, [], [], left)
            waiting = [fd for fd in waiting if fd not in ready]
        return True
    finally:
        for fd in fds:
            os.close(fd)


def _kill(row: dict[str, Any], pids: list[int]) -> bool:
    """SIGKILL ``row``'s command group (while its leader is the recorded one) and each of its marked processes; True
    once all have ended."""
    if row["pgid"] is not None and int(row["pid"]) in pids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(row["pgid"]), signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return _wait_ended(pids, KILL_WAIT_S)


def _left(engine: Engine, key: str, owner: str) -> list[dict[str, Any]]:
    """The commands of the run under ``key`` that owners other than ``owner`` started and never saw end."""
    return [row for row in commands_of(engine, key)
            if row["owner"] != owner and row["state"] in OPEN]


def must_adopt(engine: Engine, key: str, owner: str, kind: ActionKind) -> bool:
    """Whether settling the run under ``key`` (``settle_left_running``) waits for an adopted command: one of a kind
    not killed, left on this host and still running. Such a run is resumed on a thread of its own, so that its wait
    (up to ``adopt_wait_s``) holds no other run's takeover."""
    if kind in KILLED_KINDS:
        return False
    host = this_host()
    return any(row["host"] == host and _live(row) for row in _left(engine, key, owner))


def settle_left_running(engine: Engine, key: str, owner: str, kind: ActionKind,
                        adopt_wait_s: float) -> list[dict[str, Any]]:
    """Settle the commands that owners other than ``owner`` started for the run under ``key`` and never saw end (it
    has just been taken over from a dead owner): gone, killed or adopted on this host, unknown on another (see the
    module docstring). Returns what was found of each, for the resumed action's record."""
    found = []
    for row in _left(engine, key, owner):
        found.append(_settle(engine, row, kind, adopt_wait_s))
    return found


def _settle(engine: Engine, row: dict[str, Any], kind: ActionKind, adopt_wait_s: float) -> dict[str, Any]:
    """Settle one command ``row`` left open (``settle_left_running``): the state recorded only on the row as read - a
    row its owner changed meanwhile (a stalled owner recorded the start, or the end) is read again and settled anew,
    or left as its owner recorded it once no longer open (but for an end that this settling's kill caused)."""
    host = this_host()
    while True:
        said = {"argv": row["argv"], "pid": row["pid"], "host": row["host"], "owner": row["owner"]}
        if row["host"] != host:
            state, result = "unknown", f"started on {row['host']}, which this process cannot see"
        elif not (pids := _live(row)):
            state, result = "gone", "not running when the run was taken over"
        elif kind in KILLED_KINDS:
            state = "killed"
            result = f"killed with its group ({len(pids)} processes)" if _kill(row, pids) else \
                f"killed with its group, {len(pids)} processes still there after {KILL_WAIT_S:g} s"
        else:
            began = time.monotonic()
            if _wait_ended(pids, adopt_wait_s):
                state, result = "adopted", f"adopted: waited {time.monotonic() - began:.1f} s for it to end"
            else:
                state, result = "killed", f"adopted, killed after {adopt_wait_s:g} s still running"
                _kill(row, _live(row))
        if _close(engine, str(row["marker"]), state, result, only_if=str(row["state"])):
            return {**said, "state": state, "result": result}
        now = next((r for r in commands_of(engine, str(row["key"])) if r["marker"] == row["marker"]), None)
        if now is None:
            return {**said, "state": "gone", "result": "its record was removed meanwhile"}
        if now["state"] not in OPEN:
            if state == "killed" and now["state"] == "ended":  # its owner reaped what this kill ended
                _close(engine, str(row["marker"]), state, result, only_if="ended")
                return {**said, "state": state, "result": result}
            return {**said, "pid": now["pid"], "state": str(now["state"]), "result": str(now["result"])}
        row = now
