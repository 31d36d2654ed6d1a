"""`vigil engine` as a real process on a real store (SQLite, PostgreSQL), stopped with Ctrl-C while its tick's round
resumes one of two drains dead servers left: the drain in flight finishes, and the round claims no further run."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.remedy.claims import crashed_drains
from tests.remedy.claims import database as database
from tests.remedy.held_slurm import HeldSlurm, acting_env, held_slurm, place_cluster
from tests.serve.conftest import REPO
from tests.serve.conftest import postgres_url as postgres_url
from vigil.model import ActionStatus
from vigil.remedy.audit import AuditLog

pytestmark = pytest.mark.slow


def test_ctrl_c_while_a_round_resumes_claims_no_further_run(database: str, tmp_path: Path) -> None:
    """Two dead servers' drains appear once the engine runs; its tick's round resumes the first. Ctrl-C: the engine
    says it waits, the drain in flight ends executed, and the process exits 0 without claiming the second, which
    stays started under its dead owner for the next engine or a peer. Before, Ctrl-C left ``stop`` unset (it ends
    run() in its wait), so the round went on and drained the second node too while the process waited for it."""
    place_cluster(database)
    home = tmp_path / "home"
    home.mkdir()
    err_lines: list[str] = []
    with held_slurm(tmp_path / "slurm") as slurm:
        engine = subprocess.Popen([sys.executable, "-m", "vigil", "engine"], cwd=REPO,
                                  env=acting_env(home, database, slurm), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        assert engine.stderr is not None
        reader = threading.Thread(target=lambda: err_lines.extend(iter(engine.stderr.readline, "")), daemon=True)
        reader.start()
        try:
            wait_for(lambda: any("vigil engine on" in line for line in err_lines) or engine.poll() is not None, 120,
                     "the engine to run")
            assert engine.poll() is None, err_lines
            crashed_drains(database, "n1", "n2")
            wait_for(lambda: slurm.draining("n1") or slurm.draining("n2") or engine.poll() is not None, 60,
                     "the tick's round to resume a drain")
            first = "n1" if slurm.draining("n1") else "n2"
            engine.send_signal(signal.SIGINT)
            wait_for(lambda: any("stopping" in line for line in err_lines) or engine.poll() is not None, 60,
                     "the engine to say it stops")
            assert engine.poll() is None, err_lines
            slurm.release()
            assert engine.wait(timeout=60) == 0, err_lines
        finally:
            if engine.poll() is None:
                engine.kill()
                engine.wait()
        reader.join(10)
    second = {"n1": "n2", "n2": "n1"}[first]
    assert not slurm.draining(second), err_lines
    audit = AuditLog(database)
    assert [(a.id, a.status) for a in audit.actions()] == [(f"act-drain-{first}", ActionStatus.EXECUTED)]
    (left,) = audit.unfinished_runs()
    assert (left.key, left.owner) == (f"act-drain-{second}", "vigil-api-killed")
    assert [line for line in err_lines if "stopping" in line] == [STOPPING]


STOPPING = ("vigil engine: stopping; waiting for the tick and the actions it is resuming, at most 30 s (Ctrl-C again "
            "to stop at once)\n")
AT_ONCE = ("vigil engine: stopped at once on a second Ctrl-C, without finishing the current round; an action it was "
           "resuming is taken over by another server or engine once this process's lease on it lapses\n")


def start_engine(home: Path, database: str, slurm: HeldSlurm, err_lines: list[str]) -> subprocess.Popen[str]:
    """`vigil engine` executing through ``slurm`` on ``database``; its stderr lines go to ``err_lines``, every one of
    them there once ``all_read(engine)`` returns (after the process ended)."""
    engine = subprocess.Popen([sys.executable, "-m", "vigil", "engine"], cwd=REPO,
                              env=acting_env(home, database, slurm), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    assert engine.stderr is not None
    stderr = engine.stderr
    reader = threading.Thread(target=lambda: err_lines.extend(iter(stderr.readline, "")), daemon=True)
    reader.start()
    _readers[engine.pid] = reader
    return engine


_readers: dict[int, threading.Thread] = {}


def all_read(engine: subprocess.Popen[str]) -> None:
    """Wait for the reader of the ended ``engine``'s stderr to reach its end (the lines it wrote last included)."""
    reader = _readers.pop(engine.pid)
    reader.join(60)
    assert not reader.is_alive(), "the engine's stderr still open a minute after it ended"


