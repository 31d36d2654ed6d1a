"""Periodic stacks: clusters across ranks, outliers by strict majority, machines flagged across jobs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vigil.diagnose.stack_clusters import (
    StackSweep,
    append_sweep,
    clusters,
    job_stacks,
    machine_findings,
    outliers,
    periodic_file,
    read_sweeps,
    sweep_of,
)
from vigil.model import VigilInputError

WAIT = ["main (train.py:10)", "backward (torch/_tensor.py:626)"]
LOAD = ["main (train.py:8)", "__next__ (data/dataloader.py:733)", "read (io/nfs.py:40)"]


def sweep(index: int, places: dict[int, list[str]], hosts: dict[int, str], job: str = "j") -> StackSweep:
    stacks = {r: {"MainThread": frames, "gloo": ["run (x.py:1)"]} for r, frames in places.items()}
    return sweep_of(stacks, hosts, job, index, 1000.0 + index)


def test_ranks_cluster_by_function_and_the_minority_are_outliers() -> None:
    # Ranks 0-2 wait at different lines of the same functions: one cluster.
    moved = ["main (train.py:11)", "backward (torch/_tensor.py:630)"]
    found = sweep(0, {0: WAIT, 1: moved, 2: WAIT, 3: LOAD}, {r: "a" for r in range(4)})
    [big, small] = clusters(found)
    assert (big.ranks, small.ranks, small.top) == ([0, 1, 2], [3], "read (io/nfs.py)")
    assert outliers(found) == [3]
    # No strict majority, no outliers.
    assert outliers(sweep(1, {0: WAIT, 1: WAIT, 2: LOAD, 3: LOAD}, {})) == []


def test_a_machine_outlying_in_every_job_is_flagged_one_bad_job_is_not(tmp_path: Path) -> None:
    hosts = {0: "good", 1: "good", 2: "bad", 3: "bad"}
    jobs = []
    for name, slow_ranks in (("one", {2}), ("two", {3}), ("three", {0})):
        run = tmp_path / name
        run.mkdir()
        for index in range(4):
            # The slow rank is an outlier in 3 of 4 sweeps of its job.
            places = {r: LOAD if r in slow_ranks and index < 3 else WAIT for r in range(4)}
            node = 0 if index % 2 else 1  # two nodes write their own files; read back as one sweep
            for rank_set in ({0, 1}, {2, 3}):
                part = {r: places[r] for r in rank_set}
                append_sweep(run / periodic_file(node), sweep(index, part, hosts, name))
        jobs.append(job_stacks(run))
    assert [j.sweeps for j in jobs] == [4, 4, 4]
    assert jobs[0].outlier_counts == {2: 3}
    findings = {f.host: f for f in machine_findings(jobs[:2])}
    assert findings["bad"].flagged and findings["bad"].outlier_jobs == 2
    assert not findings["good"].flagged
    # A third job where the good machine is the outlier: neither machine outlies in every job.
    findings = {f.host: f for f in machine_findings(jobs)}
    assert not findings["bad"].flagged and findings["bad"].outlier_jobs == 2
    assert not findings["good"].flagged and findings["good"].outlier_jobs == 1


def test_single_machine_jobs_say_nothing_about_machines(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        one_machine = sweep(0, {0: WAIT, 1: WAIT, 2: LOAD}, {r: "m" for r in range(3)})
        append_sweep(tmp_path / name / periodic_file(None), one_machine)
    assert machine_findings([job_stacks(tmp_path / "a"), job_stacks(tmp_path / "b")]) == []


def test_a_bad_sweep_line_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / periodic_file(None)
    append_sweep(path, sweep(0, {0: WAIT}, {0: "m"}))
    with open(path, "a") as out:
        out.write(json.dumps({"job": "j", "index": 1, "ts": 1.0, "ranks": {"0": {"host": "m"}}}) + "\n")
    with pytest.raises(VigilInputError, match=r"stacks.periodic.jsonl:2: expected a sweep"):
        read_sweeps(tmp_path)
    with pytest.raises(VigilInputError, match="not a run directory"):
        read_sweeps(tmp_path / "missing")
