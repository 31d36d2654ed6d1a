"""torchelastic's attempts: the first failed attempt's error is the root, not what a later attempt failed with.

* torchelastic's log directory (torch/distributed/elastic/multiprocessing/api.py ``DefaultLogsSpecs.reify``:
  ``<log_dir>/<run_id>_<random>/attempt_<restart_count>/<local_rank>/{stdout.log,stderr.log,error.json}``, the run
  directory made by ``tempfile.mkdtemp(prefix=f"{rdzv_run_id}_")``) holds one directory per attempt: a later attempt's
  files are read as that attempt's, and the verdict names the attempt its root came from.
* ``error.json`` is what ``@record`` writes (errors/error_handler.py ``ErrorHandler.record_exception``:
  ``{"message": {"message": "<Class>: <text>", "extraInfo": {"py_callstack": <traceback>, "timestamp": "<epoch s>"}}}``;
  errors/__init__.py ``ProcessFailure._get_error_data`` also reads a message given as a string, with a top-level
  ``timestamp``): a source of the root, stamped with its timestamp.
* In one file that interleaves several nodes' agents (``srun --label``'s ``N: ``, pdsh's ``host: ``), a restart logged
  by one node's agent cuts only that node's later lines.
* A failure above a restart is one of that attempt's: an error line or the agent's exit report between the attempt's
  "Starting worker group" and the restart (agent/server/api.py ``_invoke_run``: "[%s] Worker group %s. %s/%s attempts
  left; will restart worker group" after ``_monitor_workers`` saw the failure multiprocessing/api.py reported as
  "failed (exitcode: %s) local_rank: %s (pid: %s) of binary: %s").
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vigil.logs.triage import triage

ELASTIC = "torch/distributed/elastic"
RUN = "none_k2j3x9f0"  # tempfile.mkdtemp(prefix=f"{rdzv_run_id}_"): torchrun's default rdzv_id is "none"
FIRST = ("Traceback (most recent call last):\n"
         '  File "/workspace/train.py", line 88, in <module>\n'
         "    main()\n"
         '  File "/workspace/train.py", line 61, in main\n'
         "    batch = next(loader)\n"
         "ValueError: batch size 0 in shard 17\n")
# attempt 1 resuming from the checkpoint attempt 0 was writing when it failed
RESUME_CALLSTACK = ("Traceback (most recent call last):\n"
                    '  File "/workspace/train.py", line 40, in main\n'
                    "    state = torch.load(path)\n"
                    "RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory\n")
RESUME = {"message": {"message": "RuntimeError: PytorchStreamReader failed reading zip archive: failed finding "
                                 "central directory",
                      "extraInfo": {"py_callstack": RESUME_CALLSTACK, "timestamp": "1770984500"}}}


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_first_attempts_error_outranks_a_later_attempts_stamped_one(tmp_path: Path) -> None:
    """Attempt 0's worker printed its exception unstamped; attempt 1, resuming, failed on the checkpoint and @record
    wrote error.json with a timestamp. Before: the stamped later error was named, as the earliest one with a time."""
    _write(tmp_path / RUN / "attempt_0" / "0" / "stderr.log", FIRST)
    _write(tmp_path / RUN / "attempt_1" / "0" / "error.json", json.dumps(RESUME))
    result = triage(tmp_path, workers=1)
    assert result.root is not None
    assert result.root.source == f"{RUN}/attempt_0/0/stderr.log"
    assert result.root.attrs["attempt"] == 0
    assert "attempt 0" in result.summary and "attempt_1" in result.summary
    assert any(e.source.startswith(f"{RUN}/attempt_1/") for e in result.cascade)


def test_error_json_alone_is_read_with_its_timestamp(tmp_path: Path) -> None:
    """Without --redirects torchrun writes no stdout.log / stderr.log, only each worker's error.json. Before: the
    directory held "no log files"."""
    _write(tmp_path / RUN / "attempt_0" / "3" / "error.json", json.dumps(RESUME))
    result = triage(tmp_path, workers=1)
    assert result.root is not None
    assert result.root.source == f"{RUN}/attempt_0/3/error.json"
    assert result.root.line.startswith("RuntimeError: PytorchStreamReader failed reading zip archive")
    assert result.root.ts == 1770984500.0
    assert result.root.rank == 3
    assert result.root.attrs.get("user_frame") == "/workspace/train.py:40 in main"


def test_error_json_with_a_string_message(tmp_path: Path) -> None:
    """ProcessFailure reads a message given as a string, its timestamp beside it."""
    record = {"message": "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
              "timestamp": "1770984400"}
    _write(tmp_path / RUN / "attempt_0" / "1" / "error.json", json.dumps(record))
    result = triage(tmp_path, workers=1)
    assert result.root is not None and result.root.ts == 1770984400.0
    assert "CUDA out of memory" in result.root.line


def test_an_error_json_that_is_not_json_is_read_as_text(tmp_path: Path) -> None:
    """A truncated error file (the worker killed while writing it) is still read, line by line, never a traceback."""
    _write(tmp_path / RUN / "attempt_0" / "0" / "error.json",
           '{"message": {"message": "RuntimeError: CUDA error: an illegal memory access was encountered", "extr')
    result = triage(tmp_path, workers=1)
    assert result.root is not None and "illegal memory access" in result.root.line


def test_a_later_attempt_keeps_its_errors_when_the_first_shows_none(tmp_path: Path) -> None:
    """Attempt 0's worker was killed by a signal and left an empty log: attempt 1's error is all there is."""
    _write(tmp_path / RUN / "attempt_0" / "0" / "stderr.log", "step 1 loss 2.3\n")
    _write(tmp_path / RUN / "attempt_1" / "0" / "stderr.log", FIRST)
    result = triage(tmp_path, workers=1)
    assert result.root is not None and result.root.source == f"{RUN}/attempt_1/0/stderr.log"
    assert result.root.attrs["attempt"] == 1


AGENT = f"{ELASTIC}/agent/server/api.py"
PROCS = f"{ELASTIC}/multiprocessing/api.py"


@pytest.mark.parametrize("node0, node1", [("0: ", "1: "), ("gpu-a01: ", "gpu-b07: ")])
def test_one_nodes_restart_does_not_cut_another_nodes_lines(tmp_path: Path, node0: str, node1: str) -> None:
    """srun --label (or pdsh) interleaves both nodes' agents in one file: node 0's worker timed out and its agent
    restarted the group; node 1's worker's own CUDA error, flushed later, is below node 0's restart. Before: the
    restart cut it, and node 0's exit report was named."""
    text = (f"{node0}[rank0]:[E213 12:07:19.900000 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=88, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran "
            "for 600015 milliseconds before timing out.\n"
            f"{node0}E0213 12:07:20.086000 870572 {PROCS}:869] failed (exitcode: -6) local_rank: 0 (pid: 876053) "
            "of binary: /usr/bin/python3\n"
            f"{node0}I0213 12:07:20.086000 870572 {AGENT}:889] [default] Worker group FAILED. 3/3 attempts left; "
            "will restart worker group\n"
            f"{node1}[rank8]: RuntimeError: CUDA error: an illegal memory access was encountered\n"
            f"{node0}I0213 12:07:20.087000 870572 {AGENT}:699] [default] Stopping worker group\n")
    _write(tmp_path / "job.log", text)
    result = triage(tmp_path, workers=1)
    assert result.root is not None and result.root.lineno == 4


