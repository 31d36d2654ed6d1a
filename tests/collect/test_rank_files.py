"""The rank-log forwarder's files: which job and rank a path names, files that appear later, files that were
there before, rotation, the bounds of a look, and layouts that cannot work refused with one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from tests.serve.conftest import REPO
from vigil.sources.collect.rank_files import RankLogFiles, RankLogSource

TRACEBACK_END = "ValueError: bad batch at step 15"


def _layout(tmp_path: Path, **fields: object) -> RankLogFiles:
    values: dict[str, object] = {"glob": str(tmp_path / "*" / "rank-*.log"),
                                 "pattern": r"/(?P<job>[^/]+)/rank-(?P<rank>\d+)\.log$"}
    values.update(fields)
    return RankLogFiles(**values)  # type: ignore[arg-type]


def _write(path: Path, *lines: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fh.writelines(line + "\n" for line in lines)


def _decoded(source: RankLogSource, now: float = 100.0) -> list[tuple[str, str]]:
    return [(e.entity, str(e.attrs["signature"])) for e in source.collect(now).events]


# --------------------------------------------------------------------------- path -> job and rank


@pytest.mark.parametrize(("fields", "path", "rank"), [
    ({}, "/logs/job-7/rank-3.log", "job/job-7/rank/3"),
    # Slurm: srun --output=/scratch/%j/task-%t.out
    ({"pattern": r"/scratch/(?P<job>\d+)/task-(?P<rank>\d+)\.out$"}, "/scratch/4242/task-12.out",
     "job/4242/rank/12"),
    # torchrun --log-dir D --redirects 3: D/<run id>/attempt_0/<local rank>/stderr.log, on the second 8-GPU node
    ({"pattern": r"/attempt_\d+/(?P<rank>\d+)/stderr\.log$", "job": "llm-pretrain", "rank_offset": 8},
     "/var/log/train/llm_x1/attempt_0/3/stderr.log", "job/llm-pretrain/rank/11"),
    ({}, "/logs/job-7/rank-.log", None),
    ({}, "/logs/job 7/rank-3.log", None),  # not a job id: the file is not followed
    ({}, "/logs/job-7/other.log", None),
])
def test_a_path_names_its_job_and_rank(tmp_path: Path, fields: dict[str, object], path: str,
                                       rank: str | None) -> None:
    assert _layout(tmp_path, **fields).rank_of(path) == rank


@pytest.mark.parametrize(("fields", "complaint"), [
    ({"pattern": r"rank-(\d+)"}, "names nothing"),
    ({"pattern": r"rank-(?P<rank>\d+"}, "not a regular expression"),
    ({"pattern": r"rank-(?P<rank>\d+)"}, "either by a named group 'job'"),
    ({"job": "llm"}, "not both"),
    ({"pattern": r"rank-(?P<rank>\d+)", "job": "my job"}, "is not a job id"),
    ({"pattern": r"/(?P<job>[^/]+)/", "rank_offset": 8}, "the pattern has no group 'rank'"),
    ({"format": "json"}, "'plain' or 'cri'"),
    ({"rank_offset": -1}, "greater than or equal to 0"),
    ({"glob": ""}, "at least 1 character"),
    ({"where": "x"}, "Extra inputs"),
])
def test_a_layout_that_cannot_work_is_refused(tmp_path: Path, fields: dict[str, object], complaint: str) -> None:
    with pytest.raises(ValidationError, match=complaint):
        _layout(tmp_path, **fields)


# --------------------------------------------------------------------------- following the files


def test_a_file_of_several_ranks_names_each_line_s_rank_by_torch_s_prefix(tmp_path: Path) -> None:
    # a Slurm task per node running torchrun: /logs/<job id>/node-<n>.out holds that node's ranks
    layout = RankLogFiles(glob=str(tmp_path / "*" / "node-*.out"), pattern=r"/(?P<job>\d+)/node-\d+\.out$")
    source = RankLogSource([layout], node="n01")
    source.collect(1.0)
    _write(tmp_path / "4242" / "node-1.out", f"[rank9]: {TRACEBACK_END}", "[rank10]:[E1206 09:12:44 "
           "ProcessGroupNCCL.cpp:616] [PG ID 0 PG GUID 0(default_pg) Rank 10] Watchdog caught collective operation "
           "timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
           "600043 milliseconds before timing out.", TRACEBACK_END, f"[default1]: {TRACEBACK_END}")
    found = source.collect(2.0)
    assert [(e.entity, e.attrs["signature"]) for e in found.events] == [
        ("job/4242/rank/9", "python.exception"), ("job/4242/rank/10", "nccl.watchdog_timeout")]
    # a line with no rank, or torchrun's local-rank prefix, cannot be placed: counted, not sent
    assert {p.metric: p.value for p in found.points}["vigil_agent_rank_log_lines_without_rank_total"] == 2


def test_kubernetes_container_logs_are_read_out_of_their_cri_records(tmp_path: Path) -> None:
    pods = tmp_path / "pods"
    layout = RankLogFiles(glob=str(pods / "*" / "pytorch" / "*.log"),
                          pattern=r"/[^/_]+_(?P<job>[^/_]+)-(?:master|worker)-\d+_[^/]+/pytorch/", format="cri")
    source = RankLogSource([layout], node="n01")
    source.collect(1.0)
    _write(pods / "team-a_llm-pretrain-worker-0_0f3c9a1e" / "pytorch" / "0.log",
           "2026-12-06T09:12:44.183920123Z stdout F step 15 loss 2.1",
           "2026-12-06T09:12:44.183920123Z stderr P [rank1]: ValueError: bad ",
           "2026-12-06T09:12:44.183920456Z stderr F batch at step 15")
    [event] = source.collect(2.0).events
    assert (event.entity, event.attrs["signature"]) == ("job/llm-pretrain/rank/1", "python.exception")
    assert event.message == "[rank1]: ValueError: bad batch at step 15"



def test_files_that_appear_later_are_read_from_their_first_line(tmp_path: Path) -> None:
    source = RankLogSource([_layout(tmp_path)], node="n01")
    assert _decoded(source) == []
    _write(tmp_path / "llm" / "rank-0.log", "step 1 loss 2.0", "Traceback (most recent call last):")
    _write(tmp_path / "llm" / "rank-1.log", TRACEBACK_END)
    found = source.collect(100.0)
    assert sorted((e.entity, e.attrs["signature"], e.message) for e in found.events) == [
        ("job/llm/rank/1", "python.exception", TRACEBACK_END)]
    assert all(e.kind == "rank_log" and e.ts == 100.0 for e in found.events)
    points = {p.metric: p.value for p in found.points}
    assert points["vigil_agent_rank_log_files"] == 2 and points["vigil_agent_rank_log_lines_total"] == 3
    # a third rank starting late is picked up by the next look; the others give only their new lines
    _write(tmp_path / "llm" / "rank-2.log", TRACEBACK_END)
    assert _decoded(source) == [("job/llm/rank/2", "python.exception")]
    assert _decoded(source) == []


def test_files_already_there_when_the_agent_starts_are_read_from_their_end(tmp_path: Path) -> None:
    old = tmp_path / "llm" / "rank-0.log"
    _write(old, TRACEBACK_END)
    old.write_text(old.read_text() + "ValueError: half a li")  # a line still being written when the agent came
    source = RankLogSource([_layout(tmp_path)], node="n01")
    assert _decoded(source) == []
    _write(old, "ne", TRACEBACK_END)
    assert _decoded(source) == [("job/llm/rank/0", "python.exception")]


def test_a_rotated_or_truncated_file_is_read_again_from_its_start(tmp_path: Path) -> None:
    source = RankLogSource([_layout(tmp_path)], node="n01")
    source.collect(1.0)
    log = tmp_path / "llm" / "rank-0.log"
    _write(log, "step 1", TRACEBACK_END)
    assert len(_decoded(source)) == 1
    log.rename(tmp_path / "llm" / "rank-0.log.1")  # logrotate's move: the new file starts empty
    assert _decoded(source) == []
    _write(log, TRACEBACK_END)
    assert _decoded(source) == [("job/llm/rank/0", "python.exception")]
    log.write_text("RuntimeError: boom\n")  # truncated and written again, shorter than before
    assert _decoded(source) == [("job/llm/rank/0", "python.exception")]


def test_a_look_is_bounded_and_the_files_take_turns(tmp_path: Path) -> None:
    source = RankLogSource([_layout(tmp_path)], node="n01", max_lines_per_read=100)
    source.collect(1.0)
    for rank in range(2):
        _write(tmp_path / "llm" / f"rank-{rank}.log", *[TRACEBACK_END] * 1000)
    per_look = [source.collect(float(t)).events for t in range(2, 8)]
    # the budget is spent within the first file's bounded look (LogTail's 256 lines); the files take turns
    assert [len(events) for events in per_look] == [256] * 6
    ranks = [{e.entity for e in events} for events in per_look]
    assert ranks[:2] in ([{"job/llm/rank/0"}, {"job/llm/rank/1"}], [{"job/llm/rank/1"}, {"job/llm/rank/0"}])
    assert ranks == ranks[:2] * 3
    # nothing is lost: the rest is read at later looks
    assert sum(len(source.collect(float(t)).events) for t in range(10, 20)) == 2000 - 6 * 256


def test_files_beyond_the_cap_are_refused_and_counted_and_unmatched_ones_reported_once(tmp_path: Path) -> None:
    source = RankLogSource([_layout(tmp_path)], node="n01", max_files=2)
    source.collect(1.0)
    for rank in range(3):
        _write(tmp_path / "llm" / f"rank-{rank}.log", TRACEBACK_END)
    _write(tmp_path / "llm" / "rank-x.log", TRACEBACK_END)
    found = source.collect(2.0)
    assert sorted(e.entity for e in found.events) == ["job/llm/rank/0", "job/llm/rank/1"]
    points = {p.metric: p.value for p in found.points}
    assert points["vigil_agent_rank_log_files"] == 2 and points["vigil_agent_rank_log_files_refused_total"] == 1
    source.collect(3.0)
    assert source.problems.snapshot() == {"too many files": 2, "unmatched file": 1}


def test_an_idle_file_is_set_aside_and_read_on_from_where_it_was(tmp_path: Path) -> None:
    source = RankLogSource([_layout(tmp_path)], node="n01", idle_s=3600.0)
    source.collect(1.0)
    log = tmp_path / "llm" / "rank-0.log"
    _write(log, TRACEBACK_END)
    assert len(_decoded(source)) == 1
    os.utime(log, (1.0, 1.0))  # not written for hours: a finished run's file
    assert _decoded(source) == []
    assert {p.metric: p.value for p in source.collect(5.0).points}["vigil_agent_rank_log_files"] == 0
    _write(log, "RuntimeError: resumed run failed")
    assert _decoded(source) == [("job/llm/rank/0", "python.exception")]


# --------------------------------------------------------------------------- the command line


@pytest.mark.parametrize(("args", "env", "complaint"), [
    (["--rank-logs", "/tmp/x/*.log", "--rank-log-pattern", r"rank-(\d+)", "--rank-log-job", "j"], {},
     "names nothing"),
    (["--rank-log-job", "j"], {}, "give --rank-logs too"),
    (["--rank-logs", "/tmp/x/*.log", "--rank-log-pattern", r"rank-(?P<rank>\d+)", "--rank-log-job", "a b"], {},
     "is not a job id"),
    ([], {"VIGIL_AGENT_RANK_LOGS": '[{"glob": "/x/*.log"'}, "values of lists and mappings are JSON"),
    ([], {"VIGIL_AGENT_RANK_LOGS": '[{"glob": "/x/*.log", "pattern": "(?P<rank>\\\\d+)"}]'}, "either by a named"),
])
def test_cli_refuses_a_bad_rank_log_layout_with_one_line(args: list[str], env: dict[str, str],
                                                          complaint: str) -> None:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("VIGIL_")}
    environ.update(env, PYTHONPATH=str(REPO))
    result = subprocess.run([sys.executable, "-m", "vigil", "agent", "--once", "--dcgm-url", "", *args],
                            capture_output=True, text=True, env=environ, timeout=120)
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and complaint in result.stderr, result.stderr


def test_each_line_says_where_it_was_read_so_a_push_sent_again_repeats_it(tmp_path: Path) -> None:
    source = RankLogSource([_layout(tmp_path)], node="n01")
    source.collect(1.0)
    log = tmp_path / "llm" / "rank-0.log"
    _write(log, "step 1", TRACEBACK_END, TRACEBACK_END)  # the same line twice: two lines, at two offsets
    first, second = source.collect(2.0).events
    where = str(log)
    assert (first.attrs["log_file"], first.attrs["log_offset"]) == (where, len("step 1\n"))
    assert (second.attrs["log_file"], second.attrs["log_offset"]) == (where, len("step 1\n") + len(TRACEBACK_END) + 1)
    assert first.message == second.message and first.ts == second.ts
    # truncated and written again: the same offset once more, at a later look
    log.write_text("step 1\n" + TRACEBACK_END + "\n")
    [again] = source.collect(3.0).events
    assert (again.attrs["log_offset"], again.ts) == (len("step 1\n"), 3.0)


def test_a_cri_line_joined_from_its_records_is_where_its_first_record_is(tmp_path: Path) -> None:
    pods = tmp_path / "pods"
    layout = RankLogFiles(glob=str(pods / "*" / "pytorch" / "*.log"),
                          pattern=r"/[^/_]+_(?P<job>[^/_]+)-(?:master|worker)-\d+_[^/]+/pytorch/", format="cri")
    source = RankLogSource([layout], node="n01")
    source.collect(1.0)
    first = "2026-12-06T09:12:44.183920123Z stdout F step 15 loss 2.1"
    _write(pods / "team-a_llm-worker-0_0f3c9a1e" / "pytorch" / "0.log", first,
           "2026-12-06T09:12:44.183920123Z stderr P [rank1]: ValueError: bad ")
    assert source.collect(2.0).events == []  # the line goes on in a record not written yet
    _write(pods / "team-a_llm-worker-0_0f3c9a1e" / "pytorch" / "0.log",
           "2026-12-06T09:12:44.183920456Z stderr F batch at step 15")
    [event] = source.collect(3.0).events
    assert event.message == "[rank1]: ValueError: bad batch at step 15"
    assert event.attrs["log_offset"] == len(first) + 1


def _messages(source: RankLogSource, now: float = 100.0) -> list[str]:
    return [e.message for e in source.collect(now).events]


def test_lines_written_just_before_a_create_rotation_are_read_from_the_moved_file(tmp_path: Path) -> None:
    """logrotate's default (create): the file is renamed to rank-0.log.1 and a new one made. The lines written
    after the last look and before the move are read from the moved file, then the new file from its start (before:
    they were lost). Also when the new file is not made yet at the look."""
    source = RankLogSource([_layout(tmp_path)], node="n01")
    source.collect(1.0)
    log = tmp_path / "llm" / "rank-0.log"
    _write(log, "step 1", "ValueError: first")
    assert _messages(source) == ["ValueError: first"]
    _write(log, "ValueError: written before the move")
    log.rename(tmp_path / "llm" / "rank-0.log.1")
    _write(log, "ValueError: in the new file")
    assert _messages(source) + _messages(source) == ["ValueError: written before the move",
                                                     "ValueError: in the new file"]
    assert _messages(source) == []
    # moved, the new file not there yet at the look
    _write(log, "ValueError: before the second move")
    os.replace(log, tmp_path / "llm" / "rank-0.log.1")
    assert _messages(source) == ["ValueError: before the second move"]
    _write(log, "ValueError: second new file")
    assert _messages(source) + _messages(source) == ["ValueError: second new file"]


def test_lines_written_just_before_a_copytruncate_rotation_are_read_from_the_copy(tmp_path: Path) -> None:
    """logrotate's copytruncate: the file is copied to rank-0.log.1 and truncated in place. The lines written after
    the last look and before the copy are read from the copy; the file written again past where the last look
    stopped before the next look is read from its start, not from the middle of a line (before: the first were lost,
    the second read from the old offset)."""
    import shutil

    source = RankLogSource([_layout(tmp_path)], node="n01")
    source.collect(1.0)
    log = tmp_path / "llm" / "rank-0.log"
    _write(log, "step 1", "ValueError: first")
    assert _messages(source) == ["ValueError: first"]
    _write(log, "ValueError: written before the copy")
    shutil.copyfile(log, tmp_path / "llm" / "rank-0.log.1")
    with log.open("r+b") as handle:
        handle.truncate(0)
    assert _messages(source) == ["ValueError: written before the copy"]
    _write(log, "ValueError: after the truncation")
    assert _messages(source) == ["ValueError: after the truncation"]
    # truncated and written past the old end before the next look
    _write(log, "ValueError: before the second copy")
    shutil.copyfile(log, tmp_path / "llm" / "rank-0.log.2")
    with log.open("r+b") as handle:
        handle.truncate(0)
    _write(log, "step 2 " + "x" * 200, "ValueError: long after the truncation")
    assert _messages(source) + _messages(source) == ["ValueError: before the second copy",
                                                     "ValueError: long after the truncation"]


def test_a_rotated_generation_the_glob_matches_is_not_followed_as_a_file_of_its_own(tmp_path: Path) -> None:
    """A glob and a pattern loose enough to match the generations too (rank-*, rank-(?P<rank>\\d+)\\.log): the moved
    rank-0.log.1 and a compressed rank-0.log.2.gz are the followed file's history, not new files read from their first
    line (before: every line of the moved file was sent again)."""
    import gzip

    source = RankLogSource([_layout(tmp_path, glob=str(tmp_path / "*" / "rank-*"),
                                     pattern=r"/(?P<job>[^/]+)/rank-(?P<rank>\d+)\.log")], node="n01")
    source.collect(1.0)
    log = tmp_path / "llm" / "rank-0.log"
    _write(log, "ValueError: first")
    assert _messages(source) == ["ValueError: first"]
    log.rename(tmp_path / "llm" / "rank-0.log.1")
    (tmp_path / "llm" / "rank-0.log.2.gz").write_bytes(gzip.compress(b"ValueError: older\n"))
    _write(log, "ValueError: in the new file")
    seen = _messages(source) + _messages(source) + _messages(source)
    assert seen == ["ValueError: in the new file"]


# --------------------------------------------------------------------------- torchelastic's log directory

# torchrun --rdzv-id llm --log-dir D --redirects 3 on one 2-GPU node: D/llm_<random>/attempt_<N>/<local rank>/
# {stdout.log,stderr.log,error.json}, the job fixed and the rank the local rank directory names
RESTART = "[default] Worker group FAILED. 3/3 attempts left; will restart worker group"
CALLSTACK = ('Traceback (most recent call last):\n  File "/w/train.py", line 9, in <module>\n'
             "ValueError: bad shard 17\n")


def _torchelastic(tmp_path: Path, **fields: object) -> RankLogFiles:
    values: dict[str, object] = {"glob": str(tmp_path / "*" / "attempt_*" / "*" / "stderr.log"),
                                 "pattern": r"/attempt_\d+/(?P<rank>\d+)/stderr\.log$", "job": "llm"}
    values.update(fields)
    return RankLogFiles(**values)  # type: ignore[arg-type]


def _record(path: Path, stamp: int) -> None:
    """What @record's ErrorHandler.record_exception writes when the worker dies (written once, whole)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"message": {"message": "ValueError: bad shard 17", "extraInfo": {
        "py_callstack": CALLSTACK, "timestamp": str(stamp)}}}))