def test_a_second_ctrl_c_stops_at_once_with_one_line_and_ends_the_drain(database: str, tmp_path: Path) -> None:
    """Ctrl-C while the engine's round resumes a drain, then Ctrl-C again: the engine exits 130 at once with one line
    saying what it leaves, the drain's scontrol (in a session of its own) is killed on the way out, and the run stays
    started under the engine's claim for the lease takeover. Before, the second Ctrl-C ended the process without a
    word, and the scontrol it had started went on draining with no one to record it."""
    place_cluster(database)
    home = tmp_path / "home"
    home.mkdir()
    err_lines: list[str] = []
    with held_slurm(tmp_path / "slurm") as slurm:
        engine = start_engine(home, database, slurm, err_lines)
        try:
            wait_for(lambda: any("vigil engine on" in line for line in err_lines) or engine.poll() is not None, 120,
                     "the engine to run")
            crashed_drains(database, "n1")
            wait_for(lambda: slurm.draining("n1") or engine.poll() is not None, 60, "the tick's round to resume it")
            assert engine.poll() is None, err_lines
            engine.send_signal(signal.SIGINT)
            wait_for(lambda: STOPPING in err_lines or engine.poll() is not None, 60, "the engine to say it stops")
            engine.send_signal(signal.SIGINT)
            assert engine.wait(timeout=15) == 130, err_lines  # the drain holds, and the wait would last 30 s
            wait_for(lambda: not slurm.drain_running("n1"), 30, "the drain's scontrol to be gone")
        finally:
            if engine.poll() is None:
                engine.kill()
                engine.wait()
    wait_for(lambda: bool(err_lines) and err_lines[-1] == AT_ONCE, 10, "the engine's last line")
    assert err_lines[err_lines.index(STOPPING) + 1:] == [AT_ONCE], err_lines
    (run,) = AuditLog(database).unfinished_runs()
    assert run.key == "act-drain-n1" and run.owner is not None and run.owner.startswith("vigil-engine-")
    assert AuditLog(database).actions() == []


STOPPING_ON_SIGTERM = ("vigil engine: stopping on SIGTERM; waiting for the tick and the actions it is resuming, at "
                       "most 30 s\n")


