"""What a run's next owner does with a command its dead owner left running (``vigil.remedy.commands``): a GPU reset's
is adopted - waited for, then the back end asked whether the work is done - never killed half-way nor started beside;
one recorded on another host leaves the run closed failed, not run again. The left command is a real process in a
session of its own, as the dead owner's was; SQLite and PostgreSQL."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_for
from tests.remedy.claims import database as database
from tests.serve.conftest import postgres_url as postgres_url
from vigil.model import Action, ActionKind, ActionStatus
from vigil.remedy import commands
from vigil.remedy.actuators.base import COMMAND_MARKER_ENV, Actuator
from vigil.remedy.audit import AuditLog, close_engines
from vigil.remedy.commands import CommandJournal, commands_of
from vigil.remedy.remediator import Remediator

KEY = "act-reset-n1"


class ResetActuator(Actuator):
    name = "reset"
    kinds = frozenset({ActionKind.RESET_GPU})
    target_kinds = frozenset({"gpu"})

    def __init__(self, done: bool) -> None:
        self.done, self.runs = done, 0

    def describe(self, action: Action) -> str:
        return f"reset {action.target}"

    def is_satisfied(self, action: Action) -> bool:
        return self.done

    def execute(self, action: Action) -> str:
        self.runs += 1
        return f"reset {action.target}"


def left_reset(database: str, fifo: Path, host: str | None = None) -> subprocess.Popen[bytes]:
    """A GPU reset a killed server left started (its lease lapsed) with its command still running: a real process in
    a session of its own reading ``fifo``, recorded as that server's journal would have it."""
    action = Action(id=KEY, ts=0.0, kind=ActionKind.RESET_GPU, target="gpu/n1/0", reason="Xid 79",
                    params={"idempotency_key": KEY})
    audit = AuditLog(database)
    assert audit.begin(KEY, action, owner="vigil-api-killed", now=0.0, lease_expires=30.0) is None
    journal = CommandJournal(audit.engine, KEY, "vigil-api-killed", ActionKind.RESET_GPU)
    argv = [sys.executable, "-c", "import sys; open(sys.argv[1]).read()", str(fifo)]
    if host is not None:
        journal.host = host
    marker = journal.starting(argv)
    process = subprocess.Popen(argv, start_new_session=True, env={**os.environ, COMMAND_MARKER_ENV: marker})
    journal.started(marker, process.pid)
    return process


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "hold"
    os.mkfifo(path)
    return path