def test_the_restarting_nodes_own_later_lines_are_still_cut(tmp_path: Path) -> None:
    """The cut per node still leaves out the restarting node's own later attempt."""
    text = ("0: ValueError: batch size 0 in shard 17\n"
            f"0: E0213 12:07:20.086000 870572 {PROCS}:869] failed (exitcode: 1) local_rank: 0 (pid: 876053) of "
            "binary: /usr/bin/python3\n"
            f"0: I0213 12:07:20.086000 870572 {AGENT}:889] [default] Worker group FAILED. 3/3 attempts left; will "
            "restart worker group\n"
            "0: RuntimeError: CUDA error: an illegal memory access was encountered\n")
    _write(tmp_path / "job.log", text)
    result = triage(tmp_path, workers=1)
    assert result.root is not None and result.root.lineno == 1
    assert result.root.attrs["restart_line"] == 3


def test_an_error_before_the_attempt_started_is_no_failure_of_it(tmp_path: Path) -> None:
    """The rendezvous' retries before "Starting worker group" are no failure of the attempt the restart ends (an
    UNHEALTHY group logs no exit report): the next attempt's error is not cut. Before: any error line above the restart
    counted, and the retry was named."""
    text = ("[W socket.cpp:464] [c10d] The client socket has failed to connect to [node0]:29500 (errno: 111 - "
            "Connection refused).\n"
            f"I0213 12:06:00.000000 870572 {AGENT}:683] [default] Starting worker group\n"
            f"I0213 12:07:20.086000 870572 {AGENT}:889] [default] Worker group UNHEALTHY. 3/3 attempts left; will "
            "restart worker group\n"
            f"I0213 12:07:20.087000 870572 {AGENT}:683] [default] Starting worker group\n"
            "RuntimeError: CUDA error: an illegal memory access was encountered\n")
    _write(tmp_path / "job.log", text)
    result = triage(tmp_path, workers=1)
    assert result.root is not None and result.root.lineno == 5
    assert "restart_line" not in result.root.attrs


