"""`run_command`, the back ends' command line (scontrol, nvidia-smi, squeue): the program runs in a session and process
group of its own, so that a terminal's Ctrl-C (SIGINT to the foreground group) does not end it, and its timeout ends
the whole group Vigil started, a child the program left behind included."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

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
