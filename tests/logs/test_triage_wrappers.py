"""A launcher's or scheduler's report of a job's end against the account the job gave of itself.

* A launcher that started the child (torchrun, srun, mpirun) reports its end after whatever the child printed as it
  failed, in the same stream: the child's words above the launcher's first report are the root, even when they read
  as an error in generic words only - but not words its logger tagged as information, nor the echo of a failure
  elsewhere, nor the driver's lines above Ray's relay of a worker's death (the worker's output is elsewhere).
* stdout and stderr written apart keep no order between their lines: the child's words in the other stream count.
* A screen capture cut at 80 columns: a line exactly that wide is whole when the next one carries the same relay prefix
  (mpirun --tag-output tags each line it relays, never the rest of one the terminal cut).
* A batch scheduler other than Slurm killing a job over its memory limit (PBS, Torque, Moab, LSF, HTCondor) is named
  by a root signature, whatever else its mail or the job's output says around it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from vigil.logs.triage import triage

TORCHRUN_END = (
    "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 0 (pid: 4242) of binary: "
    "/usr/bin/python3\n"
    "Traceback (most recent call last):\n"
    '  File "/usr/local/bin/torchrun", line 8, in <module>\n'
    "    sys.exit(main())\n"
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n")
SRUN_END = (
    "--------------------------------------------------------------------------\n"
    "MPI_ABORT was invoked on rank 0 in communicator MPI_COMM_WORLD\n"
    "with errorcode 6.\n"
    "--------------------------------------------------------------------------\n"
    "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.\n"
    "slurmstepd: error: *** STEP 5501.0 ON gpu07 CANCELLED AT 2026-03-02T10:00:05 ***\n"
    "srun: error: gpu07: task 0: Exited with exit code 6\n")
MPIRUN_END = (
    "--------------------------------------------------------------------------\n"
    "Primary job  terminated normally, but 1 process returned\n"
    "a non-zero exit code. Per user-direction, the job has been aborted.\n"
    "--------------------------------------------------------------------------\n"
    "mpirun noticed that process rank 1 with PID 77 on node gpu07 exited on signal 6 (Aborted).\n")


def _root(tmp_path: Path, text: str) -> tuple[int, str | None]:
    (tmp_path / "job.log").write_text(text)
    result = triage(tmp_path, workers=1)
    assert result.root is not None
    return result.root.lineno, result.root_basis


@pytest.mark.parametrize("child, end", [
    ("quantlib: Error operation not supported at line 351 in file csrc/ops.c\n", TORCHRUN_END),
    ("solver::Abort::0::CUDA error 3 in file src/Device.cpp line 164: initialization error !!!\nSIGABRT\n", SRUN_END),
    ("step 120 loss 2.31\nkernel error in fused_adam at step 121, giving up\n", MPIRUN_END),
])
def test_a_launchers_report_of_a_childs_end_yields_to_the_childs_generic_words_above_it(
        tmp_path: Path, child: str, end: str) -> None:
    """Before: no line above reads as a specific error, so the launcher's report - a symptom - was named."""
    expected = len(child.splitlines()) if child.startswith("step") else 1
    assert _root(tmp_path, child + end) == (expected, "error_wording")


@pytest.mark.parametrize("child", [
    "2026-03-02 10:00:01,000 INFO validation error 0.12 after epoch 3\n",  # a measured value its logger tagged INFO
    "rank 3: timed out waiting for the error handler of rank 0\n",  # the echo of a failure elsewhere
    "step 120 loss 2.31\n",  # nothing reads as an error
])
def test_a_launchers_report_stays_the_root_over_lines_that_report_no_failure_of_the_child(
        tmp_path: Path, child: str) -> None:
    lineno, basis = _root(tmp_path, child + TORCHRUN_END)
    assert (lineno, basis) == (len(child.splitlines()) + 1, "symptom")


def test_the_child_words_must_come_before_the_launchers_first_report(tmp_path: Path) -> None:
    """Generic wording a caller prints after torchrun's report relays the exit: the report stays the root."""
    lineno, basis = _root(tmp_path, TORCHRUN_END + "training script ended with an error, see above\n")
    assert (lineno, basis) == (1, "symptom")


def test_rays_relay_of_a_workers_death_is_no_launchers_report_of_its_child(tmp_path: Path) -> None:
    """The driver's generic 'Error executing job' above the raylet's relay is what the worker's death did to the
    driver: the relay, the only account of the death, stays the root."""
    text = ("Error executing job with overrides: ['trainer.total_epochs=1']\n"
            "(raylet) A worker died or was killed while executing a task by an unexpected system error. "
            "To troubleshoot the problem, check the logs for the dead worker. Worker exit type: SYSTEM_ERROR\n")
    assert _root(tmp_path, text)[0] == 2


