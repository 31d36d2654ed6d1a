"""Stack aggregation: prefix tree, equivalence classes, fork point, scale."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from vigil.diagnose.stacks import from_pyspy, load_stacks, merge_stacks
from vigil.model import VigilInputError

COMMON = ["<module> (train.py:200)", "main (train.py:150)", "train_step (train.py:90)"]
WAITING = [*COMMON, "all_reduce (distributed/distributed_c10d.py:3252)"]
STUCK = [*COMMON, "load_batch (data.py:40)", "acquire (threading.py:320)"]


def synthetic(ranks: int, odd: set[int]) -> dict[int, dict[str, list[str]]]:
    stacks = {}
    for rank in range(ranks):
        main = STUCK if rank in odd else WAITING
        stacks[rank] = {"MainThread": main, "vigil-probe": ["_bootstrap (threading.py:1002)", "_watch (probe.py:1)"]}
    return stacks


def test_fork_point_names_odd_ranks_and_frames() -> None:
    tree = merge_stacks(synthetic(8, {5}))
    fork = tree.fork_points()[0]
    assert fork.thread == "MainThread"
    assert fork.ranks == [5]
    assert fork.parent == "train_step (train.py:90)"
    assert fork.frame == "load_batch (data.py:40)"
    assert fork.majority_frame.startswith("all_reduce")
    assert fork.majority_ranks == [0, 1, 2, 3, 4, 6, 7]
    assert [ranks for ranks, _ in tree.classes] == [[0, 1, 2, 3, 4, 6, 7], [5]]


def test_identical_stacks_have_no_fork() -> None:
    assert merge_stacks(synthetic(4, set())).fork_points() == []


def test_shorter_stack_is_a_fork_too() -> None:
    stacks = synthetic(4, set())
    stacks[2]["MainThread"] = COMMON
    fork = merge_stacks(stacks).fork_points()[0]
    assert fork.ranks == [2]
    assert "stack ends" in fork.frame


def test_deeper_stack_of_one_rank_is_the_fork_not_the_ranks_that_stop_short() -> None:
    # Most ranks wait inside a native call (autograd's engine running DDP's reducer); one rank went on into
    # Python the others never reached (a custom autograd Function's backward that blocks).
    engine = [*COMMON, "backward (autograd/__init__.py:395)", "_engine_run_backward (autograd/graph.py:979)"]
    stacks = {r: {"MainThread": engine} for r in range(4)}
    stacks[2] = {"MainThread": [*engine, "apply (autograd/function.py:325)", "backward (job.py:110)",
                                "wait (threading.py:629)"]}
    fork = merge_stacks(stacks).fork_points()[0]
    assert fork.ranks == [2]
    assert fork.majority_ranks == [0, 1, 3]
    assert fork.frame == "apply (autograd/function.py:325)"
    assert fork.parent == "_engine_run_backward (autograd/graph.py:979)"
    assert "stack ends" in fork.majority_frame


def test_fork_of_the_culprit_names_its_own_frame_when_ranks_are_in_three_places() -> None:
    # Two ranks wait in an all_reduce, one in a collective inside forward, the culprit in a queue get: the
    # first minority fork may be the other odd rank's; the culprit's own fork is its frame.
    stacks = {0: {"MainThread": WAITING}, 2: {"MainThread": WAITING},
              1: {"MainThread": [*COMMON, "forward (model.py:10)", "all_gather (distributed/c10d.py:9)"]},
              3: {"MainThread": [*COMMON, "next_batch (train.py:60)", "get (queue.py:171)"]}}
    tree = merge_stacks(stacks)
    fork = tree.fork_of({3})
    assert fork is not None
    assert fork.ranks == [3]
    assert fork.frame == "next_batch (train.py:60)"
    assert fork.parent == "train_step (train.py:90)"
    assert fork.majority_ranks == [0, 2]
    assert tree.fork_of({0}) is None, "a culprit whose stack is a waiting peer's has no fork of its own"


def test_render_lists_rank_ranges() -> None:
    text = merge_stacks(synthetic(6, {3})).render()
    assert "ranks [0-2,4-5]" in text
    assert "load_batch (data.py:40)  ranks [3]" in text


def test_ten_thousand_ranks_merge_under_a_second() -> None:
    stacks = synthetic(10_000, {17, 4243})
    # Line numbers vary on a share of ranks, as they do when ranks sit in different loop iterations.
    for rank in range(0, 10_000, 7):
        stacks[rank]["MainThread"] = [*COMMON, f"all_reduce (distributed/distributed_c10d.py:{3000 + rank % 50})"]
    start = time.perf_counter()
    forks = merge_stacks(stacks).fork_points()
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0
    assert forks[0].ranks == [17, 4243]
    assert forks[0].frame == "load_batch (data.py:40)"


def test_from_pyspy_reverses_and_drops_probe_wrappers() -> None:
    dump = [
        {
            "thread_name": "MainThread",
            "active": True,
            "frames": [
                {"name": "all_reduce", "filename": "/x/torch/distributed/distributed_c10d.py", "line": 3252},
                {"name": "wrapper", "filename": "/repo/vigil/sources/probe/hooks.py", "line": 120},
                {"name": "main", "filename": "/job/train.py", "line": 10},
            ],
        }
    ]
    threads = from_pyspy(dump)
    assert threads["MainThread"] == ["main (job/train.py:10)", "all_reduce (distributed/distributed_c10d.py:3252)"]


def test_load_stacks_rejects_bad_files(tmp_path: Path) -> None:
    bad = tmp_path / "stacks.json"
    bad.write_text("{not json")
    with pytest.raises(VigilInputError, match="not valid JSON"):
        load_stacks(bad)
    bad.write_text(json.dumps({"0": {"nothreads": 1}}))
    with pytest.raises(VigilInputError, match="rank 0 has no 'threads'"):
        load_stacks(bad)
    with pytest.raises(VigilInputError, match="does not exist"):
        load_stacks(tmp_path / "missing.json")