def test_a_worker_s_error_file_is_read_whole_once_with_its_attempt_and_local_rank(tmp_path: Path) -> None:
    source = RankLogSource([_torchelastic(tmp_path)], node="n01")
    source.collect(1.0)
    attempt_0 = tmp_path / "llm_k2x9" / "attempt_0"
    _write(attempt_0 / "0" / "stderr.log", "step 1 loss 2.0")
    _write(attempt_0 / "1" / "stderr.log", "step 1 loss 2.0")
    assert _decoded(source, 2.0) == []
    _record(attempt_0 / "1" / "error.json", 1770984500)
    [root] = source.collect(3.0).events
    assert (root.entity, root.attrs["signature"], root.message) == ("job/llm/rank/1", "python.exception",
                                                                     "ValueError: bad shard 17")
    # the time @record wrote, not the look's; where it was read, so a push sent again repeats it
    assert root.ts == 1770984500.0
    assert root.attrs["attempt"] == 0 and root.attrs["local_rank"] == 1
    assert root.attrs["log_file"] == str(attempt_0 / "1" / "error.json") and root.attrs["log_offset"] == 0
    assert _decoded(source, 4.0) == []  # written once: read once
    # the restarted workers' lines say which attempt they are of
    _write(attempt_0 / "0" / "stderr.log", "RuntimeError: NCCL communicator was aborted on rank 0.")
    _write(tmp_path / "llm_k2x9" / "attempt_1" / "0" / "stderr.log",
           "RuntimeError: NCCL communicator was aborted on rank 0.")
    later = sorted((e.attrs["attempt"], e.attrs["local_rank"], e.entity) for e in source.collect(5.0).events)
    assert later == [(0, 0, "job/llm/rank/0"), (1, 0, "job/llm/rank/0")]


