"""DDP's gradient all_reduces recorded from torch's Flight Recorder ring by the probe's watchdog, without a
Python comm hook in the step (vigil.sources.probe.flight); the comm hook stays as the fallback."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from vigil.run.launcher import launch
from vigil.sources.probe.flight import ENV_DDP_RECORDING

RING_JOB = Path(__file__).with_name("ring_job.py")
STACK_JOB = Path(__file__).with_name("stack_job.py")
HANG_TIMEOUT = 3.0
STEPS = 6

pytestmark = pytest.mark.slow


def ring_run(tmp_path: Path, mode: str) -> dict[int, dict]:
    result = tmp_path / f"result-{mode}"
    result.mkdir()
    diagnosis = launch(RING_JOB, ["--result", str(result), "--steps", str(STEPS)], nproc=2, hang_timeout=30.0,
                       out_dir=tmp_path / f"run-{mode}", env={ENV_DDP_RECORDING: mode})
    assert diagnosis.verdict == "ok", diagnosis.summary
    return {rank: json.loads((result / f"rank{rank}.json").read_text()) for rank in (0, 1)}


@pytest.mark.parametrize(("mode", "hooks", "reads_ring"), [("ring", 0, True), ("hook", 1, False)])
def test_ddp_all_reduces_are_recorded_with_or_without_a_comm_hook(
    tmp_path: Path, mode: str, hooks: int, reads_ring: bool
) -> None:
    ranks = ring_run(tmp_path, mode)
    for rank, result in ranks.items():
        assert result["comm_hooks"] == hooks
        assert result["reads_ring"] is reads_ring
        collectives = [op for op in result["ops"] if op["kind"] == "collective" and op["group"] == "0"]
        # The reducer's bucket all_reduce of every step, plus the job's own logging all_reduce of every step.
        reduces = [op for op in collectives if op["op"] == "all_reduce"]
        assert len(reduces) >= 2 * STEPS, (rank, [(op["seq"], op["op"]) for op in collectives])
        assert all(op["state"] == "completed" and op["t_end"] >= op["t_start"] for op in reduces)
        # One record per collective: the ring and the Python wrappers number them alike, none twice.
        seqs = Counter(op["seq"] for op in collectives)
        assert max(seqs.values()) == 1, [s for s, n in seqs.items() if n > 1]
        assert result["ops"] and any(op["kind"] == "p2p" for op in result["ops"]) == (rank in (0, 1))
    # Every rank numbers the same collectives the same way, whichever source recorded them.
    signatures = [sorted((op["seq"], op["op"]) for op in result["ops"] if op["kind"] == "collective")
                  for result in ranks.values()]
    assert signatures[0] == signatures[1]


def test_rank_hung_in_a_ddp_step_is_named_from_the_ring(tmp_path: Path) -> None:
    out = tmp_path / "ddp-forward"
    diagnosis = launch(STACK_JOB, ["--stack", "ddp", "--fault", "forward", "--rank", "1"], nproc=2,
                       hang_timeout=HANG_TIMEOUT, out_dir=out)
    assert (diagnosis.verdict, diagnosis.culprit_ranks, diagnosis.hang_kind) == ("hang", [1], "not_enqueued")
    assert "never entered all_reduce" in diagnosis.summary
    assert diagnosis.detected_after_s is not None and diagnosis.detected_after_s <= HANG_TIMEOUT + 5.0
    # The waiting rank's gradient all_reduce came from the ring (no comm hook ran): in flight, from the
    # moment the reducer enqueued it; every earlier one completed.
    ops = json.loads((out / "rank0.json").read_text())["ops"]
    reduces = [op for op in ops if op["op"] == "all_reduce"]
    assert reduces[-1]["state"] == "started" and reduces[-1]["t_end"] is None
    assert all(op["state"] == "completed" for op in reduces[:-1])