@pytest.mark.parametrize("line", [
    "=>> PBS: job killed: mem 38427376kb exceeded limit 33554432kb",
    "=>> PBS: job killed: vmem 3372163072 exceeded limit 2147483648",
    "dask-worker.o1838772:=>> PBS: job killed: mem job total 115343360 kb exceeded limit 115343360 kb",
    "job 3132467 exceeded MEM usage hard limit (2528 > 1126)",
    "Job exceeded a memory resource limit (vmem, pvmem, etc.). Job was aborted",
    "TERM_MEMLIMIT: job killed after reaching LSF memory usage limit.",
    "Hold reason: Error from slot1_7@gpu02: Docker job has gone over memory limit of 1024 Mb",
])
def test_a_batch_schedulers_memory_limit_kill_is_the_root_under_its_deletion_notes(tmp_path: Path, line: str) -> None:
    """Before: no signature read these, and the deletion notes and the job's 'Terminated' named nothing (or the
    Error word of HTCondor's hold reason generically)."""
    text = ("PBS Job Id: 3132467.head.local\nExec host:  gpu-1-4/0\njob deleted\n"
            "Job deleted at request of root@head.local\n" + line + "\n")
    (tmp_path / "job.log").write_text(text)
    result = triage(tmp_path, workers=1)
    assert result.root is not None and result.root.lineno == 5
    assert (result.root_basis, result.root.signature, result.root.fault_type) == (
        "signature", "batch.memory_limit_kill", "host_oom")


@pytest.mark.parametrize("line", [
    "job 3264830 exceeded MEM usage soft limit",  # Moab's warning: the job runs on
    "=>> PBS: job killed: walltime 3610 exceeded limit 3600",  # a time limit, not memory
])
def test_a_schedulers_memory_warning_or_time_limit_is_no_memory_limit_kill(tmp_path: Path, line: str) -> None:
    (tmp_path / "job.log").write_text(line + "\n")
    result = triage(tmp_path, workers=1)
    assert result.root is None or result.root.signature != "batch.memory_limit_kill"


def test_the_childs_words_on_stdout_count_against_the_launchers_report_on_stderr(tmp_path: Path) -> None:
    """stdout and stderr written apart (job.out / job.err) keep no order between their unstamped lines: the child's
    words in the other stream count as above the launcher's report. Before: torchrun's report was named."""
    (tmp_path / "job.out").write_text("loading shards\nquantlib: Error operation not supported at line 351 in ops.c\n")
    (tmp_path / "job.err").write_text(TORCHRUN_END)
    result = triage(tmp_path, workers=1)
    assert result.root is not None
    assert (result.root.source, result.root.lineno, result.root_basis) == ("job.out", 2, "error_wording")


def test_a_terminal_cut_does_not_join_the_next_line_mpirun_tagged_to_one_exactly_as_wide(tmp_path: Path) -> None:
    """A screen capture (80 columns) of mpirun --tag-output: the first line is exactly 80 wide and whole, the next one,
    tagged again, is cut. Before: the tagged line was glued to the whole one, and the abort's 'terminate called' line
    read first hid the CUDA error it carries."""
    head = "[1,25]<stderr>:terminate called after throwing an instance of 'std::logic_error'"
    what = "[1,25]<stderr>:  what():  cudaEventQuery failed: an illegal memory access was encountered"
    assert len(head) == 80 < len(what)
    lines = [head, what[:80], what[80:], "[1,25]<stderr>:[c102:70259] *** Process received signal ***",
             "[1,25]<stderr>:[c102:70259] Signal: Aborted (6)"]
    (tmp_path / "job.log").write_text("\n".join(lines) + "\n")
    result = triage(tmp_path, workers=1)
    assert result.root is not None and result.root.lineno == 2
    assert "illegal memory access was encountered" in result.root.line


def test_the_childs_words_lie_within_the_reports_own_block(tmp_path: Path) -> None:
    """A generic line thousands of lines above the launcher's report (a fallback the job went on from) is no account
    of the child's end: the report stays the root. Before: the line at the head of the log was named."""
    steps = "".join(f"step {i} loss 2.31\n" for i in range(3000))
    lineno, basis = _root(tmp_path, "Error loading optional extension, falling back to python\n" + steps + TORCHRUN_END)
    assert (lineno, basis) == (3002, "symptom")


