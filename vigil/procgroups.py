"""The process groups this process started and that must not outlive it: a back end's command (``scontrol``, a
drain), a launched rank. Each is started in a session of its own (a terminal's Ctrl-C goes to the whole foreground
group, and must not end a drain `vigil serve` waits for on that very Ctrl-C), registered under the lock the exit's
kill takes its list under - so a group is either in that list or not started at all - and SIGKILLed whole at the
process's exit (atexit) while its leader is unreaped.

What this cannot reach: a process SIGKILLed or OOM-killed runs no atexit. The remediation's commands are recorded in
the store for that (``vigil.remedy.commands``), and the next owner of their run finds them. PR_SET_PDEATHSIG is not
used: it fires when the *thread* that started the child exits (Vigil starts commands from worker threads that end
while the process lives on), and it reaches the direct child only, never a grandchild a command starts in its group.
Stdlib only: every layer may start groups.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import threading
from typing import Any

# the groups running now, each led by a process this process started in a session of its own: killed, whole, when
# the process exits with them still running (``end_started_groups``)
_started: set[subprocess.Popen[Any]] = set()
_started_lock = threading.Lock()
_exiting = threading.Event()


class Exiting(RuntimeError):
    """This process is exiting: no group is started any more."""


def exiting() -> bool:
    return _exiting.is_set()


def start_group(argv: list[str], **popen: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen(argv, start_new_session=True, **popen)``, registered for the exit's kill in the same hold of
    the lock; raises ``Exiting`` (nothing started) once the process is exiting."""
    with _started_lock:
        if _exiting.is_set():
            raise Exiting("this process is exiting: nothing more is started")
        process: subprocess.Popen[Any] = subprocess.Popen(argv, start_new_session=True, **popen)
        _started.add(process)
    return process


def forget(process: subprocess.Popen[Any]) -> None:
    """``process`` has been reaped (or its group ended by its owner): the exit has nothing of it to kill."""
    with _started_lock:
        _started.discard(process)


@atexit.register
def end_started_groups() -> None:
    """SIGKILL the process group of every process this process started (``start_group``) that still runs, on the way
    out (atexit: `vigil serve` or `vigil engine` stopped at once by a second Ctrl-C, or ended by an exception, while a
    daemon thread waited for a drain; a launch ended before its own stop): a group in a session of its own outlived
    the process before. Only groups this process started, and only while their leader is not reaped: the leader's
    Popen lock (CPython's, taken around every reap) is held for the look and the kill, so the group's id is still that
    leader's; a leader being reaped at that moment has ended."""
    with _started_lock:  # set under the lock: no group starts after the list is taken
        _exiting.set()
        running = list(_started)
    for process in running:
        reaping = getattr(process, "_waitpid_lock", None)
        # held but briefly by a wait with a timeout (communicate's), and for long only by a wait on a leader killed or
        # ended already (the timeout's kill, the with-block's end)
        if reaping is not None and not reaping.acquire(timeout=5.0):
            continue
        try:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
        finally:
            if reaping is not None:
                reaping.release()


def end_group(process: subprocess.Popen[Any]) -> None:
    """SIGKILL the process group ``process`` leads (its own session, ``start_group``), then reap it. Only while the
    leader is not reaped yet (no poll() first): until then its pid, the group's id, is no other process's."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
            os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    forget(process)