@pytest.mark.parametrize("sent", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_stop_during_the_start_up_resume_lets_the_drain_in_flight_finish(database: str, tmp_path: Path,
                                                                          sent: signal.Signals) -> None:
    """Two dead servers' drains are there when the engine starts; its start-up resume takes the first over, and
    Ctrl-C (or SIGTERM, a service manager stopping it: the same path) comes while that drain runs. The engine says it
    stops in one line, the drain ends executed and its run closed, the second stays started under its dead owner, and
    the process exits 0 without a traceback and without starting its loop. Before, Ctrl-C raised in the middle of the
    resume: the drain's command was killed, its run left started under the engine's claim, and the process ended at
    once (exit 130); SIGTERM set stopping without a word."""
    said = STOPPING if sent == signal.SIGINT else STOPPING_ON_SIGTERM
    place_cluster(database)
    crashed_drains(database, "n1", "n2")
    home = tmp_path / "home"
    home.mkdir()
    err_lines: list[str] = []
    with held_slurm(tmp_path / "slurm") as slurm:
        engine = start_engine(home, database, slurm, err_lines)
        try:
            wait_for(lambda: slurm.draining("n1") or slurm.draining("n2") or engine.poll() is not None, 120,
                     "the start-up to resume a drain")
            first = "n1" if slurm.draining("n1") else "n2"
            engine.send_signal(sent)
            wait_for(lambda: said in err_lines or engine.poll() is not None, 60, "the engine to say it stops")
            assert engine.poll() is None, err_lines
            slurm.release()
            assert engine.wait(timeout=60) == 0, err_lines
        finally:
            if engine.poll() is None:
                engine.kill()
                engine.wait()
    second = {"n1": "n2", "n2": "n1"}[first]
    assert not slurm.draining(second), err_lines
    audit = AuditLog(database)
    assert [(a.id, a.status) for a in audit.actions()] == [(f"act-drain-{first}", ActionStatus.EXECUTED)]
    (left,) = audit.unfinished_runs()
    assert (left.key, left.owner) == (f"act-drain-{second}", "vigil-api-killed")
    all_read(engine)  # its last lines read: a traceback written as it ended is seen
    assert [line for line in err_lines if "stopping" in line] == [said], err_lines
    assert not any("Traceback" in line for line in err_lines), err_lines
    assert not any("vigil engine on" in line for line in err_lines), err_lines


FAILING_WORK = """
import threading
from vigil.faces.cli.main import app
from vigil.faces.cli.stopping import run_stoppable
import typer

@app.command("fails-on-its-thread")
def fails() -> None:
    def work() -> None:
        raise RuntimeError("the store went away\\nsecond line")
    run_stoppable(work, threading.Event(), who="vigil engine", waiting="w", left="l")

from vigil.faces.cli.main import main
main()
"""


def test_an_error_on_the_work_thread_ends_the_process_with_one_line_exit_1() -> None:
    """A command's work thread (the engine's start and ticks) raising: the process ends, exit 1, with one line naming
    the error - not a traceback, not a hang on the main thread's wait. Before, a traceback."""
    done = subprocess.run([sys.executable, "-c", FAILING_WORK, "fails-on-its-thread"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == ["vigil engine: stopped by an error: RuntimeError: the store went away"]


STUCK_WORK = """
import os
import signal
import threading
from vigil.faces.cli.main import app
from vigil.faces.cli.stopping import run_stoppable

@app.command("stuck-on-its-thread")
def stuck() -> None:
    never = threading.Event()

    def work() -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        never.wait()  # a tick stuck in a database call: it never looks at stop
    run_stoppable(work, threading.Event(), who="vigil engine", waiting="w", left="l", bound_s=0.3)

from vigil.faces.cli.main import main
main()
"""


def test_a_stop_waits_one_bound_at_most_for_work_that_never_ends() -> None:
    """SIGTERM while the work thread is stuck where it never looks at stop (a database call that does not return):
    the command waits its bound (the lease) and ends, exit 0, with the stopping line and one saying it did not stop
    in time. Before, the engine's line promised "at most N s" and the main thread's join waited for ever (here: the
    subprocess timeout)."""
    done = subprocess.run([sys.executable, "-c", STUCK_WORK, "stuck-on-its-thread"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == ["vigil engine: stopping on SIGTERM; w",
                                        "vigil engine: did not stop within 0.3 s, l"]


STUCK_IN_LOGGING = """
import logging
import os
import signal
import threading
from vigil.faces.cli.main import app
from vigil.faces.cli.stopping import run_stoppable

never = threading.Event()


class Stuck(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:  # called under the handler's lock, which it keeps
        os.kill(os.getpid(), signal.SIGTERM)
        never.wait()


@app.command("stuck-in-logging")
def stuck() -> None:
    logging.getLogger("stuck").addHandler(Stuck())
    run_stoppable(lambda: logging.getLogger("stuck").warning("a tick's line"), threading.Event(), who="vigil engine",
                  waiting="w", left="l", bound_s=0.3)

from vigil.faces.cli.main import main
main()
"""


def test_work_abandoned_holding_a_logging_lock_does_not_hold_up_the_exit() -> None:
    """The work thread abandoned past the bound holds a logging handler's lock: the command still ends, exit 0, with
    its two lines. Before, the interpreter's exit waited in logging.shutdown for that lock for ever (here: the
    subprocess timeout)."""
    done = subprocess.run([sys.executable, "-c", STUCK_IN_LOGGING, "stuck-in-logging"], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == ["vigil engine: stopping on SIGTERM; w",
                                        "vigil engine: did not stop within 0.3 s, l"]
