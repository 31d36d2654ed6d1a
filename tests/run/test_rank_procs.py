"""Rank processes end with their launch: process groups stopped whole, ranks killed with a killed launcher."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from vigil.run.launcher import probe_env, start_rank, torchrun_env
from vigil.run.rank_procs import launched, record_launched, stop_groups, surviving_ranks

# A rank that starts a child in its own process group; the child ignores SIGTERM and outlives its parent.
RANK_WITH_CHILD = """
import signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(600)"],
    stdout=subprocess.PIPE, text=True)
child.stdout.readline()
print(child.pid, flush=True)
time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(pids: list[int], timeout_s: float = 20.0) -> list[int]:
    deadline = time.time() + timeout_s
    while (left := [p for p in pids if alive(p)]) and time.time() < deadline:
        time.sleep(0.1)
    return left


def test_stop_groups_ends_the_rank_and_what_it_left_in_its_group(tmp_path: Path) -> None:
    rank = subprocess.Popen([sys.executable, "-c", RANK_WITH_CHILD], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert rank.stdout is not None
    child = int(rank.stdout.readline())
    try:
        record_launched(tmp_path, 0, {0: rank})  # type: ignore[dict-item]
        assert surviving_ranks(tmp_path) == {0: rank.pid}
        stop_groups([rank], grace_s=1.0)  # type: ignore[list-item]
        assert rank.returncode is not None
        # The child ignored SIGTERM: only the group SIGKILL ends it.
        assert wait_gone([child]) == []
        assert surviving_ranks(tmp_path) == {}
    finally:
        for pid in (rank.pid, child):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


# A launcher that starts one probed rank through start_rank, says its pid, and waits to be killed.
LAUNCHER = """
import sys, time
from pathlib import Path
from vigil.run.launcher import probe_command, probe_env, start_rank, torchrun_env
out = Path(sys.argv[1])
env = probe_env(torchrun_env(0, 1, 29999), out, 60.0, False)
rank = start_rank(probe_command([sys.executable, "-c", "import time; time.sleep(600)"]), env, out / "rank0.log")
print(rank.pid, flush=True)
time.sleep(600)
"""


def test_rank_dies_with_a_killed_launcher(tmp_path: Path) -> None:
    """SIGKILL leaves the launcher no cleanup to run: the kernel ends the rank (PR_SET_PDEATHSIG)."""
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[2]))
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(tmp_path)], stdout=subprocess.PIPE,
                                text=True, env=env)
    assert launcher.stdout is not None
    rank = int(launcher.stdout.readline())
    try:
        deadline = time.time() + 60
        # The bootstrap has run (and asked for the signal) once the probe wrote its first record.
        while not (tmp_path / "rank0.json").exists() and time.time() < deadline:
            time.sleep(0.1)
        assert (tmp_path / "rank0.json").exists()
        assert alive(rank)
        launcher.kill()
        launcher.wait()
        assert wait_gone([rank]) == []
    finally:
        if alive(rank):
            os.kill(rank, signal.SIGKILL)


def test_start_rank_outside_the_main_thread_does_not_tie_the_rank_to_the_thread(tmp_path: Path) -> None:
    """The parent-death signal follows the forking *thread*: a rank started from a worker thread must
    not get it, or it would die when that thread ends."""
    import threading

    started: list[subprocess.Popen[bytes]] = []
    env = probe_env(torchrun_env(0, 1, 29999), tmp_path, 60.0, False)

    def start() -> None:
        started.append(start_rank([sys.executable, "-c", "import os; print(os.environ.get('VIGIL_LAUNCHER_PID'))"],
                                  env, tmp_path / "rank0.log"))

    worker = threading.Thread(target=start)
    worker.start()
    worker.join()
    assert started[0].wait(timeout=60) == 0
    assert (tmp_path / "rank0.log").read_text().strip() == "None"
    assert launched(tmp_path) == {}
