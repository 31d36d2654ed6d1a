"""Tiered retention: downsampling arithmetic, idempotent jobs, expiry of both tiers, persistence."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vigil.model import VigilInputError
from vigil.store.metrics import MetricFrame, MetricStore
from vigil.store.retention import AggregateTier, RetentionJob, RetentionPolicy, downsample, read_segment

ENTITIES = ["gpu/n01/0", "gpu/n01/1"]
METRICS = ["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_UTIL"]


def fill(store: MetricStore, start: float, end: float, step: float = 10.0) -> None:
    for ts in np.arange(start, end, step):
        values = np.array([[60 + (ts % 300) / 10, 90.0], [70.0, np.nan if ts % 60 == 0 else 50.0]], dtype=np.float32)
        store.append(MetricFrame(float(ts), "gpu", ENTITIES, METRICS, values))


def test_downsample_stats_skip_missing_values() -> None:
    ts = np.array([0.0, 10.0, 20.0, 300.0, 310.0])
    values = np.array([[1.0], [np.nan], [3.0], [np.nan], [np.nan]], dtype=np.float32)
    buckets, stats = downsample(ts, values, 300.0)
    assert buckets.tolist() == [0.0, 300.0]
    assert stats["mean"][0, 0] == 2.0 and stats["min"][0, 0] == 1.0 and stats["max"][0, 0] == 3.0
    assert stats["last"][0, 0] == 3.0 and stats["count"][0, 0] == 2
    assert np.isnan(stats["mean"][1, 0]) and np.isnan(stats["last"][1, 0]) and stats["count"][1, 0] == 0


def test_job_aggregates_complete_buckets_once_and_expires_raw(tmp_path: Path) -> None:
    raw = MetricStore(tmp_path / "raw")
    fill(raw, 0.0, 3 * 3600.0)
    raw.flush()
    policy = RetentionPolicy(raw_s=3600.0, aggregate_s=2 * 3600.0, step_s=300.0)
    job = RetentionJob(raw, AggregateTier(tmp_path / "agg"), policy)
    now = 3 * 3600.0 + 100.0
    report = job.run(now)
    assert report.buckets_aggregated == 36  # 3 h of complete 5-minute buckets
    assert report.raw_frames_expired == 730  # frames at 0, 10, ..., 7290 are older than now - 1 h
    ts, temp = job.tier.series("gpu/n01/0", "DCGM_FI_DEV_GPU_TEMP", "max")
    assert len(ts) == 36 and ts[0] == 0.0
    raw_ts, raw_temp = MetricStore(tmp_path / "raw").series("gpu/n01/0", "DCGM_FI_DEV_GPU_TEMP")
    assert raw_ts.min() >= now - 3600.0  # older raw frames are gone, on disk too
    assert job.raw.frame_count("gpu") == len(raw_ts)
    # running again aggregates nothing new and keeps the aggregates
    again = job.run(now)
    assert again.buckets_aggregated == 0 and again.raw_frames_expired == 0
    assert len(job.tier.series("gpu/n01/0", "DCGM_FI_DEV_GPU_TEMP")[0]) == 36
    # the per-bucket max equals the raw max of that bucket
    assert temp[0] == pytest.approx(60 + 290 / 10)
    _, mean_util = job.tier.series("gpu/n01/1", "DCGM_FI_DEV_GPU_UTIL", "count")
    assert mean_util[0] == 25  # 30 frames per bucket, 5 of them NaN


def test_aggregates_expire_after_their_period_and_survive_a_restart(tmp_path: Path) -> None:
    raw = MetricStore(tmp_path / "raw")
    fill(raw, 0.0, 7200.0)
    policy = RetentionPolicy(raw_s=3600.0, aggregate_s=3600.0, step_s=600.0)
    job = RetentionJob(raw, AggregateTier(tmp_path / "agg"), policy)
    job.run(3600.0)
    assert len(list((tmp_path / "agg").glob("*.vza"))) == 1
    fill(job.raw, 7200.0, 9000.0)
    report = job.run(9000.0)
    assert report.segments_expired == 1
    reopened = RetentionJob(MetricStore(tmp_path / "raw"), AggregateTier(tmp_path / "agg"), policy)
    assert reopened.watermarks == {"gpu": 9000.0 - 9000.0 % 600.0}
    ts, _ = reopened.tier.series("gpu/n01/0", "DCGM_FI_DEV_GPU_UTIL")
    assert ts.min() >= 3600.0 and ts.max() == 8400.0


def test_segment_files_are_compressed_and_corruption_is_reported(tmp_path: Path) -> None:
    raw = MetricStore()
    fill(raw, 0.0, 24 * 3600.0)
    tier = AggregateTier(tmp_path / "agg")
    report = RetentionJob(raw, tier, RetentionPolicy()).run(24 * 3600.0)
    [file] = list((tmp_path / "agg").glob("*.vza"))
    uncompressed = report.buckets_aggregated * (8 + 5 * len(ENTITIES) * len(METRICS) * 4)
    assert file.stat().st_size < uncompressed / 2
    file.write_bytes(file.read_bytes()[:-7])
    with pytest.raises(VigilInputError, match="truncated"):
        read_segment(file)


def test_policy_is_validated() -> None:
    with pytest.raises(VigilInputError, match="shorter than the aggregation step"):
        RetentionPolicy(raw_s=60.0, step_s=300.0)
    with pytest.raises(VigilInputError, match="unknown aggregate"):
        AggregateTier().series("gpu/n01/0", "x", "p99")
