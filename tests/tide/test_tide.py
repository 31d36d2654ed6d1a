"""Tier policy, forecast and tidal planner on small synthetic traces; the CLI's bad-input path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO
from tests.tide.tide_inputs import write_policy
from vigil.config import settings
from vigil.model import FaultLevel, Gpu, Incident, Node, Topology, VigilInputError
from vigil.remedy.tide.forecast import SeasonalBurstForecaster
from vigil.remedy.tide.load import peak_rates, read_request_times
from vigil.remedy.tide.planner import Capacity, capacity_of, lead_intervals, plan
from vigil.remedy.tide.tiers import TierPolicy, load_tier_policy
from vigil.store.sql import open_store


def daily_rates(days: int, interval_s: float = 300.0, peak: float = 400.0, seed: int = 0) -> np.ndarray:
    """A tidal load: a trough of a quarter of the peak at 04:00, the peak at 16:00, with noise."""
    hours = np.arange(int(days * 86400 / interval_s)) * interval_s / 3600.0
    shape = 0.25 + 0.75 * (0.5 - 0.5 * np.cos(2 * np.pi * (hours - 4.0) / 24.0))
    return peak * shape * np.random.default_rng(seed).uniform(0.95, 1.05, hours.size)


# --------------------------------------------------------------------------- policy


def test_default_policy_maps_workloads_to_four_tiers() -> None:
    policy = load_tier_policy()
    assert [policy.tier(n).preemptible for n in (1, 2, 3, 4)] == [False, False, True, True]
    assert policy.tier_of("serve-llama") == 1
    assert policy.tier_of("train-prod-gpt") == 2
    assert policy.tier_of("train-spot-sweep") == 3
    assert policy.tier_of("batch-embed") == 4
    assert policy.tier_of("unknown") is None
    assert policy.tier(3).notice_lead_s == 900.0


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"t2_floorGpus": 300, "t2_ceilingGpus": 10}, "floorGpus 300 above ceilingGpus 10"),
        ({"t3_noticeLead": "1m", "t3_gracePeriod": "5m"}, "noticeLead"),
        ({"t3_gracePeriod": "soon"}, "bad duration"),
        ({"t4_tier": 2}, "expected tiers 1, 2, 3 and 4"),
        ({"t1_priority": 5}, "priority"),
    ],
)
def test_bad_policy_is_one_line_naming_the_problem(tmp_path: Path, changes: dict[str, object], needle: str) -> None:
    path = write_policy(tmp_path / "tiers.yaml", **changes)
    with pytest.raises(VigilInputError) as err:
        load_tier_policy(path)
    message = str(err.value)
    assert needle in message and str(path) in message and "\n" not in message


def test_policy_that_is_not_a_mapping_or_yaml(tmp_path: Path) -> None:
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    (tmp_path / "broken.yaml").write_text("tiers: [\n")
    for name in ("list.yaml", "broken.yaml", "missing.yaml"):
        with pytest.raises(VigilInputError):
            load_tier_policy(tmp_path / name)


# --------------------------------------------------------------------------- load and forecast


def test_peak_rates_take_the_busiest_window(tmp_path: Path) -> None:
    # 20 requests in one 10 s window, then one every 10 s: the first interval's peak is 2 req/s
    times = [f"2023-11-16 18:00:0{i % 10}.{i:07d}" for i in range(20)]
    times += [f"2023-11-16 18:{m:02d}:{s:02d}.0000000" for m in range(1, 10) for s in range(0, 60, 10)]
    trace = tmp_path / "trace.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(f"{t},1,1" for t in times) + "\n")
    rates = peak_rates(read_request_times(trace), 300.0)
    assert rates.tolist() == [2.0, 0.1]


def test_bad_trace_rows_name_file_and_line(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:00:00.1,3\nyesterday,4\n")
    with pytest.raises(VigilInputError, match=r"line 3: bad TIMESTAMP 'yesterday'"):
        read_request_times(trace)
    (tmp_path / "other.csv").write_text("when,what\n1,2\n")
    with pytest.raises(VigilInputError, match="TIMESTAMP column"):
        read_request_times(tmp_path / "other.csv")


def test_forecast_follows_the_daily_tide() -> None:
    rates = daily_rates(days=3)
    season = 288
    history, future = rates[:-season], rates[-season:]
    forecast = SeasonalBurstForecaster(season=season).fit(history).predict(season)
    relative_error = np.abs(forecast - future) / future
    # beyond the burst guard the season carries it: within noise of the truth
    assert np.median(relative_error[12:]) < 0.1
    # a flat forecast of the last value misses the tide by far more
    assert np.median(np.abs(history[-1] - future) / future) > 0.3


def test_forecast_never_drops_below_a_fresh_burst() -> None:
    rates = daily_rates(days=2)
    rates[-1] *= 3.0
    forecast = SeasonalBurstForecaster(season=288).fit(rates).predict(3)
    assert forecast[0] >= rates[-1]


# --------------------------------------------------------------------------- planner


@pytest.mark.parametrize("seed", range(5))
def test_plan_keeps_floors_ceilings_and_never_offers_unhealthy_gpus(seed: int) -> None:
    rng = np.random.default_rng(seed)
    policy = load_tier_policy()
    policy = policy.model_copy(
        update={"tiers": [t.model_copy(update={"ceiling_gpus": 500}) if t.tier == 4 else t for t in policy.tiers]}
    )
    capacity = Capacity(total_gpus=1000, unhealthy_gpus=int(rng.integers(0, 200)))
    history = daily_rates(days=2, peak=float(rng.uniform(100, 1200)), seed=seed)
    result = plan(history, policy, capacity, horizon=48)
    for row in result.intervals:
        assert sum(row.tiers.values()) <= capacity.healthy_gpus
        for n in (1, 2, 3, 4):
            assert policy.tier(n).floor_gpus <= row.tiers[n] <= policy.tier(n).ceiling_gpus
        assert row.tiers[1] >= min(row.inference_need, capacity.healthy_gpus - 200)


def test_capacity_is_given_back_a_notice_lead_before_inference_needs_it() -> None:
    policy = load_tier_policy()
    lead = lead_intervals(policy)
    rates = daily_rates(days=2, peak=1200.0)
    # plan from 10:00 on day two, when the morning tide rises
    now = 288 + 120
    result = plan(rates[:now], policy, Capacity(total_gpus=1000), horizon=40)
    rows = result.intervals
    assert any(b.tiers[1] > a.tiers[1] for a, b in zip(rows, rows[1:], strict=False)), "the tide must rise"
    for i, row in enumerate(rows):
        for ahead in rows[i : i + lead + 1]:
            # what tier 3 holds now is still free when inference grows within the lead
            assert row.tiers[3] + ahead.tiers[1] + ahead.tiers[2] <= result.healthy_gpus
    spot_shrinks = [n for n in result.notices if n.tier == 3]
    assert spot_shrinks
    for notice in spot_shrinks:
        assert notice.issued_s <= notice.effective_s - min(policy.tier(3).notice_lead_s, notice.effective_s)
        assert notice.issued_s >= 0.0


def test_floors_that_do_not_fit_healthy_capacity_are_refused() -> None:
    with pytest.raises(VigilInputError, match="only 150 healthy"):
        plan(daily_rates(days=1), load_tier_policy(), Capacity(total_gpus=200, unhealthy_gpus=50))


def test_policy_round_trips_through_the_model() -> None:
    policy = load_tier_policy()
    assert TierPolicy.model_validate(policy.model_dump(by_alias=True)) == policy


# --------------------------------------------------------------------------- CLI


def _vigil(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "vigil", "tide", "plan", *args], capture_output=True, text=True, env=env, timeout=120
    )


def test_cli_plans_from_a_trace_and_refuses_bad_input(tmp_path: Path) -> None:
    lines = [f"2023-11-16 18:{m:02d}:{s:02d}.5000000,10,10" for m in range(30) for s in range(0, 60, 2)]
    trace = tmp_path / "trace.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(lines) + "\n")
    done = _vigil("--trace", str(trace), "--gpus", "400", "--unhealthy-gpus", "40", "--json")
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    assert payload["healthy_gpus"] == 360
    assert all(sum(row["tiers"].values()) <= 360 for row in payload["intervals"])

    bad_policy = write_policy(tmp_path / "bad.yaml", t1_floorGpus=-1)
    for args in (["--trace", str(tmp_path / "nope.csv")], ["--trace", str(trace), "--policy", str(bad_policy)]):
        done = _vigil(*args)
        assert done.returncode == 2
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_apply_dry_run_works_without_slurm_tools_and_says_what_it_left_out(tmp_path: Path) -> None:
    """No squeue on PATH: the dry run still proposes the tier quotas (they come from the plan alone) and says in
    one line that the notices need squeue; --execute refuses with that one line instead of acting half-blind."""
    lines = [f"2023-11-16 18:{m:02d}:{s:02d}.5000000" for m in range(30) for s in range(0, 60, 3)]
    trace = tmp_path / "trace.csv"
    trace.write_text("TIMESTAMP\n" + "\n".join(lines) + "\n")
    no_slurm = tmp_path / "bin"
    no_slurm.mkdir()
    env = dict(os.environ, PYTHONPATH=str(REPO), PATH=str(no_slurm), VIGIL_HOME=str(tmp_path / "home"),
               VIGIL_DB_URL=f"sqlite:///{tmp_path}/vigil.db")
    apply = [sys.executable, "-m", "vigil", "tide", "apply", "--trace", str(trace), "--gpus", "400", "--json"]
    done = subprocess.run(apply, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    actions = json.loads(done.stdout)
    assert [a["kind"] for a in actions] == ["set_quota", "set_quota"]
    assert all(a["status"] == "proposed" and a["result"].startswith("dry-run: would run sacctmgr") for a in actions)
    said = " ".join(done.stderr.split())
    assert "squeue not found on PATH" in said and "preemption notices and preemptions need squeue" in said
    executed = subprocess.run([*apply, "--execute"], capture_output=True, text=True, env=env, timeout=120)
    assert executed.returncode == 2
    assert len(executed.stderr.strip().splitlines()) == 1 and "squeue not found" in executed.stderr


def test_spot_moves_in_blocks_and_keeps_what_it_was_promised() -> None:
    policy = load_tier_policy()
    block = policy.tier(3).block_gpus
    rates = daily_rates(days=2, peak=800.0)
    result = plan(rates[: 288 + 140], policy, Capacity(total_gpus=1000), horizon=12)
    assert all(row.tiers[3] % block == 0 for row in result.intervals)
    free = plan(rates[: 288 + 140], policy, Capacity(total_gpus=1000), horizon=3)
    promised = [free.intervals[0].tiers[3] + block]
    kept = plan(rates[: 288 + 140], policy, Capacity(total_gpus=1000), horizon=3, promised_spot=promised)
    row = kept.intervals[0]
    assert row.tiers[1] + row.tiers[2] + promised[0] <= kept.healthy_gpus, "the promise must fit to be kept"
    assert row.tiers[3] == promised[0]
    assert sum(row.tiers.values()) <= kept.healthy_gpus


def test_capacity_from_topology_takes_out_every_gpu_of_a_node_below_healthy() -> None:
    topology = Topology(
        nodes=[Node(name=f"n{i}", gpus=[Gpu(node=f"n{i}", index=g) for g in range(8)]) for i in range(4)]
    )
    health = {"node/n1": FaultLevel.ISOLATE, "gpu/n2/3": FaultLevel.ISOLATE, "node/n0": FaultLevel.HEALTHY}
    capacity = capacity_of(topology, health)
    assert (capacity.total_gpus, capacity.unhealthy_gpus, capacity.healthy_gpus) == (32, 16, 16)


def test_cli_takes_healthy_gpus_from_the_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("TIMESTAMP\n2023-11-16 18:00:00.1\n")
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("VIGIL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("VIGIL_DB_URL", f"sqlite:///{tmp_path}/vigil.db")
    done = _vigil("--trace", str(trace), "--from-store")
    assert done.returncode == 2 and "nothing stored" in done.stderr

    settings.cache_clear()
    store = open_store()
    try:
        store.save_topology(
            Topology(nodes=[Node(name=f"n{i}", gpus=[Gpu(node=f"n{i}", index=g) for g in range(8)]) for i in range(40)])
        )
        store.upsert_incident(
            Incident(
                title="xid 79",
                scope="node/n3",
                entities=["gpu/n3/5"],
                start=0.0,
                end=0.0,
                level=FaultLevel.ISOLATE,
                fault_types=["xid_79"],
            )
        )
    finally:
        store.close()
        settings.cache_clear()
    done = _vigil("--trace", str(trace), "--from-store", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["healthy_gpus"] == 40 * 8 - 8