def test_words_above_the_launchers_start_of_its_workers_are_not_the_childs(tmp_path: Path) -> None:
    """Lines printed before torchelastic started the worker group (a setup script's) are no child's words: a worker
    ending without a word leaves the launcher's report as the root. Before: the setup line was named."""
    text = ("Error loading optional extension, falling back to python\n"
            "INFO:torch.distributed.elastic.agent.server.api:[default] Rendezvous'ing worker group\n"
            "INFO:torch.distributed.elastic.agent.server.api:[default] Starting worker group\n"
            "step 1 loss 2.31\n" + TORCHRUN_END)
    assert _root(tmp_path, text) == (5, "symptom")


@pytest.mark.parametrize("line", ["Validation finished with 0 errors\n", "checkpoint verified, no failures\n"])
def test_a_count_of_no_errors_is_no_childs_account_of_its_end(tmp_path: Path, line: str) -> None:
    """A line counting no errors reads as error wording but reports none. Before: it was named over torchrun's
    report."""
    assert _root(tmp_path, line + "step 5 loss 2.31\n" + TORCHRUN_END) == (3, "symptom")


ELASTIC = "torch/distributed/elastic"


def test_torchelastics_closing_signals_yield_to_the_failure_reported_after_them(tmp_path: Path) -> None:
    """torchelastic's _poll sends the workers still running SIGTERM (_close logs each) and only then logs the failure
    that made it stop them: a worker ended by SIGABRT is that report, not the signals to its healthy peers. Before: the
    first closing signal was named."""
    text = (f"W1106 04:43:02.065000 26021 {ELASTIC}/multiprocessing/api.py:897] Sending process 26024 closing signal "
            "SIGTERM\n"
            f"W1106 04:43:02.068000 26021 {ELASTIC}/multiprocessing/api.py:897] Sending process 26025 closing signal "
            "SIGTERM\n"
            f"E1106 04:43:02.651000 26021 {ELASTIC}/multiprocessing/api.py:869] failed (exitcode: -6) local_rank: 3 "
            "(pid: 26026) of binary: /usr/bin/python3\n")
    assert _root(tmp_path, text) == (3, "symptom")


def test_closing_signals_alone_stay_the_account(tmp_path: Path) -> None:
    """With no report of the failure below them (the excerpt ends), the closing signals are still what is there."""
    text = (f"W1106 04:43:02.065000 26021 {ELASTIC}/multiprocessing/api.py:897] Sending process 26024 closing signal "
            "SIGTERM\n")
    assert _root(tmp_path, "step 5 loss 2.31\n" + text) == (2, "symptom")


def test_the_error_file_note_after_an_exit_report_is_the_launchers_bookkeeping(tmp_path: Path) -> None:
    """torchrun's record wrapper, handling the ChildFailedError raised for a failed worker, copies that worker's error
    file to its own (errors/error_handler.py dump_error_file) and, when it has none, logs at ERROR "no error file
    defined for parent, to copy child error file (PATH)": the launcher's note about the failure it reported on the line
    before, not an error of its own. Before: the note, read as error wording, was named over the exit report."""
    text = (f"W0805 15:50:43.302000 4077987 {ELASTIC}/multiprocessing/api.py:900] Sending process 4078197 closing "
            "signal SIGTERM\n"
            f"E0805 15:50:44.478000 4077987 {ELASTIC}/multiprocessing/api.py:874] failed (exitcode: 1) local_rank: 7 "
            "(pid: 4078200) of binary: /usr/bin/python3\n"
            f"E0805 15:50:44.481000 4077987 {ELASTIC}/multiprocessing/errors/error_handler.py:141] no error file "
            "defined for parent, to copy child error file (/tmp/torchelastic_77i0btff/none_kwo9vwqp/attempt_0/7/"
            "error.json)\n" + TORCHRUN_END.split("\n", 1)[1])
    assert _root(tmp_path, text) == (2, "symptom")


RESTART = (f"I0213 12:07:20.086000 870572 {ELASTIC}/agent/server/api.py:889] [default] Worker group FAILED. 3/3 "
           "attempts left; will restart worker group\n"
           f"I0213 12:07:20.086000 870572 {ELASTIC}/agent/server/api.py:699] [default] Stopping worker group\n"
           f"I0213 12:07:20.087000 870572 {ELASTIC}/agent/server/api.py:677] [default] Rendezvous'ing worker group\n")


