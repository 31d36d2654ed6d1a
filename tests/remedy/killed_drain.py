"""A drain left half done by a kill -9: a stand-in scontrol that stalls in the middle of the drain, a worker that
runs the drain journalling to a database, killed once the drain was issued."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import REPO

# A stand-in scontrol that records each call and, while the file "stall" exists, stops in the middle of the
# drain (after it was issued) until it is killed: the moment a crash leaves a drain half done.
SCONTROL = """#!/bin/sh
echo "$*" >> "{state}/calls.log"
case "$1" in
  show) echo "NodeName=$3 State=IDLE" ;;
  update) [ -f "{state}/stall" ] && sleep 120 ;;
esac
exit 0
"""

EXECUTE = """
import sys
from vigil.model import Action, ActionKind
from vigil.remedy.actuators.slurm import SlurmActuator
from vigil.remedy.audit import AuditLog
from vigil.remedy.remediator import Remediator
# its clock reads the epoch: the lease on its claim has lapsed by the time it is killed, as a killed process's
# has once the lease's length has passed (the restart then takes the run over at once)
remediator = Remediator([SlurmActuator(scontrol=sys.argv[2])], AuditLog(sys.argv[1]), dry_run=False,
                        clock=lambda: 0.0)
remediator.execute(Action(id="act-drain-n1", ts=0.0, kind=ActionKind.DRAIN, target="node/n1", reason="Xid 79"))
"""


def scontrol_updates(state: Path) -> int:
    log = state / "calls.log"
    return sum(1 for line in log.read_text().splitlines() if line.startswith("update")) if log.exists() else 0


def kill_mid_drain(state: Path, scontrol: Path, url: str) -> None:
    """Write the stalling scontrol at ``scontrol``, start the drain of node/n1 (action ``act-drain-n1``) in a
    worker journaling to ``url``, and kill -9 the worker once the drain was issued: it is left half done."""
    scontrol.write_text(SCONTROL.format(state=state))
    scontrol.chmod(0o755)
    (state / "stall").touch()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    worker = subprocess.Popen([sys.executable, "-c", EXECUTE, url, str(scontrol)], env=env)
    deadline = time.monotonic() + 60
    while scontrol_updates(state) == 0:
        assert worker.poll() is None and time.monotonic() < deadline, "the drain never started"
        time.sleep(0.05)
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait(timeout=30)
    (state / "stall").unlink()
