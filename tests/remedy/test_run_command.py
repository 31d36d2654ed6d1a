"""`run_command`, the back ends' command line (scontrol, nvidia-smi, squeue): the program runs in a session and process
group of its own, so that a terminal's Ctrl-C (SIGINT to the foreground group) does not end it, and its timeout ends
the whole group Vigil started, a child the program left behind included."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, NoReturn

import pytest

from vigil import procgroups
from vigil.remedy.actuators import base
from vigil.remedy.actuators.base import ActuatorError, run_command

# a back end that starts a child of its own which holds its output open and blocks reading a FIFO never written to,
# and blocks there itself; each writes its pid and process group first
HOLDING = """
import os, subprocess, sys
fifo, pids = sys.argv[1], sys.argv[2]
child = subprocess.Popen([sys.executable, "-c", "import os, sys; open(sys.argv[1]).read()", fifo])
with open(pids, "w") as out:
    out.write(f"{os.getpid()} {os.getpgrp()} {child.pid}\\n")
open(fifo).read()
"""


def test_the_timeout_ends_the_group_it_started(tmp_path: Path) -> None:
    """A back end that outlasts its timeout: ActuatorError naming it, returned once the program and the child it
    started are both gone (no reader left on the FIFO); the program led a group of its own, not the caller's. Before,
    the program ran in the caller's group and only it was killed: its child went on reading."""
    fifo, pids = tmp_path / "hold", tmp_path / "pids"
    os.mkfifo(fifo)
    with pytest.raises(ActuatorError) as raised:
        run_command([sys.executable, "-c", HOLDING, str(fifo), str(pids)], 5.0, "held back end")
    assert str(raised.value) == "held back end timed out after 5s"
    try:  # no reader left: ENXIO
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # (and one left is let go)
        left_reading = True
    except OSError:
        left_reading = False
    pid, group, child = (int(part) for part in pids.read_text().split())
    assert not left_reading, f"the back end's child {child} still reads after the timeout"
    assert group == pid != os.getpgrp()


class _Parked(Exception):
    """Raised where run_command would park its thread until the interpreter's end."""


def _park() -> NoReturn:
    raise _Parked


def test_a_command_started_while_the_process_exits_is_killed_with_it(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A daemon thread starts a back end's command just as the process exits: its start (parked just before Popen)
    and registration hold off the exit's kill, which then ends it; the thread records no verdict. Before, the exit
    took its list between the Popen and the registration and the command outlived Vigil."""
    fifo = tmp_path / "hold"
    os.mkfifo(fifo)
    at_popen, go = threading.Event(), threading.Event()
    started: list[subprocess.Popen[str]] = []
    real_popen = subprocess.Popen

    def parked_popen(*args: Any, **kwargs: Any) -> subprocess.Popen[str]:
        at_popen.set()
        go.wait()
        process: subprocess.Popen[str] = real_popen(*args, **kwargs)
        started.append(process)
        return process

    moved = threading.Event()  # the exit has ended, or waits for the lock held by another thread

    class WatchedLock:
        def __init__(self) -> None:
            self.lock = threading.Lock()

        def __enter__(self) -> None:
            if not self.lock.acquire(blocking=False):
                moved.set()
                self.lock.acquire()

        def __exit__(self, *_: object) -> None:
            self.lock.release()

    monkeypatch.setattr(base.subprocess, "Popen", parked_popen)
    monkeypatch.setattr(procgroups, "_started_lock", WatchedLock())
    monkeypatch.setattr(procgroups, "_exiting", threading.Event())  # this test's exit, not the test process's
    monkeypatch.setattr(base, "_wait_for_the_end", _park)
    outcome: list[BaseException | None] = []

    def drain() -> None:
        try:
            run_command([sys.executable, "-c", "import sys; open(sys.argv[1]).read()", str(fifo)], 60.0, "drain")
            outcome.append(None)
        except BaseException as err:
            outcome.append(err)

    worker = threading.Thread(target=drain, daemon=True)
    worker.start()
    try:
        assert at_popen.wait(30.0)
        exiting = threading.Thread(target=lambda: (procgroups.end_started_groups(), moved.set()), daemon=True)
        exiting.start()
        # the exit waits for the start under way (before, it took its list at once and killed nothing)
        assert moved.wait(30.0)
        go.set()
        exiting.join(30.0)
        worker.join(30.0)
        assert not exiting.is_alive() and not worker.is_alive()
        [process] = started
        assert process.returncode == -signal.SIGKILL
        assert len(outcome) == 1 and isinstance(outcome[0], _Parked), outcome  # no verdict: left for the takeover
    finally:
        go.set()
        for process in started:
            if process.poll() is None:
                process.kill()
                process.wait()
        worker.join(30.0)


def test_no_command_starts_once_the_process_is_exiting(monkeypatch: pytest.MonkeyPatch) -> None:
    exiting = threading.Event()
    exiting.set()
    monkeypatch.setattr(procgroups, "_exiting", exiting)
    monkeypatch.setattr(base, "_wait_for_the_end", _park)
    started: list[object] = []
    monkeypatch.setattr(base.subprocess, "Popen", lambda *a, **k: started.append(a))
    with pytest.raises(_Parked):
        run_command([sys.executable, "-c", "pass"], 5.0, "drain")
    assert started == []
