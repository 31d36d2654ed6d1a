"""The rank-log decoder: a line a signature names becomes one event on its rank, with the collective a watchdog
timed out (SeqNum, op, process group) in the wordings torch has used."""

from __future__ import annotations

import pytest

from vigil.sources.collect.ranklog import decode_rank_line

RANK = "job/llm/rank/3"


@pytest.mark.parametrize(("line", "attrs"), [
    ("[rank3]:[E1206 09:12:44.183920 48213 ProcessGroupNCCL.cpp:616] [PG ID 0 PG GUID 0(default_pg) Rank 3] Watchdog "
     "caught collective operation timeout: WorkNCCL(SeqNum=18231, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
     "Timeout(ms)=600000) ran for 600043 milliseconds before timing out.",
     {"seq": 18231, "op": "ALLREDUCE", "process_group": "0"}),
    ("[E ProcessGroupNCCL.cpp:475] [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, "
     "OpType=BROADCAST, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for 1800157 milliseconds before timing out.",
     {"seq": 7, "op": "BROADCAST"}),
    ("[PG 2 (tp) Rank 3] Timeout at NCCL work: 412, last enqueued NCCL work: 412, last completed NCCL work: 411.",
     {"seq": 412, "process_group": "2"}),
])
def test_a_watchdog_timeout_names_its_collective(line: str, attrs: dict[str, object]) -> None:
    event = decode_rank_line(RANK, line, 100.0)
    assert event is not None
    assert (event.kind, event.entity, event.source, event.ts) == ("rank_log", RANK, "rank", 100.0)
    assert event.attrs == {"signature": "nccl.watchdog_timeout", "symptom": "nccl_timeout", **attrs}


def test_other_lines() -> None:
    assert decode_rank_line(RANK, "step 1200 loss 2.31 lr 3e-4", 1.0) is None
    oom = decode_rank_line(RANK, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", 1.0)
    assert oom is not None and "seq" not in oom.attrs and oom.attrs["signature"] == "cuda.oom"


def test_a_line_torch_prefixed_with_its_rank_is_matched_without_the_prefix() -> None:
    line = "[rank3]: ValueError: bad batch at step 5: labels out of range"
    event = decode_rank_line(RANK, line, 1.0)
    # a plain exception is the application_error symptom RCA reads (no more specific signature matched the line)
    assert event is not None and event.message == line
    assert event.attrs == {"signature": "python.exception", "symptom": "python.exception"}
    assert decode_rank_line(RANK, "[rank3]: step 1200 loss 2.31", 1.0) is None


@pytest.mark.parametrize("line", [
    "(RayTrainWorker pid=4101, ip=10.0.0.2) ValueError: bad batch at step 5: labels out of range",
    "[1,3]<stderr>:ValueError: bad batch at step 5: labels out of range",
    "3: ValueError: bad batch at step 5: labels out of range",
    "[pod/llama-ft-worker-3/pytorch] ValueError: bad batch at step 5: labels out of range",
])
def test_a_line_under_another_launchers_prefix_is_matched_without_it(line: str) -> None:
    event = decode_rank_line(RANK, line, 1.0)
    assert event is not None and event.message == line and event.attrs["signature"] == "python.exception"