def test_a_later_attempts_error_is_not_the_root_of_a_restarted_job(tmp_path: Path) -> None:
    """torchelastic restarts its workers only after reporting a failed attempt: what the next attempt fails with (the
    rendezvous the restart cannot complete) follows from that first failure. Before: the later attempt's exception,
    specific wording, was named over attempt 0's exit report."""
    text = (f"E0213 12:07:20.086000 870572 {ELASTIC}/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: 0 "
            "(pid: 876053) of binary: /usr/bin/python3\n" + RESTART +
            "Traceback (most recent call last):\n"
            '  File "/usr/local/bin/torchrun", line 8, in <module>\n'
            "    sys.exit(main())\n"
            "torch.distributed.elastic.rendezvous.api.RendezvousClosedError\n")
    assert _root(tmp_path, text) == (1, "symptom")


def test_the_first_attempts_own_error_outranks_the_next_attempts(tmp_path: Path) -> None:
    """Each attempt's worker fails with its own words; the first attempt's, above the restart, is the root, whatever
    the second attempt's error is named by."""
    text = ("ValueError: batch size 0 in shard 17\n"
            f"E0213 12:07:20.086000 870572 {ELASTIC}/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: 0 "
            "(pid: 876053) of binary: /usr/bin/python3\n" + RESTART +
            "RuntimeError: CUDA error: an illegal memory access was encountered\n")
    assert _root(tmp_path, text)[0] == 1


def test_an_excerpt_starting_after_the_restart_keeps_its_errors(tmp_path: Path) -> None:
    """Nothing above the restart reports a failure (the excerpt starts at it): the later attempt's error is all there
    is, and it is named."""
    text = RESTART + "RuntimeError: CUDA error: an illegal memory access was encountered\n"
    assert _root(tmp_path, text)[0] == 4


def test_closing_signals_to_a_full_node_yield_to_the_failure_reported_after_them(tmp_path: Path) -> None:
    """On an 8-GPU node _close sends SIGTERM to the 7 workers still running and, after its wait, SIGKILL to those that
    did not stop ("Unable to shutdown process P via SIGTERM, forcefully exiting via SIGKILL"), and only then does _poll
    log the failure: the first closing signal lies 14 lines above it. Before: that signal was named."""
    agent = f"W1106 04:43:02.065000 26021 {ELASTIC}/multiprocessing/api.py:"
    text = "".join(f"{agent}897] Sending process {26020 + n} closing signal SIGTERM\n" for n in range(7))
    text += "".join(f"{agent}914] Unable to shutdown process {26020 + n} via Signals.SIGTERM, forcefully exiting via "
                    "Signals.SIGKILL\n" for n in range(7))
    text += (f"E1106 04:43:32.651000 26021 {ELASTIC}/multiprocessing/api.py:869] failed (exitcode: -6) local_rank: 7 "
             "(pid: 26027) of binary: /usr/bin/python3\n")
    assert _root(tmp_path, text) == (15, "symptom")


def test_a_membership_change_restart_is_no_failed_attempt(tmp_path: Path) -> None:
    """torchelastic also restarts a healthy worker group when a node joins ("Detected 1 new nodes from group_rank=0;
    will restart worker group"): nothing failed, so what came before it is no attempt's failure and the error after
    the restart stays a candidate. Before: the handled error above the membership change was named."""
    text = ("warning: failed to read shard 3 of the cache, reading it from the source\n"
            f"I0213 12:07:20.086000 870572 {ELASTIC}/agent/server/api.py:906] [default] Detected 1 new nodes from "
            "group_rank=0; will restart worker group\n"
            f"I0213 12:07:20.086000 870572 {ELASTIC}/agent/server/api.py:699] [default] Stopping worker group\n"
            f"I0213 12:07:20.087000 870572 {ELASTIC}/agent/server/api.py:677] [default] Rendezvous'ing worker group\n"
            f"I0213 12:07:25.087000 870572 {ELASTIC}/agent/server/api.py:683] [default] Starting worker group\n"
            "RuntimeError: CUDA error: an illegal memory access was encountered\n")
    assert _root(tmp_path, text)[0] == 6


def test_a_root_chosen_over_a_later_attempt_says_so(tmp_path: Path) -> None:
    """The verdict names the restart that left the later attempt's error out of the root's candidates, so a reader
    whose job died of a different error in a later attempt sees why attempt 0's was named."""
    text = ("ValueError: batch size 0 in shard 17\n"
            f"E0213 12:07:20.086000 870572 {ELASTIC}/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: 0 "
            "(pid: 876053) of binary: /usr/bin/python3\n" + RESTART +
            "RuntimeError: CUDA error: an illegal memory access was encountered\n")
    (tmp_path / "job.log").write_text(text)
    result = triage(tmp_path, workers=1)
    assert result.root is not None and result.root.attrs["restart_line"] == 3
    assert "restarting the worker group at job.log:3" in result.summary
    assert any(e.lineno == 6 for e in result.cascade)
