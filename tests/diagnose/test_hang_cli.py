"""`vigil diagnose run` / `vigil launch script` on bad input: one clear line, exit status 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from vigil.diagnose.hang import RunEvidence, diagnose, load_run
from vigil.diagnose.hang_render import print_diagnosis
from vigil.diagnose.hang_source import diagnose_path
from vigil.model import VigilInputError
from vigil.sources.probe.records import RankSnapshot

from .hang_helpers import coll


def vigil(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vigil", *args], capture_output=True, text=True, timeout=120)


def test_diagnose_missing_path_is_one_line() -> None:
    result = vigil("diagnose", "run", "/nonexistent/run")
    assert result.returncode == 2
    assert "does not exist" in result.stderr
    assert "Traceback" not in result.stderr


def test_launch_missing_script_is_one_line(tmp_path: Path) -> None:
    result = vigil("launch", "script", "--out", str(tmp_path / "o"), "--", str(tmp_path / "nope.py"))
    assert result.returncode == 2
    assert "nope.py does not exist" in result.stderr


def test_corrupt_snapshot_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "rank0.json").write_text("{truncated")
    with pytest.raises(VigilInputError, match="rank0.json is not valid JSON"):
        diagnose_path(tmp_path)


def _snapshot(rank: int, ops: list, heartbeat: float = 130.0) -> RankSnapshot:
    return RankSnapshot(rank=rank, world_size=4, pid=1, host="h", heartbeat=heartbeat, started=90.0, ops=ops)


def test_probe_directory_of_a_torchrun_job_is_diagnosed(tmp_path: Path) -> None:
    # What `vigil.sources.probe.install()` leaves under torchrun: snapshots only, no run.json, no py-spy.
    for rank in range(4):
        ops = [coll(1), coll(2)] if rank == 3 else [coll(1), coll(2), coll(3, state="started", t_start=110.0)]
        snap = _snapshot(rank, ops, heartbeat=118.0 if rank == 3 else 130.0)
        snap.stalled = rank != 3
        data = snap.to_dict()
        (tmp_path / f"rank{rank}.json").write_text(json.dumps(data))
    run = load_run(tmp_path)
    assert run.trigger == "hang"
    diagnosis = diagnose(run)
    assert diagnosis.verdict == "hang"
    assert diagnosis.culprit_ranks == [3]
    assert diagnosis.detected_after_s == pytest.approx(20.0)
    assert any("holds the GIL" in e.summary for e in diagnosis.evidence)


def test_finished_run_without_trigger_is_ok() -> None:
    run = RunEvidence(world_size=2, snapshots={r: _snapshot(r, [coll(1, ranks=(0, 1))]) for r in (0, 1)},
                      exit_codes={0: 0, 1: 0})
    assert diagnose(run).verdict == "ok"


def test_exception_in_a_rank_that_never_exits_is_a_crash() -> None:
    # Rank 1 raised, then hung in interpreter shutdown; the supervisor had to stop it.
    snaps = {r: _snapshot(r, [coll(1, ranks=(0, 1))]) for r in (0, 1)}
    snaps[1].error = {"ts": 120.0, "type": "RuntimeError", "message": "CUDA error: device-side assert", "traceback": ""}
    run = RunEvidence(world_size=2, snapshots=snaps, exit_codes={0: -15, 1: -15}, stopped_by_supervisor={0, 1},
                      trigger="hang", detected_at=125.0)
    diagnosis = diagnose(run)
    assert diagnosis.verdict == "crash"
    assert diagnosis.culprit_ranks == [1]
    assert diagnosis.root_error == "rank 1: RuntimeError: CUDA error: device-side assert"
    shown = Console(record=True, width=120)
    print_diagnosis(diagnosis, shown)
    assert "culprit rank(s): [1]\n" in shown.export_text()  # a crash has no hang kind to show, not "kind: None"


def _left_early_run(with_ops: bool) -> RunEvidence:
    """Rank 1 ended its script cleanly at 110; gloo then failed ranks 0 and 2 with a closed connection."""
    three = (0, 1, 2)
    snaps = {}
    for rank in three:
        ops = [coll(1, ranks=three)] if with_ops else []
        if with_ops and rank != 1:
            ops.append(coll(2, state="failed", t_start=105.0, ranks=three))
        snaps[rank] = RankSnapshot(rank=rank, world_size=3, pid=1, host="h", started=90.0, ops=ops,
                                   heartbeat=110.0 if rank == 1 else 112.0, finished=rank == 1)
        if rank != 1:
            snaps[rank].error = {"ts": 111.0, "type": "RuntimeError", "traceback": "",
                                 "message": "[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]"}
    return RunEvidence(world_size=3, snapshots=snaps, exit_codes={0: 1, 1: 0, 2: 1}, detected_at=113.0)


def test_rank_that_exited_0_while_its_peers_waited_is_the_culprit_of_their_errors() -> None:
    for with_ops in (True, False):  # op records, or none (DDP's built-in C++ hook)
        diagnosis = diagnose(_left_early_run(with_ops))
        assert (diagnosis.verdict, diagnosis.culprit_ranks, diagnosis.hang_kind) == ("hang", [1], "not_enqueued")
        assert "ended their script (exit status 0)" in diagnosis.summary
        assert ("without entering all_reduce #2" in diagnosis.summary) == with_ops


def test_rank_that_exited_0_is_found_when_its_last_record_still_shows_a_collective_in_flight() -> None:
    # Rank 1's last all_reduce ended (its peers completed it) but its record was written before the end was
    # seen: it left, so nothing of it is in flight, and #2 is still the collective it never entered.
    run = _left_early_run(True)
    run.snapshots[1].ops[0].state, run.snapshots[1].ops[0].t_end = "started", None
    diagnosis = diagnose(run)
    assert (diagnosis.verdict, diagnosis.culprit_ranks) == ("hang", [1]), diagnosis.summary
    assert "without entering all_reduce #2" in diagnosis.summary


def test_rank_that_exited_0_is_found_when_its_exit_snapshot_was_written_after_its_peers_failed() -> None:
    # The script's destroy_process_group() closed the connections before the exit's last snapshot was written:
    # on a loaded machine the peers' errors are stamped first. Its op records, not that write, say when it left.
    run = _left_early_run(True)
    run.snapshots[1].heartbeat = 111.5
    diagnosis = diagnose(run)
    assert (diagnosis.verdict, diagnosis.culprit_ranks) == ("hang", [1]), diagnosis.summary
    run = _left_early_run(False)  # no op records: the last write is all there is, and it came after the errors
    run.snapshots[1].heartbeat = 111.5
    assert diagnose(run).verdict == "crash"


def test_cascade_errors_with_no_rank_missing_from_a_collective_stay_a_crash() -> None:
    # The same errors, but the op records show rank 1 in every collective the others ran: no one left early.
    run = _left_early_run(True)
    run.snapshots[1].ops.append(coll(2, ranks=(0, 1, 2)))
    assert diagnose(run).verdict == "crash"


def test_timeline_out_that_cannot_be_written_is_one_line(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for rank in range(4):
        (run_dir / f"rank{rank}.json").write_text(json.dumps(_snapshot(rank, [coll(1), coll(2)]).to_dict()))
    for out in (tmp_path, tmp_path / "missing" / "timeline.json"):  # a directory; a parent that is not there
        result = vigil("timeline", str(run_dir), "--out", str(out))
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert result.stderr.startswith(f"error: --out {out}: cannot write there"), result.stderr
