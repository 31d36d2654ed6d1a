"""RCA evaluation on simulated incidents and the peer-difference detector it runs with the rules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from vigil.diagnose.peers import PeerDifferenceDetector
from vigil.model import VigilInputError
from vigil.sources.sim.faults import CATALOGUE
from vigil.sources.sim.generator import FaultPlan, SimConfig, simulate
from vigil_eval.rca import CASE_KINDS, EvalCase, build_cases, run_case


def test_case_mix_is_deterministic_and_covers_the_catalogue() -> None:
    cases = build_cases(80, seed=5)
    assert [c.plans for c in cases] == [c.plans for c in build_cases(80, seed=5)]
    assert {c.kind for c in cases} == set(CASE_KINDS)
    singles = {c.truth.fault_type for c in cases if c.kind == "single"}
    assert singles == {spec.name for spec in CATALOGUE}
    assert all(c.truth.fault_type == "switch_failure" for c in cases if c.kind == "cascade")
    for case in cases:
        if case.kind == "noisy" and len(case.plans) == 2:
            truth_job = {int(p.entity.split("/")[1][1:]) // 8 for p in case.plans[:1] if p.entity.startswith("gpu/")}
            noise_job = {int(p.entity.split("/")[1][1:]) // 8 for p in case.plans[1:] if p.entity.startswith("gpu/")}
            assert not (truth_job & noise_job)
    with pytest.raises(VigilInputError):
        build_cases(0, seed=1)


@pytest.mark.parametrize(("fault", "entity"), [
    ("switch_failure", "switch/leaf02"),
    ("job_hang", "job/j01/rank/21"),
    ("gpu_lost", "gpu/n003/5"),
    ("gpu_p2p_bw_low", "gpu/n012/1"),
    ("process_killed", "job/j01/rank/21"),
    ("gpu_oom", "job/j01/rank/21"),
])
def test_full_path_ranks_the_injected_fault_first(fault: str, entity: str) -> None:
    result = run_case(EvalCase(0, "single", 1234, (FaultPlan(fault, entity, 780.0, 660.0),)))
    assert result.detected
    assert result.rank == 1, result.top3
    assert result.rca_seconds < 5.0


def peer_anomalies(plan: FaultPlan, seed: int) -> tuple[Any, list[Any]]:
    """Run one injected fault through the peer-difference detector; the run and what it found."""
    run = simulate(SimConfig(nodes=8, gpus=8, minutes=25, seed=seed, job_nodes=8, plans=(plan,)))
    detector = PeerDifferenceDetector(run.topology)
    for tick in run.ticks():
        detector.update(tick.frames, tick.events)
    return run, detector.close()


def test_peer_detector_flags_only_the_degraded_gpu() -> None:
    run, found = peer_anomalies(FaultPlan("gpu_p2p_bw_low", "gpu/n004/2", 600.0, 600.0), seed=9)
    assert {a.entity for a in found} == {"gpu/n004/2"}
    assert found[0].fault_type == "peer_nvlink_bandwidth_low" and found[0].evidence[0].kind == "peer"
    assert found[0].start >= run.start_ts + 600.0


def test_rca_eval_command_prints_the_summary(tmp_path: Path) -> None:
    env = {**os.environ, "VIGIL_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "vigil", "rca", "eval", "--cases", "5", "--seed", "3", "--json"],
                          capture_output=True, text=True, env=env, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["cases"] == 5 and 0.0 <= summary["ac_at_1"] <= summary["ac_at_3"] <= 1.0
    assert sum(block["cases"] for block in summary["by_fault"].values()) == 5


def test_peer_detector_finds_the_idle_gpu_of_a_hung_rank() -> None:
    run, found = peer_anomalies(FaultPlan("job_hang", "job/j00/rank/21", 600.0, 600.0), seed=4)
    hung_gpu = run.topology.jobs[0].placement[21]
    assert {(a.entity, a.fault_type) for a in found} == {(hung_gpu, "peer_gpu_idle")}
