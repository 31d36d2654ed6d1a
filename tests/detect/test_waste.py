"""GPU waste: allocated vs used from stored dcgm metrics and the jobs' placement."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from vigil.detect.waste import gpu_waste, window_of
from vigil.model import Job, Topology, VigilInputError
from vigil.store.metrics import MetricFrame, MetricStore

GPUS = ["gpu/n1/0", "gpu/n1/1", "gpu/n2/0", "gpu/n2/1"]


def store_with(activity: dict[str, float], util: dict[str, float], fb: dict[str, float]) -> MetricStore:
    metrics = MetricStore()
    names = ["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_FB_USED"]
    rng = np.random.default_rng(0)
    for t in range(60):
        values = np.array([[util[g] + rng.uniform(-1, 1), activity[g], fb[g]] for g in GPUS], dtype=np.float32)
        metrics.append(MetricFrame(ts=1000.0 + 10 * t, family="gpu", entities=GPUS, metrics=names, values=values))
    return metrics


def test_waste_prefers_engine_activity_and_finds_idle_gpus() -> None:
    # j1's kernels keep GPU_UTIL at 100% while the engines are 40% active: activity is the honest measure.
    metrics = store_with(
        activity={"gpu/n1/0": 0.4, "gpu/n1/1": 0.4, "gpu/n2/0": 0.9, "gpu/n2/1": 0.0},
        util={"gpu/n1/0": 100, "gpu/n1/1": 100, "gpu/n2/0": 95, "gpu/n2/1": 0},
        fb={"gpu/n1/0": 30000, "gpu/n1/1": 30000, "gpu/n2/0": 60000, "gpu/n2/1": 3},
    )
    topology = Topology(
        jobs=[Job(id="j1", placement=["gpu/n1/0", "gpu/n1/1"]), Job(id="j2", placement=["gpu/n2/0", "gpu/n2/1"])]
    )
    start, end = window_of(metrics) or (0.0, 0.0)
    report = gpu_waste(metrics, topology, start, end)
    by_job = {row.name: row for row in report.summary("job")}
    assert by_job["j1"].waste_rate == pytest.approx(0.6, abs=1e-6)
    assert by_job["j2"].waste_rate == pytest.approx(0.55, abs=1e-6)
    assert by_job["j2"].idle_gpus == ["gpu/n2/1"] and by_job["j1"].idle_gpus == []
    assert [row.name for row in report.summary("job")] == ["j1", "j2"]  # most wasteful first
    by_node = {row.name: row for row in report.summary("node")}
    assert by_node["n2"].allocated_gpus == 2 and by_node["n2"].idle_gpus == ["gpu/n2/1"]


def test_utilization_is_used_when_not_profiled_and_busy_memory_is_not_idle() -> None:
    metrics = MetricStore()
    for t in range(10):
        values = np.array([[50.0, 20000.0], [0.0, 40000.0]], dtype=np.float32)
        metrics.append(
            MetricFrame(
                ts=float(t),
                family="gpu",
                entities=GPUS[:2],
                metrics=["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"],
                values=values,
            )
        )
    report = gpu_waste(metrics, Topology(jobs=[Job(id="j", placement=GPUS[:2])]), 0.0, 9.0)
    (row,) = report.summary("job")
    assert row.mean_activity == pytest.approx(0.25) and row.idle_gpus == []  # 40 GB held: a job is there
    with pytest.raises(VigilInputError, match="must end after"):
        gpu_waste(metrics, Topology(), 5.0, 5.0)


def test_cli_on_an_empty_home_is_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "VIGIL_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-m", "vigil", "waste"], capture_output=True, text=True, env=env)
    assert done.returncode == 2 and "nothing stored" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "home").exists()
