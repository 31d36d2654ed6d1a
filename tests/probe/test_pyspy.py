"""py-spy from outside: reads a process that holds the GIL; degrades per rank with a clear reason."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from vigil.diagnose.stacks import from_pyspy
from vigil.run.launcher import launch
from vigil.sources.probe import pyspy

HOLDS_GIL = """
import ctypes, sys
def stuck_in_c():
    ctypes.PyDLL(None).sleep(60)
print("ready", flush=True)
stuck_in_c()
"""


def test_dump_reads_a_process_holding_the_gil() -> None:
    proc = subprocess.Popen([sys.executable, "-c", HOLDS_GIL], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        deadline = time.time() + 30
        dumps = pyspy.dump_all({0: proc.pid})
        while 0 not in dumps.dumps and time.time() < deadline:
            dumps = pyspy.dump_all({0: proc.pid})
        threads = from_pyspy(dumps.dumps[0])
        assert threads["MainThread"][-1].startswith("stuck_in_c (")
    finally:
        proc.kill()
        proc.wait()


def test_missing_pyspy_and_dead_pid_are_reported_per_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    result = pyspy.dump_all({3: dead.pid})
    assert result.dumps == {}
    assert f"could not read pid {dead.pid}" in result.errors[3]
    monkeypatch.setattr(pyspy, "find_pyspy", lambda: None)
    assert pyspy.dump_all({0: 1, 1: 2}).errors == {0: "py-spy is not installed", 1: "py-spy is not installed"}


@pytest.mark.slow
def test_launch_without_pyspy_falls_back_to_probe_stacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pyspy, "find_pyspy", lambda: None)
    events: list[str] = []
    job = Path(__file__).with_name("fault_job.py")
    diagnosis = launch(job, ["--fault", "deadlock", "--rank", "1"], nproc=3, hang_timeout=3.0,
                       out_dir=tmp_path / "run", on_event=events.append)
    assert diagnosis.verdict == "hang"
    assert diagnosis.culprit_ranks == [1]
    assert diagnosis.stack_source == "probe"
    assert any("py-spy is not installed" in e for e in events)
    assert diagnosis.fork_point is not None and diagnosis.fork_point.ranks == [1]