def test_an_error_file_named_by_the_glob_is_read_as_a_record_not_as_lines(tmp_path: Path) -> None:
    layout = _torchelastic(tmp_path, glob=str(tmp_path / "*" / "attempt_*" / "*" / "*"),
                           pattern=r"/attempt_\d+/(?P<rank>\d+)/[^/]+$")
    source = RankLogSource([layout], node="n01")
    source.collect(1.0)
    _write(tmp_path / "llm_k2x9" / "attempt_2" / "3" / "stdout.log", "step 1")
    _record(tmp_path / "llm_k2x9" / "attempt_2" / "3" / "error.json", 1770984500)
    events = source.collect(2.0).events
    assert [(e.message, e.attrs["attempt"], e.attrs["local_rank"]) for e in events] == [
        ("ValueError: bad shard 17", 2, 3)]


def test_an_error_file_takes_the_rank_its_worker_s_prefixed_lines_named(tmp_path: Path) -> None:
    # several nodes: the local rank directory is not the job's rank; the worker's own [rankN]: lines say which it is
    layout = RankLogFiles(glob=str(tmp_path / "*" / "attempt_*" / "*" / "stderr.log"),
                          pattern=r"/(?P<job>[^/_]+)_[^/]+/attempt_\d+/\d+/stderr\.log$")
    source = RankLogSource([layout], node="n02")
    source.collect(1.0)
    attempt_0 = tmp_path / "llm_k2x9" / "attempt_0"
    _write(attempt_0 / "1" / "stderr.log", "[rank9]: RuntimeError: CUDA error: an illegal memory access was "
           "encountered")
    _write(attempt_0 / "0" / "stderr.log", "no prefix here")
    assert _decoded(source, 2.0) == [("job/llm/rank/9", "cuda.illegal_address")]
    _record(attempt_0 / "1" / "error.json", 1770984500)
    _record(attempt_0 / "0" / "error.json", 1770984501)  # no line of its worker named a rank: not sent
    assert _decoded(source, 3.0) == [("job/llm/rank/9", "python.exception")]
    assert source.lines_without_rank == 1 + len(CALLSTACK.splitlines())


