"""`vigil serve` shutting down (SIGTERM) while its engine is resuming a dead peer's drain: the process ends once the
drain's run is closed, or after one lease with one warning - as the engine's own stop and `vigil engine --once` do.
Real processes, a fake `scontrol` that holds the drain until the test lets it go (a FIFO, no sleeps). On SQLite and on
PostgreSQL."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.remedy.claims import crashed_drain, crashed_drains
from tests.remedy.claims import database as database
from tests.remedy.held_slurm import HeldSlurm, acting_env, held_slurm, place_cluster
from tests.run.counted_connections import left_open
from tests.serve.conftest import REPO, TOKEN, free_port, start_server, wait_for
from tests.serve.conftest import postgres_url as postgres_url
from tests.serve.stop_lines import AT_ONCE
from vigil.model import ActionStatus
from vigil.remedy.audit import AuditLog

pytestmark = pytest.mark.slow


@contextmanager
def killed_at_the_end(process: subprocess.Popen[bytes], group: bool = False) -> Iterator[subprocess.Popen[bytes]]:
    """``process``, killed at the end if it still runs (its whole process group where ``group``)."""
    try:
        yield process
    finally:
        if process.poll() is None:
            if group:
                os.killpg(process.pid, signal.SIGKILL)
            else:
                process.kill()
            process.wait()


@contextmanager
def resuming_a_drain(database: str, tmp_path: Path, own_group: bool = False,
                     **env: str) -> Iterator[tuple[subprocess.Popen[bytes], HeldSlurm, Path]]:
    """`vigil serve --engine` (its home tmp_path/home, ``env`` added to its settings; ``own_group``: in a process group
    of its own) whose engine has taken over the drain a server killed mid-drain left started, held by the fake
    scontrol until released: yields the server, the held Slurm and the home. Killed at the end if still running (its
    whole group where ``own_group``)."""
    place_cluster(database)
    home = tmp_path / "home"
    with held_slurm(tmp_path / "slurm") as slurm:
        server = start_server(home, acting_env(home, database, slurm, **env), "--engine", own_group=own_group)
        with killed_at_the_end(server, group=own_group):
            crashed_drain(AuditLog(database), at=1_000.0, lease_s=30.0)  # its lease lapsed long ago
            wait_for(slurm.draining, 60, "the engine to resume the drain")
            yield server, slurm, home


def test_serve_stopped_waits_for_the_drain_its_engine_resumes(database: str, tmp_path: Path) -> None:
    """A server killed mid-drain left the drain started; a second server's engine takes it over on a tick, and the
    second server gets SIGTERM while the drain is evicting. It is still there a second later, and exits 0 once the
    drain ends, the run closed and recorded executed. Before, it ended at once (the engine's threads are daemons),
    leaving the run started for another process a lease later."""
    with resuming_a_drain(database, tmp_path) as (server, slurm, home):
        server.send_signal(signal.SIGTERM)
        with pytest.raises(subprocess.TimeoutExpired):
            server.wait(timeout=1.0)
        slurm.release()
        assert server.wait(timeout=60) == 0, (home / "serve.log").read_text()
    audit = AuditLog(database)
    assert audit.unfinished() == []
    (record,) = audit.actions()
    assert (record.id, record.status) == ("act-drain-n1", ActionStatus.EXECUTED)
    assert record.params["taken_over_from"] == "vigil-api-killed"


def test_serve_stopped_gives_up_on_the_drain_after_one_lease(database: str, tmp_path: Path) -> None:
    """The same with a drain that does not end and a 2 s lease: the server exits 0 about a lease after SIGTERM with
    one warning, leaving the run started under its claim for another process to take over. Before, it ended at
    once without a word."""
    with resuming_a_drain(database, tmp_path, VIGIL_REMEDY_LEASE_S="2",
                          VIGIL_REMEDY_LEASE_RENEW_S="0.5") as (server, _, home):
        server.send_signal(signal.SIGTERM)
        with pytest.raises(subprocess.TimeoutExpired):
            server.wait(timeout=1.0)
        assert server.wait(timeout=60) == 0, (home / "serve.log").read_text()
        log = (home / "serve.log").read_text()
        assert log.count("stopping while interrupted actions are still being resumed after 2 s (one lease)") == 1, log
        (run,) = AuditLog(database).unfinished_runs()
        assert run.key == "act-drain-n1" and run.owner is not None and run.owner.startswith("vigil-api-")


WAITING = ("vigil serve: stopping; waiting for the engine's tick and the actions it resumes, at most 30 s (Ctrl-C "
           "again to stop at once)")


def test_a_second_ctrl_c_ends_the_wait_at_once(database: str, tmp_path: Path) -> None:
    """Ctrl-C while the engine resumes a drain: the server says it waits for it, and a second Ctrl-C ends the wait at
    once - exit 130, one line saying what is left, no traceback - leaving the run started under the server's claim for
    a takeover once it lapses, and killing on its way out the drain's scontrol it started (in a session of its own).
    Before, the server waited without a word, and a second Ctrl-C ended it silently; and after that, the scontrol
    outlived the server, draining with no one to record it."""
    log = tmp_path / "home" / "serve.log"
    with resuming_a_drain(database, tmp_path) as (server, slurm, _):
        server.send_signal(signal.SIGINT)
        wait_for(lambda: WAITING in log.read_text(), 60, "the server to wait for its engine")
        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=15) == 130, log.read_text()  # the drain holds, and the wait would last 30 s
        wait_for(lambda: not slurm.drain_running("n1"), 30, "the drain's scontrol to be gone")
    text = log.read_text()
    assert text.split(WAITING, 1)[1].strip().splitlines() == [AT_ONCE], text
    assert "Traceback" not in text
    (run,) = AuditLog(database).unfinished_runs()
    assert run.key == "act-drain-n1" and run.owner is not None and run.owner.startswith("vigil-api-")


AT_ONCE_FIRST = ("vigil serve: stopped at once on Ctrl-C, without waiting for the engine; an action it was resuming is "
                 "taken over by another server or engine once this process's lease on it lapses")


def test_ctrl_c_after_sigterm_is_named_as_the_first(database: str, tmp_path: Path) -> None:
    """SIGTERM while the engine resumes a drain: the server says it stops on SIGTERM and that Ctrl-C stops it at once,
    and Ctrl-C then does - exit 130, the line naming Ctrl-C, not a second one. Before, the lines said "Ctrl-C again"
    and "on a second Ctrl-C" where no Ctrl-C had come."""
    log = tmp_path / "home" / "serve.log"
    waiting = ("vigil serve: stopping on SIGTERM; waiting for the engine's tick and the actions it resumes, at most "
               "30 s (Ctrl-C to stop at once)")
    with resuming_a_drain(database, tmp_path) as (server, _, _):
        server.send_signal(signal.SIGTERM)
        wait_for(lambda: waiting in log.read_text() or server.poll() is not None, 60,
                 "the server to wait for its engine")
        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=15) == 130, log.read_text()
    text = log.read_text()
    assert text.split(waiting, 1)[1].strip().splitlines() == [AT_ONCE_FIRST], text
    assert "Traceback" not in text


IN_THE_WINDOW = """
import sys, time
from pathlib import Path
import vigil.faces.cli.serve as serve
port, marker = int(sys.argv[1]), Path(sys.argv[2])

def in_the_window(*args, **kwargs):
    # uvicorn has stopped and put Python's SIGINT handler back; the wait has not taken SIGINT over yet. Held in short
    # sleeps, not signal.pause(): a Ctrl-C that lands between the marker and pause()'s system call is handled before
    # pause() blocks, which then waits for a signal that never comes; a sleep's end raises the KeyboardInterrupt
    marker.write_text("")
    while True:  # until the second Ctrl-C's KeyboardInterrupt
        time.sleep(0.05)

serve._stop_engine = in_the_window
sys.argv = ["vigil", "serve", "--port", str(port), "--engine"]
from vigil.faces.cli.main import main
main()
"""


def test_a_second_ctrl_c_before_the_wait_begins_stops_at_once(tmp_path: Path) -> None:
    """Ctrl-C stops the server; a second one comes after uvicorn put Python's handler back and before the engine's
    wait takes it (held there in this test: the process waits for the signal): exit 130 with the one line, as during
    the wait. Before, the KeyboardInterrupt went up outside the wait's handling: the process ended without a word on
    what it left."""
    port = free_port()
    env = {**os.environ, "VIGIL_HOME": str(tmp_path), "VIGIL_API_TOKEN": TOKEN, "PYTHONPATH": str(REPO)}
    log, marker = tmp_path / "serve.log", tmp_path / "in-the-window"
    with log.open("ab") as err:
        server = subprocess.Popen([sys.executable, "-c", IN_THE_WINDOW, str(port), str(marker)], cwd=REPO, env=env,
                                  stdout=subprocess.DEVNULL, stderr=err)
    with killed_at_the_end(server):
        def healthy() -> bool:
            assert server.poll() is None, log.read_text()
            try:
                return httpx.get(f"http://127.0.0.1:{port}/api/v1/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(healthy, 120, "vigil serve to answer /api/v1/health")
        server.send_signal(signal.SIGINT)
        wait_for(lambda: marker.exists() or server.poll() is not None, 60, "uvicorn to stop")
        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=60) == 130, log.read_text()
    text = log.read_text()
    assert text.strip().splitlines()[-1] == AT_ONCE, text
    assert "Aborted" not in text and "Traceback" not in text


def test_ctrl_c_to_the_process_group_leaves_the_drain_to_end(database: str, tmp_path: Path) -> None:
    """Ctrl-C as a terminal sends it, SIGINT to the whole foreground process group, while the server's engine resumes
    a drain: the server waits for the drain, whose scontrol - in a session of its own - is still there, finishes
    once released and the run is closed executed; exit 0. Before, scontrol was in the server's group and died of the
    same SIGINT, the drain recorded failed while the server waited for it."""
    log = tmp_path / "home" / "serve.log"
    with resuming_a_drain(database, tmp_path, own_group=True) as (server, slurm, _):
        os.killpg(server.pid, signal.SIGINT)
        wait_for(lambda: WAITING in log.read_text(), 60, "the server to wait for its engine")
        audit = AuditLog(database)
        reader: list[int] = []

        def scontrol_reading_or_run_closed() -> bool:
            try:  # without a reader on the FIFO: ENXIO
                reader.append(os.open(slurm.state_dir / "release", os.O_WRONLY | os.O_NONBLOCK))
                return True
            except OSError:
                return audit.unfinished() == []

        wait_for(scontrol_reading_or_run_closed, 60, "scontrol to read the release or the drain to end")
        assert reader, f"the drain ended before its release: scontrol died of the SIGINT\n{log.read_text()}"
        os.write(reader[0], b"go\n")
        os.close(reader[0])
        assert server.wait(timeout=60) == 0, log.read_text()
    assert "Traceback" not in log.read_text()
    assert audit.unfinished() == []
    (record,) = audit.actions()
    assert (record.id, record.status) == ("act-drain-n1", ActionStatus.EXECUTED), (record, log.read_text())


EARLY_SIGTERM = """
import os, signal, sys
import vigil.faces.cli.serve as serve
serve._freeze_heap = lambda: os.kill(os.getpid(), signal.SIGTERM)  # the signal lands during the heap's freeze
sys.argv = ["vigil", "serve", "--port", sys.argv[1], "--engine"]
from vigil.faces.cli.main import main
main()
"""


def test_sigterm_during_start_up_ends_the_server(tmp_path: Path) -> None:
    """SIGTERM between the engine's handler and uvicorn's own (during the heap's freeze, 0.3-0.8 s): the server ends,
    exit 0, without ever serving. Before, only the engine stopped, and the server answered /api/v1/health and
    served on, the signal spent."""
    port = free_port()
    env = {**os.environ, "VIGIL_HOME": str(tmp_path), "VIGIL_API_TOKEN": TOKEN, "PYTHONPATH": str(REPO)}
    log = tmp_path / "serve.log"
    server = subprocess.Popen([sys.executable, "-c", EARLY_SIGTERM, str(port)], cwd=REPO, env=env,
                              stdout=subprocess.DEVNULL, stderr=log.open("ab"))
    with killed_at_the_end(server):
        def answered_or_ended() -> bool:
            if server.poll() is not None:
                return True
            try:
                return httpx.get(f"http://127.0.0.1:{port}/api/v1/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(answered_or_ended, 120, "the server to end or answer")
        assert server.poll() is not None, "SIGTERM received during start-up: the server serves on"
        assert server.returncode == 0, log.read_text()


PORT_TAKEN = """
import os, socket, sys
from pathlib import Path
import vigil.faces.cli.serve as serve
from tests.conftest import wait_for
from tests.remedy.claims import crashed_drain
from vigil.remedy.actuators.slurm import SlurmActuator
from vigil.remedy.audit import AuditLog
port, draining = int(sys.argv[1]), Path(sys.argv[2])
taken = []
# the held drain outlasts the slowest start-up: scontrol's own timeout (30 s) would end it first on a loaded machine
SlurmActuator.__init__.__defaults__ = ("scontrol", 600.0)

def take_the_port():
    # a server beside this one dies mid-drain once this one's engine runs (the server's own resume at start is over),
    # the engine takes the drain over, and then another process takes the port uvicorn is about to bind
    crashed_drain(AuditLog(os.environ["VIGIL_DB_URL"]), at=1_000.0, lease_s=30.0)
    wait_for(draining.exists, 60, "the engine to resume the drain")
    sock = socket.socket()
    sock.bind(("127.0.0.1", port))
    sock.listen()
    taken.append(sock)

serve._freeze_heap = take_the_port
sys.argv = ["vigil", "serve", "--port", str(port), "--engine"]
from vigil.faces.cli.main import main
main()
"""


def test_a_failed_start_up_stops_the_engine_it_started(database: str, tmp_path: Path) -> None:
    """The port is free when `vigil serve` checks it and taken when uvicorn binds it, while the engine the server
    started resumes a dead server's drain: uvicorn's one error line, no traceback, and the process waits for the drain
    (the engine stopped the bounded way) and exits non-zero once it ends, the run closed executed. On the code before
    a673256 it exited (3) at once, the drain still held."""
    place_cluster(database)
    home = tmp_path / "home"
    home.mkdir()
    log = home / "serve.log"
    port = free_port()
    with held_slurm(tmp_path / "slurm") as slurm:
        server = subprocess.Popen([sys.executable, "-c", PORT_TAKEN, str(port), str(slurm.state_dir / "draining-n1")],
                                  cwd=REPO, env=acting_env(home, database, slurm), stdout=subprocess.DEVNULL,
                                  stderr=log.open("ab"))
        with killed_at_the_end(server):
            wait_for(lambda: "address already in use" in log.read_text() or server.poll() is not None, 120,
                     "uvicorn to fail to bind the port")
            with pytest.raises(subprocess.TimeoutExpired):
                server.wait(timeout=3.0)  # waiting for the drain, held until released
            slurm.release()
            assert server.wait(timeout=60) == 3, log.read_text()  # a start-up that failed, as uvicorn.run exits
    text = log.read_text()
    # no Ctrl-C came: the line says start-up failed, and that Ctrl-C (not "again") stops the wait at once
    assert ("vigil serve: start-up failed; waiting for the engine's tick and the actions it resumes, at most 30 s "
            "(Ctrl-C to stop at once)") in text, text
    errors = [line for line in text.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and "address already in use" in errors[0] and str(port) in errors[0], text
    assert "Traceback" not in text
    audit = AuditLog(database)
    assert audit.unfinished() == []
    (record,) = audit.actions()
    assert (record.id, record.status) == ("act-drain-n1", ActionStatus.EXECUTED), record


def test_a_bad_database_url_is_one_line_before_anything_starts(tmp_path: Path) -> None:
    """A database that cannot be reached: one line on stderr, exit 2, before the engine or the server start."""
    env = {**os.environ, "VIGIL_HOME": str(tmp_path), "VIGIL_API_TOKEN": TOKEN, "PYTHONPATH": str(REPO),
           "VIGIL_DB_URL": f"postgresql+psycopg://vigil@127.0.0.1:{free_port()}/nowhere"}
    done = subprocess.run([sys.executable, "-m", "vigil", "serve", "--port", str(free_port()), "--engine"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "cannot open the store" in lines[0] and "Traceback" not in done.stderr, done.stderr


def test_start_server_closes_its_handle_on_the_log(tmp_path: Path) -> None:
    """start_server hands serve.log to the process and closes its own handle on it: no ResourceWarning for an unclosed
    serve.log (before, the file it opened for the process was left to the garbage collector, unclosed)."""
    home = tmp_path / "home"
    env = {**os.environ, "VIGIL_HOME": str(home), "VIGIL_API_TOKEN": TOKEN, "PYTHONPATH": str(REPO)}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        server = start_server(home, env, "--no-engine")
        gc.collect()
    try:
        assert [str(w.message) for w in caught if "serve.log" in str(w.message)] == []
    finally:
        server.terminate()
        server.wait(60)


STARTUP_WAITING = ("vigil serve: stopping; waiting for the action it is resuming at start-up, at most 30 s (Ctrl-C "
                   "again to stop at once)")


def test_ctrl_c_during_the_start_up_resume_lets_the_drain_in_flight_finish(database: str, tmp_path: Path) -> None:
    """Two dead servers' drains are there when `vigil serve` starts; its start-up resume takes the first over, and
    Ctrl-C comes while that drain runs. The server says it stops, the drain ends executed and its run closed, the
    second stays started under its dead owner, and the process exits 0 before serving, without a traceback. Before,
    Ctrl-C raised in the middle of the resume: the drain's command was killed, its run left started under the
    server's claim, and the process ended at once (exit 130)."""
    place_cluster(database)
    crashed_drains(database, "n1", "n2")
    home = tmp_path / "home"
    home.mkdir()
    log = home / "serve.log"
    with held_slurm(tmp_path / "slurm") as slurm, log.open("ab") as err:
        server = subprocess.Popen([sys.executable, "-m", "vigil", "serve", "--port", str(free_port()), "--no-engine"],
                                  cwd=REPO, env=acting_env(home, database, slurm), stdout=subprocess.DEVNULL,
                                  stderr=err)
        with killed_at_the_end(server):
            wait_for(lambda: slurm.draining("n1") or slurm.draining("n2") or server.poll() is not None, 120,
                     "the start-up to resume a drain")
            first = "n1" if slurm.draining("n1") else "n2"
            server.send_signal(signal.SIGINT)
            wait_for(lambda: STARTUP_WAITING in log.read_text() or server.poll() is not None, 60,
                     "the server to say it stops")
            assert server.poll() is None, log.read_text()
            slurm.release()
            assert server.wait(timeout=60) == 0, log.read_text()
    text = log.read_text()
    assert "Traceback" not in text and "vigil serving on" not in text, text
    second = {"n1": "n2", "n2": "n1"}[first]
    assert not slurm.draining(second), text
    audit = AuditLog(database)
    assert [(a.id, a.status) for a in audit.actions()] == [(f"act-drain-{first}", ActionStatus.EXECUTED)]
    (left,) = audit.unfinished_runs()
    assert (left.key, left.owner) == (f"act-drain-{second}", "vigil-api-killed")



@pytest.mark.parametrize("engine", ["--engine", "--no-engine"])
def test_serve_stopped_by_sigterm_closes_its_connections(database: str, tmp_path: Path, engine: str) -> None:
    """`vigil serve` stopped by SIGTERM closes every database connection it opened - its store's pool and the remedy
    journal's engines - with or without its engine; before, it left them to the process's end."""
    place_cluster(database)
    home = tmp_path / "home"
    with held_slurm(tmp_path / "slurm") as slurm:
        server = start_server(home, acting_env(home, database, slurm), engine, module="tests.run.counted_connections")
        with killed_at_the_end(server):
            server.send_signal(signal.SIGTERM)
            assert server.wait(timeout=120) == 0, (home / "serve.log").read_text()
    assert left_open((home / "serve.log").read_text().splitlines()) == 0