def stop(process: subprocess.Popen[bytes]) -> None:
    """End the command this test started (by its pid), wherever the test stopped."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def test_a_left_gpu_reset_is_adopted_waited_for_and_not_run_again(database: str, fifo: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    left = left_reset(database, fifo)
    waiting = threading.Event()
    real_wait = commands._wait_ended

    def watched_wait(pids: Any, timeout_s: float) -> bool:
        waiting.set()
        return real_wait(pids, timeout_s)

    monkeypatch.setattr(commands, "_wait_ended", watched_wait)

    def release() -> None:  # once the next owner waits for it, the reset ends as it would have
        if waiting.wait(60):
            with open(fifo, "w") as hold:
                hold.write("go\n")

    releaser = threading.Thread(target=release, daemon=True)
    releaser.start()
    actuator = ResetActuator(done=True)
    try:
        remediator = Remediator([actuator], AuditLog(database), dry_run=False, requested_by="vigil-engine")
        assert remediator.recover() == []  # resumed on a thread of its own
        [resumed] = remediator.wait_adopted(60)
        # waited for: it ended while waited for, never killed (a SIGKILL would read -9 here)
        assert left.wait(30) == 0
    finally:
        stop(left)
        releaser.join(30)
    assert actuator.runs == 0  # done per the back end once the adopted command ended: not reset a second time
    assert resumed.status is ActionStatus.SKIPPED, resumed
    [earlier] = resumed.params["earlier_commands"]
    assert (earlier["pid"], earlier["state"]) == (left.pid, "adopted"), earlier
    [row] = commands_of(AuditLog(database).engine, KEY)
    assert row["state"] == "adopted" and row["result"].startswith("adopted: waited"), row


def test_an_adopted_command_still_running_past_the_bound_is_killed_before_the_run_goes_on(database: str,
                                                                                          fifo: Path) -> None:
    left = left_reset(database, fifo)
    actuator = ResetActuator(done=False)
    began = time.monotonic()
    try:
        remediator = Remediator([actuator], AuditLog(database), dry_run=False, requested_by="vigil-engine",
                                adopt_wait_s=0.5)
        assert remediator.recover() == []
        [resumed] = remediator.wait_adopted(30)
        assert left.wait(30) == -signal.SIGKILL
    finally:
        stop(left)
    assert time.monotonic() - began < 30
    assert actuator.runs == 1 and resumed.status is ActionStatus.EXECUTED, resumed  # run again once it was gone
    [row] = commands_of(AuditLog(database).engine, KEY)
    assert row["state"] == "killed" and "adopted, killed after 0.5 s" in row["result"], row


def test_a_command_left_on_another_host_leaves_the_run_closed_failed_not_run_again(database: str,
                                                                                   fifo: Path) -> None:
    left = left_reset(database, fifo, host="gpu-head-2 pid:[4026531836]")
    actuator = ResetActuator(done=False)
    try:
        audit = AuditLog(database)
        [resumed] = Remediator([actuator], audit, dry_run=False, requested_by="vigil-engine").recover()
        assert left.poll() is None  # not this host's to touch (it stands for a process elsewhere)
    finally:
        stop(left)
    assert actuator.runs == 0
    assert resumed.status is ActionStatus.FAILED and "may still be running" in resumed.result, resumed
    assert "gpu-head-2" in resumed.result
    assert audit.unfinished_runs() == []  # closed: no later takeover runs it blindly either
    [row] = commands_of(audit.engine, KEY)
    assert row["state"] == "unknown", row


def let_end(process: subprocess.Popen[bytes], fifo: Path) -> None:
    """Let the left command end: write to ``fifo`` once it reads it (its start may lag the round under load: a write
    before its open finds no reader, ENXIO); nothing if it has ended (killed) first, or after 30 s."""
    deadline = time.monotonic() + 30
    while process.poll() is None and time.monotonic() < deadline:
        try:
            hold = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # ENXIO: not reading yet
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(0.05)
            continue
        os.write(hold, b"go\n")
        os.close(hold)
        return


def test_an_adopted_command_holds_no_other_run_of_the_takeover(database: str, fifo: Path) -> None:
    """A left GPU reset waited for (up to 20 s here, 600 s by default) is waited for beside the round: the other run
    taken over in the same round is resumed at once, and the round returns while the reset still runs."""
    left = left_reset(database, fifo)
    other = Action(id="act-reset-n2", ts=0.0, kind=ActionKind.RESET_GPU, target="gpu/n2/0", reason="Xid 79",
                   params={"idempotency_key": "act-reset-n2"})
    audit = AuditLog(database)
    assert audit.begin("act-reset-n2", other, owner="vigil-api-killed", now=0.0, lease_expires=30.0) is None
    actuator = ResetActuator(done=False)
    remediator = Remediator([actuator], audit, dry_run=False, requested_by="vigil-engine", adopt_wait_s=20.0)
    try:
        resumed = remediator.recover()
        still_running = left.poll() is None  # read before the reset is let end
        let_end(left, fifo)
        adopted = remediator.wait_adopted(60)
        assert left.wait(30) == 0  # ended as it would have, never killed
    finally:
        stop(left)
    assert still_running  # the round did not wait for it (it waited 20 s, then killed it, before)
    assert [(a.target, a.status) for a in resumed] == [("gpu/n2/0", ActionStatus.EXECUTED)], resumed
    assert [(a.target, a.status) for a in adopted] == [("gpu/n1/0", ActionStatus.EXECUTED)], adopted
    assert actuator.runs == 2
    assert audit.unfinished_runs() == []


def test_a_stalled_owner_ending_its_command_keeps_what_the_next_owner_recorded(database: str, fifo: Path) -> None:
    """The dead owner was only stalled: the next owner killed its command and recorded so; when the stalled owner
    wakes and reaps it (-9), the row stays killed."""
    left = left_reset(database, fifo)
    try:
        remediator = Remediator([ResetActuator(done=False)], AuditLog(database), dry_run=False,
                                requested_by="vigil-engine", adopt_wait_s=0.5)
        remediator.recover()
        remediator.wait_adopted(30)
        returncode = left.wait(30)
    finally:
        stop(left)
    assert returncode == -signal.SIGKILL
    engine = AuditLog(database).engine
    [row] = commands_of(engine, KEY)
    CommandJournal(engine, KEY, "vigil-api-killed", ActionKind.RESET_GPU).ended(str(row["marker"]), returncode)
    [after] = commands_of(engine, KEY)
    assert after["state"] == "killed" and after["result"] == row["result"], after
    assert after["finished"] == row["finished"], after


class SettledWhileStarting(CommandJournal):
    """The journal of an owner that stalled between a command's row and its start: the run's next owner settles the
    row (no process there yet: gone) before this owner starts the command and records the start."""

    def __init__(self, database: str) -> None:
        audit = AuditLog(database)
        super().__init__(audit.engine, KEY, "vigil-api-stalled", ActionKind.RESET_GPU)
        self.pids: list[int] = []
        self.found: list[dict[str, Any]] = []

    def starting(self, argv: list[str]) -> str:
        marker = super().starting(argv)
        self.found = commands.settle_left_running(self.engine, KEY, "vigil-engine-next", ActionKind.RESET_GPU, 0.5)
        return marker

    def started(self, marker: str, pid: int) -> None:
        self.pids.append(pid)
        super().started(marker, pid)


def test_a_command_settled_while_it_started_is_ended_and_its_row_left_settled(database: str, tmp_path: Path) -> None:
    """The next owner settles the stalled owner's command row as gone between the row and the start: the start is not
    recorded over it (before, an unconditional UPDATE set it back to running, and the reset ran beside the next
    owner's run, its row then reading "ended, exited 0"); the command is ended at once and the run's step fails."""
    from vigil.remedy.actuators.base import ActuatorError, recording, run_command

    journal = SettledWhileStarting(database)
    began = time.monotonic()
    with recording(journal), pytest.raises(ActuatorError, match="settled as gone"):
        run_command([sys.executable, "-c", "import time; time.sleep(20)"], 60, "the reset")
    assert time.monotonic() - began < 15  # ended at once, not waited for
    assert [(f["state"], f["result"]) for f in journal.found] == [("gone", "not running when the run was taken over")]
    [row] = commands_of(journal.engine, KEY)
    assert (row["state"], row["result"], row["pid"]) == ("gone", "not running when the run was taken over", None)
    [pid] = journal.pids
    assert commands.start_time(pid) is None  # the command's process has ended


def test_settled_command_records_are_pruned_after_the_kept_age(database: str, fifo: Path) -> None:
    """Rows of settled commands older than the kept age go at a remediator's recovery round (its first, then hourly);
    newer ones and open ones stay whatever their age."""
    audit = AuditLog(database)
    now = time.time()
    journal = CommandJournal(audit.engine, "act-old", "vigil-api-gone", ActionKind.DRAIN)
    rows = {}
    for name, finished_days_ago, state in (("old-ended", 40, "ended"), ("old-killed", 31, "killed"),
                                           ("new-ended", 5, "ended"), ("old-open", None, "running")):
        marker = journal.starting(["scontrol", name])
        rows[name] = marker
        with audit.engine.begin() as conn:
            conn.execute(commands.update(commands.remedy_commands).where(commands.remedy_commands.c.marker == marker)
                         .values(state=state, started=now - 50 * 86400,
                                 finished=None if finished_days_ago is None else now - finished_days_ago * 86400))
    remediator = Remediator([ResetActuator(done=True)], audit, dry_run=False, requested_by="vigil-engine",
                            commands_keep_s=30 * 86400, clock=lambda: now)
    remediator.recover()
    left = {str(row["argv"][1]) for row in commands_of(audit.engine, "act-old")}
    assert left == {"new-ended", "old-open"}
    # hourly, not every round: a row that ages past the bound meanwhile goes at the next hour's round
    with audit.engine.begin() as conn:
        conn.execute(commands.update(commands.remedy_commands)
                     .where(commands.remedy_commands.c.marker == rows["new-ended"]).values(finished=now - 60 * 86400))
    remediator.recover()
    assert {str(row["argv"][1]) for row in commands_of(audit.engine, "act-old")} == {"new-ended", "old-open"}
    remediator.clock = lambda: now + 3601
    remediator.recover()
    assert {str(row["argv"][1]) for row in commands_of(audit.engine, "act-old")} == {"old-open"}


def test_commands_left_open_past_the_kept_age_are_marked_abandoned_then_pruned(database: str,
                                                                                fifo: Path) -> None:
    """A command left starting or running by a crashed owner, whose run has ended, is settled by no one: once older
    than the kept age and a week more it is marked abandoned, saying where it may still run - never deleted while
    open - and pruned a kept age after that mark. One whose run is still started (its next owner settles it), one
    still running on this host, and a recent one stay open."""
    audit = AuditLog(database)
    now = time.time()
    journal = CommandJournal(audit.engine, "act-ended", "vigil-api-crashed", ActionKind.DRAIN)
    journal.host = "gpu-head-2 pid:[4026531836]"
    markers = {}
    for name, started_days_ago in (("crashed-elsewhere", 40), ("recent", 10)):
        markers[name] = journal.starting(["scontrol", name])
        with audit.engine.begin() as conn:
            conn.execute(commands.update(commands.remedy_commands)
                         .where(commands.remedy_commands.c.marker == markers[name])
                         .values(state="running", pid=4242, started=now - started_days_ago * 86400))
    # the run of a crashed owner that is still started: its next owner settles its command
    process = left_reset(database, fifo)
    try:
        with audit.engine.begin() as conn:
            conn.execute(commands.update(commands.remedy_commands).where(commands.remedy_commands.c.key == KEY)
                         .values(started=now - 40 * 86400))
        running_here = CommandJournal(audit.engine, "act-running-here", "vigil-api-crashed", ActionKind.DRAIN)
        marker = running_here.starting(["sleep"])
        running_here.started(marker, process.pid)  # its process still runs on this host
        with audit.engine.begin() as conn:
            conn.execute(commands.update(commands.remedy_commands).where(commands.remedy_commands.c.marker == marker)
                         .values(started=now - 40 * 86400))
        clock = [now]
        remediator = Remediator([ResetActuator(done=True)], audit, dry_run=True, requested_by="vigil-api",
                                commands_keep_s=30 * 86400, clock=lambda: clock[0])
        remediator.prune_commands()
        [crashed, recent] = commands_of(audit.engine, "act-ended")
        assert (crashed["state"], recent["state"]) == ("abandoned", "running")
        assert crashed["finished"] == now
        assert crashed["result"] == ("abandoned: left running by vigil-api-crashed, its end never recorded, its run "
                                     "over; it may still run on gpu-head-2 pid:[4026531836] (pid 4242): check there "
                                     "before running the action again")
        assert [row["state"] for row in commands_of(audit.engine, KEY)] == ["running"]
        assert [row["state"] for row in commands_of(audit.engine, "act-running-here")] == ["running"]
        # a kept age after the mark it goes, like any settled command; the recent one is abandoned by then
        clock[0] = now + 31 * 86400
        remediator.prune_commands()
        assert [(row["argv"][1], row["state"]) for row in commands_of(audit.engine, "act-ended")] == [
            ("recent", "abandoned")]
    finally:
        stop(process)


def test_keep_pruning_prunes_at_every_round_until_stopped(database: str) -> None:
    """`vigil serve --no-engine` runs no recovery round after its start: its remediator prunes on a thread of its own
    (``keep_pruning``), each round as the recovery rounds do, and stops when told."""
    audit = AuditLog(database)
    now = time.time()
    journal = CommandJournal(audit.engine, "act-old", "vigil-api-gone", ActionKind.DRAIN)
    ticks = iter(range(1, 10**6))
    remediator = Remediator([ResetActuator(done=True)], audit, dry_run=True, requested_by="vigil-api",
                            commands_keep_s=30 * 86400, clock=lambda: now + 3601 * next(ticks))
    remediator.prune_commands()  # the start's round, before the row is there
    marker = journal.starting(["scontrol", "old"])
    journal.ended(marker, 0)
    with audit.engine.begin() as conn:
        conn.execute(commands.update(commands.remedy_commands).where(commands.remedy_commands.c.marker == marker)
                     .values(finished=now - 40 * 86400))
    stopped = threading.Event()
    pruning = threading.Thread(target=remediator.keep_pruning, args=(stopped,), kwargs={"every_s": 0.01})
    pruning.start()
    try:
        wait_for(lambda: not commands_of(audit.engine, "act-old"), 30, "the old command's record to be pruned")
    finally:
        stopped.set()
        pruning.join(30)
    assert not pruning.is_alive()


@pytest.mark.parametrize("verb", [["serve", "--no-engine"], ["mcp"]], ids=["serve-no-engine", "mcp"])
def test_a_command_without_an_engine_prunes_its_remediators_commands_and_stops_pruning_at_exit(
        database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, verb: list[str]) -> None:
    """`vigil serve --no-engine` and `vigil mcp` own a remediator that no engine's recovery rounds prune: a thread of
    their own prunes its back-end commands' records from the start (a dry-run remediator's start prunes nothing), and
    their exit stops that thread and waits for it (``closed_at_exit``) before the store closes. Before, `vigil mcp`
    never pruned, `vigil serve --no-engine` first pruned an hour after its start, and neither waited for the thread."""
    from mcp.server.mcpserver import MCPServer
    from typer.testing import CliRunner

    from tests.conftest import free_port
    from vigil.config import settings
    from vigil.faces.api.context import ServeContext
    from vigil.faces.cli import serve as serve_command
    from vigil.faces.cli.main import app

    audit = AuditLog(database)
    journal = CommandJournal(audit.engine, "act-old", "vigil-api-gone", ActionKind.DRAIN)
    marker = journal.starting(["scontrol", "old"])
    journal.ended(marker, 0)
    with audit.engine.begin() as conn:
        conn.execute(commands.update(commands.remedy_commands).where(commands.remedy_commands.c.marker == marker)
                     .values(finished=time.time() - 40 * 86400))  # past the 30 days kept
    for key in [k for k in os.environ if k.startswith("VIGIL_")]:
        monkeypatch.delenv(key)
    # execute_actions off: a dry-run remediator, whose start (``_resumed``) prunes nothing
    for key, value in {"VIGIL_HOME": str(tmp_path / "home"), "VIGIL_DB_URL": database,
                       "VIGIL_REMEDY_BACKEND": "slurm"}.items():
        monkeypatch.setenv(key, value)
    pruned = threading.Event()
    pruners: list[threading.Thread] = []
    prune = Remediator.prune_commands

    def noted(self: Remediator) -> None:
        pruners.append(threading.current_thread())
        prune(self)
        if not commands_of(self.audit.engine, "act-old"):
            pruned.set()

    def serving(*_: object) -> None:  # the server, until the record is pruned
        assert pruned.wait(60), "no prune while the command served"

    class Server:
        started, force_exit, should_exit = True, False, False
        run = serving

        def note(self, sig: int) -> None: ...

        def why(self) -> str:
            return "stopped"

    joined: list[str] = []
    join = threading.Thread.join

    def noted_join(self: threading.Thread, timeout: float | None = None) -> None:
        joined.append(self.name)
        join(self, timeout)

    monkeypatch.setattr(Remediator, "prune_commands", noted)
    monkeypatch.setattr(serve_command, "_noting_server", lambda _config: Server())
    monkeypatch.setattr(serve_command, "_freeze_heap", lambda: None)
    # the waste report's first computation, which the server starts beside and does not wait for, would read the
    # store after it closed (the process ends there; this test's database stays)
    monkeypatch.setattr(ServeContext, "waste", lambda self: None)
    monkeypatch.setattr(MCPServer, "run", serving)
    monkeypatch.setattr(threading.Thread, "join", noted_join)
    settings.cache_clear()
    try:
        done = CliRunner().invoke(app, [*verb, *(["--port", str(free_port())] if verb[0] == "serve" else [])])
        assert done.exit_code == 0, (done.output, done.exception)
        (pruner,) = set(pruners)
        assert pruner.name == "vigil-prune-commands" and pruner.name in joined and not pruner.is_alive()
        assert not commands_of(audit.engine, "act-old")
    finally:  # also when it fails: no pool left holding PostgreSQL connections for the tests after it
        settings.cache_clear()
        close_engines()
