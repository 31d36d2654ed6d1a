"""Real gloo jobs on the CPU through `vigil launch`, one injected fault each: verdict, culprit, timing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vigil.diagnose.hang import HangDiagnosis
from vigil.run.launcher import launch
from vigil.run.rank_procs import launched, surviving_ranks

JOB = Path(__file__).with_name("fault_job.py")
HANG_TIMEOUT = 3.0
WORLD = 3
# The target: a verdict within the hang timeout + 5 s of the stall.
LATENCY_BUDGET = HANG_TIMEOUT + 5.0

pytestmark = pytest.mark.slow


def run(tmp_path: Path, fault: str, *extra: str, culprit: int = 1) -> HangDiagnosis:
    args = ["--fault", fault, "--rank", str(culprit), *extra]
    diagnosis = launch(JOB, args, nproc=WORLD, hang_timeout=HANG_TIMEOUT, out_dir=tmp_path / fault)
    written = json.loads((tmp_path / fault / "diagnosis.json").read_text())
    assert written["verdict"] == diagnosis.verdict
    assert sorted(launched(tmp_path / fault)) == list(range(WORLD))
    assert surviving_ranks(tmp_path / fault) == {}
    return diagnosis


def assert_hang_timing(diagnosis: HangDiagnosis) -> None:
    assert diagnosis.detected_after_s is not None
    # Never before the timeout (no early false alarm), and within the budget.
    assert HANG_TIMEOUT * 0.9 <= diagnosis.detected_after_s <= LATENCY_BUDGET


@pytest.mark.parametrize(
    ("fault", "culprit", "culprit_function"),
    [
        ("compute", 1, "stuck_in_compute"),
        ("deadlock", 2, "deadlock_between_threads"),
        ("busyloop", 1, "spin_holding_gil"),
        ("gil", 0, "native_call_holding_gil"),
    ],
)
def test_rank_stuck_outside_communication(tmp_path: Path, fault: str, culprit: int, culprit_function: str) -> None:
    diagnosis = run(tmp_path, fault, culprit=culprit)
    assert diagnosis.verdict == "hang"
    assert diagnosis.hang_kind == "not_enqueued"
    assert diagnosis.culprit_ranks == [culprit]
    assert diagnosis.stack_source == "py-spy"
    assert diagnosis.fork_point is not None
    assert diagnosis.fork_point.ranks == [culprit]
    assert diagnosis.fork_point.name == culprit_function
    assert_hang_timing(diagnosis)
    texts = " ".join(e.summary for e in diagnosis.evidence)
    if fault == "compute":
        assert "stuck in compute" in texts
    if fault == "gil":
        assert "holds the GIL" in texts


def test_skipped_collective_is_a_mismatch_named_as_a_skip(tmp_path: Path) -> None:
    diagnosis = run(tmp_path, "skip")
    assert diagnosis.verdict == "mismatch"
    assert diagnosis.hang_kind == "signature_mismatch"
    assert diagnosis.culprit_ranks == [1]
    assert "skipped a collective" in diagnosis.summary


def test_mismatched_shape(tmp_path: Path) -> None:
    diagnosis = run(tmp_path, "shape", culprit=2)
    assert diagnosis.verdict == "mismatch"
    assert diagnosis.culprit_ranks == [2]
    assert "[64] float32 where the others have all_reduce [68] float32" in diagnosis.summary
    assert diagnosis.detected_after_s is not None and diagnosis.detected_after_s <= LATENCY_BUDGET


def test_crash_root_error_is_the_first_cause_not_the_cascade(tmp_path: Path) -> None:
    diagnosis = run(tmp_path, "exception", culprit=2)
    assert diagnosis.verdict == "crash"
    assert diagnosis.culprit_ranks == [2]
    assert diagnosis.root_error is not None
    assert "CUDA error: an illegal memory access" in diagnosis.root_error
    assert diagnosis.detected_after_s is not None and diagnosis.detected_after_s <= LATENCY_BUDGET


def test_killed_process_is_process_dead(tmp_path: Path) -> None:
    diagnosis = run(tmp_path, "kill")
    assert diagnosis.verdict == "crash"
    assert diagnosis.hang_kind == "process_dead"
    assert diagnosis.culprit_ranks == [1]
    assert diagnosis.root_error is not None and "SIGKILL" in diagnosis.root_error


def test_missing_recv_in_ring_names_rank_and_link(tmp_path: Path) -> None:
    diagnosis = run(tmp_path, "p2p", culprit=2)
    assert diagnosis.verdict == "hang"
    assert diagnosis.hang_kind == "p2p"
    assert diagnosis.culprit_ranks == [2]
    assert diagnosis.culprit_links == [[1, 2]]
    assert_hang_timing(diagnosis)


def test_straggler_is_slow_without_a_hang(tmp_path: Path) -> None:
    diagnosis = run(tmp_path, "straggler", "--sleep", "0.3", "--steps", "16", culprit=2)
    assert diagnosis.verdict == "slow"
    assert diagnosis.culprit_ranks == [2]
    assert diagnosis.exit_code == 0


def test_slow_but_progressing_job_is_not_a_hang(tmp_path: Path) -> None:
    # Steps of up to 1.5 s of random extra work on every rank: waits approach half the timeout.
    diagnosis = run(tmp_path, "slow", "--sleep", "1.5", "--steps", "8")
    assert diagnosis.verdict == "ok"
    assert diagnosis.culprit_ranks == []


def test_long_checkpoint_save_is_not_a_hang(tmp_path: Path) -> None:
    # Rank 0 spends more than twice the hang timeout in torch.save while its peers wait.
    diagnosis = run(tmp_path, "checkpoint", "--sleep", str(2.5 * HANG_TIMEOUT), "--steps", "6", culprit=0)
    assert diagnosis.verdict == "ok"


def test_cli_launch_json_and_diagnose_agree(tmp_path: Path) -> None:
    out = tmp_path / "cli"
    vigil = [sys.executable, "-m", "vigil"]
    launched = subprocess.run(
        [*vigil, "launch", "script", "--nproc-per-node", "3", "--hang-timeout", str(HANG_TIMEOUT), "--out", str(out),
         "--json", "--", str(JOB), "--fault", "deadlock", "--rank", "1"],
        capture_output=True, text=True, timeout=180,
    )
    assert launched.returncode == 4, launched.stderr[-2000:]
    printed = json.loads(launched.stdout)
    assert printed == json.loads((out / "diagnosis.json").read_text())
    assert printed["culprit_ranks"] == [1]
    again = subprocess.run([*vigil, "diagnose", "run", str(out), "--json"], capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 4, again.stderr[-2000:]  # a hang has one exit status, from launch or diagnose
    offline = json.loads(again.stdout)
    for key in ("verdict", "culprit_ranks", "hang_kind", "fork_point", "detected_after_s"):
        assert offline[key] == printed[key]
    # The same run's Flight Recorder dumps, analysed on their own, agree on the culprit.
    from_fr = subprocess.run([*vigil, "diagnose", "run", str(out / "fr"), "--json"], capture_output=True,
                             text=True, timeout=120)
    assert from_fr.returncode == 4, from_fr.stderr[-2000:]
    fr = json.loads(from_fr.stdout)
    assert (fr["verdict"], fr["culprit_ranks"], fr["source"]) == ("hang", [1], "flight_recorder")


def test_job_that_finishes_is_ok(tmp_path: Path) -> None:
    diagnosis = run(tmp_path, "none", "--steps", "6")
    assert diagnosis.verdict == "ok"
    assert diagnosis.exit_code == 0
    assert (tmp_path / "none" / "rank0.json").exists()


def test_terminated_launcher_stops_its_ranks(tmp_path: Path) -> None:
    import os
    import signal
    import time

    import psutil

    from vigil.sources.probe.records import read_snapshot

    out = tmp_path / "term"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "vigil", "launch", "script", "--nproc-per-node", "2", "--hang-timeout", "60", "--out",
         str(out), "--", str(JOB), "--fault", "deadlock", "--rank", "1", "--at-step", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    pids: list[int] = []
    deadline = time.time() + 120
    while time.time() < deadline and len(pids) < 2:
        pids = []
        for rank in (0, 1):
            try:
                pids.append(read_snapshot(out / f"rank{rank}.json").pid)
            except Exception:
                break
        time.sleep(0.2)
    assert len(pids) == 2
    os.kill(launcher.pid, signal.SIGTERM)
    assert launcher.wait(timeout=30) != 0

    def alive(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.time() + 30
    while time.time() < deadline and any(alive(p) for p in pids):
        time.sleep(0.2)
    assert not any(alive(p) for p in pids)
