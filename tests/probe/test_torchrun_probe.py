"""The documented path for users with their own launcher: torchrun + vigil.sources.probe.install() + vigil diagnose."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vigil.diagnose.hang_source import diagnose_path
from vigil.run.launcher import free_port
from vigil.sources.probe.records import read_snapshot

JOB = Path(__file__).with_name("torchrun_job.py")


@pytest.mark.slow
def test_torchrun_job_with_installed_probe_is_diagnosed_live(tmp_path: Path) -> None:
    env = dict(os.environ, VIGIL_PROBE_DIR=str(tmp_path), VIGIL_HANG_TIMEOUT="3",
               PYTHONPATH=str(Path(__file__).parents[2]))
    torchrun = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3", "--master-port",
         str(free_port()), str(JOB), "--fault", "deadlock", "--rank", "1"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        deadline = time.time() + 120
        stalled: set[int] = set()
        while time.time() < deadline and len(stalled) < 2:
            for path in tmp_path.glob("rank*.json"):
                try:
                    snap = read_snapshot(path)
                except Exception:
                    continue
                if snap.stalled:
                    stalled.add(snap.rank)
            time.sleep(0.2)
        assert stalled == {0, 2}, "the waiting ranks' probes should flag their stalled all_reduce"
        diagnosis = diagnose_path(tmp_path)
        assert diagnosis.verdict == "hang"
        assert diagnosis.culprit_ranks == [1]
        assert diagnosis.stack_source == "py-spy"
        assert diagnosis.fork_point is not None
        assert diagnosis.fork_point.name == "deadlock_between_threads"
    finally:
        # torchrun's workers run in sessions of their own: asked to stop, torchrun stops them; a SIGKILL to
        # its group alone would leave them running.
        os.killpg(torchrun.pid, signal.SIGTERM)
        try:
            torchrun.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(torchrun.pid, signal.SIGKILL)
            torchrun.wait()
