"""The rank processes a launcher owns: recorded when started, stopped group by group whatever ends the launch.

Each rank runs in a session of its own (so its whole process group can be signalled), which also means
nothing stops it when its launcher goes away. Three guards close that gap:

- ``stop_groups`` signals every rank's process *group* (SIGTERM, then SIGKILL after a grace), and kills the
  group once more after the rank itself has exited, so children it left behind go too;
- ``signals_raise`` turns SIGTERM / SIGHUP into an exception while a launch runs, so its ``finally`` stops
  the ranks, and ``signals_held`` keeps a second signal from interrupting that cleanup;
- a rank started from the launcher's main thread asks the kernel for SIGKILL when its parent dies
  (``PR_SET_PDEATHSIG``, set by the probe's bootstrap), which covers a launcher killed with SIGKILL.

``record_launched`` writes the pids (with their start times, so a reused pid is not mistaken for a rank)
to ``launched.node<I>.json``; ``surviving_ranks`` reads them back and says which ranks still run.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import psutil

from vigil import procgroups
from vigil.sources.probe.activate import ENV_LAUNCHER_PID
from vigil.sources.probe.records import write_json_atomic

LAUNCHED_PATTERN = "launched.node{node}.json"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def launcher_env() -> dict[str, str]:
    """What a rank's environment gets so that it dies with its launcher. Only from the main thread: the
    kernel sends the signal when the *thread* that forked the child exits, and a worker thread may end
    long before the launcher does."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {ENV_LAUNCHER_PID: str(os.getpid())}


def record_launched(out_dir: Path, node_rank: int, procs: Mapping[int, subprocess.Popen[bytes]]) -> Path:
    """Write the ranks this node started: pid and start time by rank."""
    ranks = {}
    for rank, proc in procs.items():
        try:
            created = psutil.Process(proc.pid).create_time()
        except psutil.NoSuchProcess:
            created = None
        ranks[str(rank)] = {"pid": proc.pid, "create_time": created}
    path = out_dir / LAUNCHED_PATTERN.format(node=node_rank)
    write_json_atomic(path, json.dumps({"node_rank": node_rank, "ranks": ranks}))
    return path


def launched(out_dir: Path) -> dict[int, tuple[int, float | None]]:
    """Every node's recorded ranks in ``out_dir``: rank -> (pid, start time)."""
    ranks: dict[int, tuple[int, float | None]] = {}
    for path in sorted(out_dir.glob(LAUNCHED_PATTERN.format(node="*"))):
        for rank, entry in json.loads(path.read_text())["ranks"].items():
            ranks[int(rank)] = (int(entry["pid"]), entry.get("create_time"))
    return ranks


def surviving_ranks(out_dir: Path) -> dict[int, int]:
    """The recorded ranks whose process still runs (a zombie has ended): rank -> pid."""
    alive = {}
    for rank, (pid, created) in launched(out_dir).items():
        try:
            process = psutil.Process(pid)
            if process.status() == psutil.STATUS_ZOMBIE:
                continue
            if created is not None and abs(process.create_time() - created) > 0.01:
                continue  # the pid was reused by another process
        except psutil.NoSuchProcess:
            continue
        alive[rank] = pid
    return alive


def signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def stop_groups(procs: Iterable[subprocess.Popen[bytes]], grace_s: float = 3.0) -> None:
    """SIGTERM each running rank's process group, SIGKILL those still there after ``grace_s``, then SIGKILL
    every group once more (children that outlived their rank) and reap the ranks."""
    procs = list(procs)
    with signals_held():
        for proc in procs:
            if proc.poll() is None:
                signal_group(proc.pid, signal.SIGTERM)
        deadline = time.time() + grace_s
        for proc in procs:
            try:
                proc.wait(timeout=max(0.05, deadline - time.time()))
            except subprocess.TimeoutExpired:
                signal_group(proc.pid, signal.SIGKILL)
        for proc in procs:
            signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
            procgroups.forget(proc)  # reaped: nothing of it for the exit's kill


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """While inside: SIGTERM and SIGHUP raise SystemExit(128 + signal), as SIGINT raises
    KeyboardInterrupt, so the launch's ``finally`` runs. Only the main thread can set handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def leave(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, leave) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold back SIGTERM / SIGHUP / SIGINT while the ranks are being stopped; one that came in is
    delivered after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
