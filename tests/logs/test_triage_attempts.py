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
