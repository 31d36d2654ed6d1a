"""Entry point of every rank started by Vigil's launcher: install the probe, then run the program as
``python`` would have - a script, ``-m MODULE`` or ``-c CODE`` - as __main__, unmodified.

Run as ``python -m vigil.sources.probe.bootstrap (SCRIPT | -m MODULE | -c CODE) [ARGS...]``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import runpy
import signal
import sys

from vigil.sources.probe import install
from vigil.sources.probe.activate import ENV_LAUNCHER_PID

PR_SET_PDEATHSIG = 1
USAGE = "usage: python -m vigil.sources.probe.bootstrap (SCRIPT | -m MODULE | -c CODE) [ARGS...]\n"


def die_with_launcher() -> None:
    """A rank runs in a session of its own, so nothing else stops it when its launcher is killed: ask the
    kernel for SIGKILL when that parent dies, and exit at once if it died already (before this call)."""
    launcher = os.environ.pop(ENV_LAUNCHER_PID, None)
    if launcher is None or not launcher.isdigit():
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != int(launcher):
        os._exit(1)


def main(argv: list[str]) -> None:
    if not argv or (argv[0] in ("-m", "-c") and len(argv) < 2):
        sys.stderr.write(USAGE)
        raise SystemExit(2)
    die_with_launcher()
    install()
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        sys.path[0] = os.getcwd()
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    elif argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        sys.path[0] = ""
        exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    else:
        sys.argv = list(argv)
        # As `python SCRIPT` would: the script's own directory comes first on the import path.
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