def test_an_error_file_still_being_written_is_read_when_whole(tmp_path: Path) -> None:
    source = RankLogSource([_torchelastic(tmp_path)], node="n01")
    error_file = tmp_path / "llm_k2x9" / "attempt_0" / "0" / "error.json"
    _write(error_file.parent / "stderr.log", "step 1")
    _record(error_file, 1770984400)
    assert _decoded(source, 1.0) == []  # there when the agent started: an earlier run's, not sent again
    _write(tmp_path / "llm_k2x9" / "attempt_1" / "0" / "stderr.log", "step 1")
    error_file = tmp_path / "llm_k2x9" / "attempt_1" / "0" / "error.json"
    error_file.write_text('{"message": {"message": "ValueError: bad sh')
    assert _decoded(source, 2.0) == []
    _record(error_file, 1770984500)
    assert _decoded(source, 3.0) == [("job/llm/rank/0", "python.exception")]


def test_an_error_file_that_stays_cut_short_is_read_as_an_ordinary_log(tmp_path: Path) -> None:
    # the worker was killed while writing it: what it holds is read as lines, as triage reads it
    source = RankLogSource([_torchelastic(tmp_path)], node="n01")
    source.collect(1.0)
    error_file = tmp_path / "llm_k2x9" / "attempt_0" / "0" / "error.json"
    _write(error_file.parent / "stderr.log", "step 1")
    _write(error_file, "ValueError: bad shard 17")
    assert _decoded(source, 2.0) == []
    # the next look finds it unchanged and follows it from its first line
    events = source.collect(3.0).events + source.collect(4.0).events
    assert [(e.message, e.attrs["attempt"], e.attrs["log_file"]) for e in events] == [
        ("ValueError: bad shard 17", 0, str(error_file))]
    assert _decoded(source, 5.0) == []
