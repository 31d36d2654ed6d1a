"""RL co-location planner: the decoding model on cases worked by hand, the tail effect on a long-tailed sample,
partial rollout carrying unfinished sequences, and the CLI's plan, quotas and bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO
from vigil.model import VigilInputError
from vigil.remedy.tide.load import read_generation_lengths
from vigil.remedy.tide.rl import RlCluster, _rollout, plan_rl, simulate

SMALL = RlCluster(gpus=16, batch=512, block_gpus=8)


def long_tail(size: int = 4000, seed: int = 1) -> np.ndarray:
    """Most generations short, one in twenty ten times longer."""
    rng = np.random.default_rng(seed)
    return np.where(rng.random(size) < 0.05, 1000.0, rng.integers(50, 150, size).astype(float))


def test_one_gpu_decoding_worked_by_hand() -> None:
    cluster = RlCluster(gpus=16, gpu_tokens_s=60.0, seq_tokens_s=40.0)
    # two sequences share 60 tok/s (30 each) until the short one ends at 40/30 s; the other then runs at 40
    phase, left = _rollout(np.array([40.0, 80.0]), 1, cluster, stop_after=2)
    assert phase.duration_s == pytest.approx(40 / 30 + 40 / 40)
    assert phase.busy_gpu_s == pytest.approx(40 / 30 * 1.0 + 1.0 * 40 / 60)
    assert left.tolist() == [0.0, 0.0]
    # stopping after the first: the long one keeps what it had not generated
    phase, left = _rollout(np.array([40.0, 80.0]), 1, cluster, stop_after=1)
    assert phase.finished == [0] and left.tolist() == pytest.approx([0.0, 40.0])


def test_partial_rollout_cuts_the_tail_and_idle_time_below_separated() -> None:
    lengths = long_tail()
    plan = plan_rl(lengths, SMALL, steps=6)
    separated, colocated, partial = plan.separated, plan.colocated, plan.partial
    assert partial.idle_fraction < colocated.idle_fraction < separated.idle_fraction
    assert partial.tail_s < 0.5 * colocated.tail_s
    assert partial.staleness > 1.0 and colocated.staleness == 1.0 == separated.staleness
    assert plan.chosen.mode == "partial" and plan.quotas() == {"rl-colocated": 16}


def test_without_a_tail_colocation_idles_only_while_switching() -> None:
    even = np.full(1000, 100.0)
    cluster = RlCluster(gpus=16, batch=16 * 64, block_gpus=8, switch_s=5.0)
    stats = simulate(even, cluster, "colocated", steps=2)
    # 64 sequences per GPU at 2500/64 tok/s: the GPUs are saturated while decoding, so idle = the switches
    assert stats.tail_s == pytest.approx(0.0, abs=1e-9)
    assert stats.idle_fraction == pytest.approx(10.0 / stats.step_s, rel=1e-6)


def test_separated_plan_is_exposed_as_two_queues() -> None:
    plan = plan_rl(long_tail(), RlCluster(gpus=16, batch=512, block_gpus=8, switch_s=60.0), steps=4)
    assert plan.chosen.mode == "separated"
    quotas = plan.quotas()
    assert set(quotas) == {"rl-rollout", "rl-train"} and sum(quotas.values()) == 16
    assert [p["phase"] for p in plan.chosen.schedule] == ["rollout", "weight_sync", "train"]


def test_bad_lengths_and_settings(tmp_path: Path) -> None:
    with pytest.raises(VigilInputError, match="multiple of 8"):
        RlCluster(gpus=20)
    with pytest.raises(VigilInputError, match="rollout GPUs"):
        simulate(long_tail(), SMALL, "separated", rollout_gpus=16)
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,GeneratedTokens\n2023-11-16 18:00:00,ten\n")
    with pytest.raises(VigilInputError, match="line 2: bad GeneratedTokens"):
        read_generation_lengths(bad)


def test_cli_plans_from_a_trace_and_refuses_bad_input(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    lengths = long_tail(600)
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:00:{i % 60:02d}.5,100,{int(n)}\n" for i, n in enumerate(lengths)))
    env = dict(os.environ, PYTHONPATH=str(REPO), VIGIL_HOME=str(tmp_path / "home"))
    done = subprocess.run([sys.executable, "-m", "vigil", "tide", "rl", "--trace", str(trace), "--gpus", "16",
                           "--batch", "512", "--json"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    assert set(payload["plans"]) == {"separated", "colocated", "partial"}
    assert payload["plans"]["partial"]["idle_fraction"] < payload["plans"]["separated"]["idle_fraction"]
    assert payload["actions"] == []
    table = subprocess.run([sys.executable, "-m", "vigil", "tide", "rl", "--trace", str(trace), "--gpus", "16",
                            "--batch", "512"], capture_output=True, text=True, env={**env, "COLUMNS": "80"},
                           timeout=300)
    assert table.returncode == 0 and "\u2026" not in table.stdout, table.stdout  # folded at 80 columns, not cut
    for args in (["--backend", "yarn"], ["--gpus", "20"]):
        bad = subprocess.run([sys.executable, "-m", "vigil", "tide", "rl", "--trace", str(trace), *args],
                             capture_output=True, text=True, env=env, timeout=300)
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
