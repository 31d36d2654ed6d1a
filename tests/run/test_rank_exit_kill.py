"""A rank the launcher started dies with the launcher's process even when no ``finally`` stops it (a launch on a
thread of a process that exits, a Ctrl-C between the start and its registration): its group is killed at the exit."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from vigil import procgroups
from vigil.run.launcher import start_rank

LAUNCHER = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from vigil.run.launcher import start_rank
    rank = start_rank([sys.executable, "-c", "import time; time.sleep(600)"], dict(os.environ),
                      Path(sys.argv[1]) / "rank0.log")
    print(rank.pid, flush=True)
    sys.stdin.readline()  # exits here, the rank never stopped by the launch
""")


def test_a_rank_left_running_is_killed_at_the_launchers_exit(tmp_path: Path) -> None:
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(tmp_path)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    rank_pid = None
    try:
        assert launcher.stdout is not None and launcher.stdin is not None
        rank_pid = int(launcher.stdout.readline())
        rank = os.pidfd_open(rank_pid)  # readable once the rank has ended, whoever reaps it
        try:
            launcher.stdin.write("\n")
            launcher.stdin.close()
            assert launcher.wait(60) == 0
            ended, _, _ = select.select([rank], [], [], 30.0)
            assert ended, f"rank {rank_pid} outlived its launcher"
        finally:
            os.close(rank)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        if rank_pid is not None:
            with contextlib.suppress(ProcessLookupError):  # the rank this test's launcher started, by its pid
                os.killpg(rank_pid, signal.SIGKILL)


def test_no_rank_starts_once_the_process_is_exiting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exiting = threading.Event()
    exiting.set()
    monkeypatch.setattr(procgroups, "_exiting", exiting)
    with pytest.raises(procgroups.Exiting):
        start_rank([sys.executable, "-c", "pass"], dict(os.environ), tmp_path / "rank0.log")
