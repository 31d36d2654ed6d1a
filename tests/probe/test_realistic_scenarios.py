"""New fault scenarios written after the detector, the way ML engineers' jobs look (tests/probe/realistic_job.py):
DDP, FSDP2 and a 2 x 2 DeviceMesh on gloo through `vigil launch`, one fault in one rank; verdict, culprit and
time to verdict. The expected verdict of each was fixed before Vigil first ran on it (docs/hang-detection.md,
"New scenarios"). The subset here is the most informative of the 33 (bench/hang.py runs them all): the ones the
first runs got wrong, their no-false-alarm twin, and one of each other kind of fault; of the third batch, the
two most distinct (a pipeline's p2p, the one its first run missed, and a compiled DDP model)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vigil.diagnose.hang import HangDiagnosis
from vigil.run.launcher import launch
from vigil.run.rank_procs import launched, surviving_ranks

JOB = Path(__file__).with_name("realistic_job.py")
HANG_TIMEOUT = 3.0
LATENCY_BUDGET = HANG_TIMEOUT + 5.0

pytestmark = pytest.mark.slow


def run(tmp_path: Path, scenario: str, culprit: int, *extra: str, world: int = 3,
        checkpoint_timeout: float | None = None) -> HangDiagnosis:
    out = tmp_path / scenario
    diagnosis = launch(JOB, ["--scenario", scenario, "--rank", str(culprit), *extra], nproc=world,
                       hang_timeout=HANG_TIMEOUT, out_dir=out, checkpoint_timeout=checkpoint_timeout)
    assert sorted(launched(out)) == list(range(world))
    assert surviving_ranks(out) == {}, "every rank the launcher started is stopped when it returns"
    return diagnosis


def assert_in_budget(diagnosis: HangDiagnosis) -> None:
    assert diagnosis.detected_after_s is not None
    assert HANG_TIMEOUT * 0.9 <= diagnosis.detected_after_s <= LATENCY_BUDGET


@pytest.mark.parametrize(
    ("scenario", "culprit", "world", "where"),
    [
        # A custom autograd Function blocks in backward: DDP's reducer never launches the bucket's all_reduce.
        ("backward", 2, 3, "BackwardCFunction"),
        # A DataLoader worker process blocks reading a sample; the rank waits in the loader.
        ("loader_worker", 1, 3, "__next__"),
        # FSDP2 over dp, the loss all-reduced over tp of a 2 x 2 mesh; one rank waits for a batch forever.
        ("mesh_hang", 3, 4, "genexpr"),
    ],
)
def test_rank_stuck_outside_communication(tmp_path: Path, scenario: str, culprit: int, world: int,
                                          where: str) -> None:
    diagnosis = run(tmp_path, scenario, culprit, world=world)
    assert (diagnosis.verdict, diagnosis.culprit_ranks) == ("hang", [culprit]), diagnosis.summary
    assert diagnosis.hang_kind == "not_enqueued"
    assert diagnosis.fork_point is not None and where in diagnosis.fork_point.frame
    assert_in_budget(diagnosis)


def test_checkpoint_save_that_stopped_writing_is_a_hang(tmp_path: Path) -> None:
    # torch.save into storage that took 64 KiB and then stopped (a pipe nobody reads, as a hung mount).
    diagnosis = run(tmp_path, "ckpt_stuck", 1, checkpoint_timeout=60.0)
    assert (diagnosis.verdict, diagnosis.culprit_ranks) == ("hang", [1]), diagnosis.summary
    assert_in_budget(diagnosis)
    assert any("checkpoint save" in e.summary and "written nothing" in e.summary for e in diagnosis.evidence)
    assert next(r.state for r in diagnosis.ranks if r.rank == 1) == "saving checkpoint"


def test_slow_checkpoint_save_by_rank_0_alone_is_no_alarm(tmp_path: Path) -> None:
    # Rank 0 writes 4 MiB at a rate that takes 2.5 hang timeouts; the others wait at a barrier.
    diagnosis = run(tmp_path, "ckpt_slow_ok", 0, "--sleep", str(2.5 * HANG_TIMEOUT))
    assert (diagnosis.verdict, diagnosis.culprit_ranks) == ("ok", []), diagnosis.summary


def test_fsdp_compute_straggler_with_short_steps_is_slow(tmp_path: Path) -> None:
    # Extra CPU work in one rank's data pipeline: ~30 ms of a ~0.13 s step, under the fixed 50 ms lag.
    diagnosis = run(tmp_path, "fsdp_straggler", 2, "--steps", "16")
    assert (diagnosis.verdict, diagnosis.culprit_ranks) == ("slow", [2]), diagnosis.summary


@pytest.mark.parametrize(
    ("scenario", "culprit", "waiting_in"),
    [
        # One rank turns FSDP2 gradient sync off for a step: it skips the reduce-scatters.
        ("fsdp_skip_rs", 2, "all_gather_single"),
        # no_sync() accumulation: one rank accumulates 3 micro-batches, the others 2.
        ("accum", 1, "barrier"),
    ],
)
def test_rank_whose_collective_sequence_differs_is_the_culprit(tmp_path: Path, scenario: str, culprit: int,
                                                               waiting_in: str) -> None:
    diagnosis = run(tmp_path, scenario, culprit)
    assert (diagnosis.verdict, diagnosis.culprit_ranks) == ("mismatch", [culprit]), diagnosis.summary
    assert f"rank {culprit} differs: {waiting_in}" in diagnosis.summary


def test_rank_that_exits_0_early_is_the_culprit_not_its_peers_errors(tmp_path: Path) -> None:
    # Rank 1's loop bound is wrong: it leaves and exits 0; gloo then fails its peers' all_reduce
    # ("Connection closed by peer"), a cascade, not a crash of theirs.
    diagnosis = run(tmp_path, "exit0", 1)
    assert (diagnosis.verdict, diagnosis.culprit_ranks) == ("hang", [1]), diagnosis.summary
    assert diagnosis.hang_kind == "not_enqueued"
    assert "ended their script (exit status 0)" in diagnosis.summary
    assert diagnosis.detected_after_s is not None and diagnosis.detected_after_s <= LATENCY_BUDGET


def test_pipeline_stage_that_posts_one_recv_too_few_is_the_culprit(tmp_path: Path) -> None:
    # Four stages exchanging micro-batches with batch_isend_irecv; the last stage posts 3 activation recvs where
    # stage 2 sends 4, then sends its 3 gradients back: stage 2 waits in its 4th send, stage 3 in its gradient
    # sends, the first stages in their gradient recvs. The waits close a cycle; its oldest op is stage 2's send.
    diagnosis = run(tmp_path, "pipe_short", 3, world=4)
    assert (diagnosis.verdict, diagnosis.culprit_ranks) == ("hang", [3]), diagnosis.summary
    assert (diagnosis.hang_kind, diagnosis.culprit_links) == ("p2p", [[2, 3]])
    assert_in_budget(diagnosis)


def test_compiled_ddp_model_rank_stuck_after_the_first_compile(tmp_path: Path) -> None:
    # torch.compile(DDP(model)): the first compile (tens of seconds here) is no hang; later one rank loops in its
    # data pipeline (rejection sampling a crop from a sample with no foreground) while the others wait.
    diagnosis = run(tmp_path, "compile_hang", 1)
    assert (diagnosis.verdict, diagnosis.culprit_ranks) == ("hang", [1]), diagnosis.summary
    assert diagnosis.fork_point is not None and "foreground_crop" in diagnosis.fork_point.frame
    assert_in_budget(diagnosis)