def test_an_error_file_does_not_outrank_a_signal_killed_workers_unstamped_error(tmp_path: Path) -> None:
    """Rank 0 died of the abort after a CUDA error in C++ (no @record, so no error.json, its stderr unstamped); rank 1
    then raised NCCL's error and @record stamped it. Only error files carry a time: that places no unstamped line after
    them. Before: rank 1's stamped error.json was named, rank 0's unstamped report dropped for having no time."""
    nccl = ("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error (run "
            "with NCCL_DEBUG=INFO for details), NCCL version 2.21.5")
    _write(tmp_path / RUN / "attempt_0" / "0" / "stderr.log",
           "terminate called after throwing an instance of 'c10::Error'\n"
           "  what():  CUDA error: an illegal memory access was encountered\n")
    _write(tmp_path / RUN / "attempt_0" / "1" / "error.json",
           json.dumps({"message": {"message": nccl, "extraInfo": {"py_callstack": nccl + "\n",
                                                                   "timestamp": "1770984500"}}}))
    result = triage(tmp_path, workers=1)
    assert result.root is not None and result.root.source == f"{RUN}/attempt_0/0/stderr.log"
    assert "illegal memory access" in result.root.line


def test_error_wording_in_an_error_file_does_not_outrank_unstamped_wording(tmp_path: Path) -> None:
    """The same where no signature names either line: the earliest error wording is not the error file's for its
    time alone. Before: rank 1's "RuntimeError: stopping" in error.json was named."""
    _write(tmp_path / RUN / "attempt_0" / "0" / "stderr.log", FIRST)
    _write(tmp_path / RUN / "attempt_0" / "1" / "error.json",
           json.dumps({"message": "RuntimeError: stopping: peer rank 0 left the job", "timestamp": "1770984500"}))
    result = triage(tmp_path, workers=1)
    assert result.root is not None and result.root.source == f"{RUN}/attempt_0/0/stderr.log"


def test_error_files_alone_are_still_ordered_by_their_times(tmp_path: Path) -> None:
    """Where every candidate is in an error file, the earliest recorded is the root, as torchelastic picks it."""
    later = {"message": "RuntimeError: stopping: peer rank 1 left the job", "timestamp": "1770984590"}
    first = {"message": "ValueError: batch size 0 in shard 17", "timestamp": "1770984500"}
    _write(tmp_path / RUN / "attempt_0" / "0" / "error.json", json.dumps(later))
    _write(tmp_path / RUN / "attempt_0" / "1" / "error.json", json.dumps(first))
    result = triage(tmp_path, workers=1)
    assert result.root is not None and result.root.source == f"{RUN}/attempt_0/1/error.json"


@pytest.mark.parametrize("warning", [
    "[W socket.cpp:464] [c10d] The client socket has failed to connect to [node0]:29500 (errno: 111 - Connection "
    "refused).",
    "/workspace/train.py:12: UserWarning: Could not find a checkpoint; starting from scratch",
])
def test_a_handled_warning_shows_no_failure_of_the_attempt(tmp_path: Path, warning: str) -> None:
    """Attempt 0 was killed without a word (its directory exists because attempt 1 followed); the warning it printed
    and went on from is no error of it. Before: the warning was named over attempt 1's exception."""
    _write(tmp_path / RUN / "attempt_0" / "0" / "stderr.log", f"{warning}\nstep 1 loss 2.3\n")
    _write(tmp_path / RUN / "attempt_1" / "0" / "stderr.log", FIRST)
    result = triage(tmp_path, workers=1)
    assert result.root is not None and result.root.source == f"{RUN}/attempt_1/0/stderr.log"
    assert result.root.line == "ValueError: batch size 0 in shard 17"


def test_attempts_are_ordered_by_number_not_name(tmp_path: Path) -> None:
    """attempt_10 ran after attempt_2, though it sorts before it as text."""
    _write(tmp_path / RUN / "attempt_10" / "0" / "stderr.log",
           "RuntimeError: CUDA error: an illegal memory access was encountered\n")
    _write(tmp_path / RUN / "attempt_2" / "0" / "stderr.log", FIRST)
    result = triage(tmp_path, workers=1)
    assert result.root is not None and result.root.source == f"{RUN}/attempt_2/0/stderr.log"
    assert result.root.attrs["later_attempts"] == [10]


def test_each_runs_attempts_are_judged_apart(tmp_path: Path) -> None:
    """Two torchrun invocations' run directories in one --log-dir: one run's later attempt is not cut by the other's
    attempts."""
    _write(tmp_path / "none_aaaa1111" / "attempt_0" / "0" / "stderr.log", FIRST)
    _write(tmp_path / "none_bbbb2222" / "attempt_1" / "0" / "stderr.log",
           "RuntimeError: CUDA error: an illegal memory access was encountered\n")
    result = triage(tmp_path, workers=1)
    assert result.root is not None and result.root.source == "none_bbbb2222/attempt_1/0/stderr.log"
