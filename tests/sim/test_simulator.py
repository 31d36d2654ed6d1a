from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from vigil.knowledge.faults import fault_catalogue
from vigil.knowledge.metrics import metric_spec
from vigil.model import VigilInputError
from vigil.sources.sim import FaultPlan, SimConfig, simulate
from vigil.sources.sim import metrics as M
from vigil.sources.sim.faults import CATALOGUE, TRAINING_FAULTS
from vigil.sources.sim.io import load_sim, write_sim

REQUIRED_DCGM = {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_FB_USED",
                 "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
                 "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
                 "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
                 "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"}


def test_catalogue_covers_the_trace_and_training_faults() -> None:
    names = {s.name for s in CATALOGUE}
    assert len(names) >= 26
    assert {"job_hang", "straggler", "nan_loss", "loss_spike", "vanishing_gradient", "gpu_oom"} <= TRAINING_FAULTS
    assert set(M.GPU_METRICS) >= REQUIRED_DCGM


def test_fault_mix_is_the_catalogue_weight_from_the_real_trace(shared_data: Path) -> None:
    trace = json.loads((shared_data / "stepfun_infinitehbd_trace" / "fault_trace.json").read_text())
    counts = Counter((e["fault_type"]["Level"], e["fault_type"]["Class"], e["fault_type"]["Desc"])
                     for e in trace if e["event_type"] == "fault_start")
    catalogue = fault_catalogue()
    for item in catalogue.trace:
        assert counts[(item.level, item.cls, item.desc)] == item.count, item.desc
    for spec in CATALOGUE:
        entry = catalogue.faults[spec.name]
        assert (spec.target, spec.level) == (entry.target, entry.level)
        real = sum(t.count for t in catalogue.trace if t.fault == spec.name)
        assert spec.weight == real + entry.pseudo_count > 0


def test_simulated_metrics_are_catalogued_in_their_family() -> None:
    for family, names in M.FAMILIES.items():
        for name in names:
            assert metric_spec(name).family == family


def test_same_seed_same_run_different_seed_different_run() -> None:
    a, b, c = (simulate(SimConfig(nodes=4, minutes=30, seed=s)) for s in (3, 3, 4))
    def truth(run):  # type: ignore[no-untyped-def]
        return [g.model_dump(exclude={"id"}) for g in run.ground_truth]

    assert truth(a) == truth(b)
    ta, tb, tc = (list(r.ticks())[-1].frames[0].values for r in (a, b, c))
    np.testing.assert_array_equal(ta, tb)
    assert not np.array_equal(ta, tc, equal_nan=True)


def test_fault_mix_follows_the_trace_weights() -> None:
    run = simulate(SimConfig(nodes=64, minutes=240, seed=1, faults_per_node_hour=2.0))
    counts = Counter(g.fault_type for g in run.ground_truth)
    # GPU double-bit ECC is the trace's most common class; a single-bit storm is its rarest
    assert counts["gpu_dbe"] > counts["gpu_sbe_storm"]
    assert len(run.ground_truth) >= 100


def test_dbe_fault_evolves_precursor_onset_and_job_effects() -> None:
    plan = FaultPlan("gpu_dbe", "gpu/n001/3", start_s=20 * 60, duration_s=10 * 60)
    run = simulate(SimConfig(nodes=4, minutes=40, seed=0, plans=(plan,)))
    gi = M.index("gpu")
    sbe, dbe = [], []
    gpu_pos = run.gpu_ids.index("gpu/n001/3")
    for tick in run.ticks():
        gpu = tick.frames[0]
        sbe.append(gpu.values[gpu_pos, gi["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"]])
        dbe.append(gpu.values[gpu_pos, gi["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"]])
    onset = 20 * 6
    assert sbe[onset - 1] - sbe[onset - 30] > 20, "single-bit errors climb before the DBE"
    assert dbe[onset - 1] == 0 and dbe[onset + 1] > 0
    xid_lines = [r.line for r in run.logs if "NVRM: Xid" in r.line]
    assert any("): 48, pid=" in line for line in xid_lines)
    rank_lines = [r for r in run.logs if r.source == "rank"]
    assert any("uncorrectable ECC error" in r.line for r in rank_lines)
    assert any("remote process exited" in r.line for r in rank_lines)
    assert any(e.kind == "job" and e.attrs.get("reason") == "crashed" for e in run.events)
    truth = run.ground_truth[0]
    assert (truth.fault_type, truth.entity) == ("gpu_dbe", "gpu/n001/3")


def test_checkpoint_pauses_progress_without_a_fault() -> None:
    run = simulate(SimConfig(nodes=2, minutes=60, seed=2, faults_per_node_hour=0, benign_noise=False))
    ji = M.index("job")
    saving = [t.frames[3].values[0, ji["vigil_job_checkpoint_in_progress"]] for t in run.ticks()]
    assert any(saving) and not run.ground_truth


def test_bad_plans_are_rejected_with_a_clear_message() -> None:
    with pytest.raises(VigilInputError, match="needs a gpu entity"):
        simulate(SimConfig(nodes=2, plans=(FaultPlan("gpu_dbe", "node/n000", 600, 60),)))
    with pytest.raises(VigilInputError, match="not in the simulated cluster"):
        simulate(SimConfig(nodes=2, plans=(FaultPlan("gpu_dbe", "gpu/n999/0", 600, 60),)))
    with pytest.raises(VigilInputError, match="unknown fault type"):
        simulate(SimConfig(fault_types=("gpu_on_fire",)))


def test_scales_to_ten_thousand_gpus() -> None:
    run = simulate(SimConfig(nodes=1250, gpus=8, minutes=1, seed=0))
    tick = next(iter(run.ticks()))
    assert run.topology.gpu_count() == 10_000
    assert tick.frames[0].values.shape == (10_000, len(M.GPU_METRICS))
    assert len({n.switch for n in run.topology.nodes}) >= 300


def test_write_and_load_round_trip(tmp_path: Path) -> None:
    run = simulate(SimConfig(nodes=4, minutes=20, seed=5, faults_per_node_hour=1.5))
    summary = write_sim(run, tmp_path)
    files = load_sim(tmp_path)
    assert files.topology == run.topology
    assert [g.fault_type for g in files.ground_truth] == [g.fault_type for g in run.ground_truth]
    assert len(files.events) == summary["events"]
    frames = list(files.frames("gpu"))
    assert len(frames) == run.n_ticks
    np.testing.assert_array_equal(frames[-1].values, list(run.ticks())[-1].frames[0].values)
    assert sum(1 for _ in files.logs()) == len(run.logs)


def test_load_rejects_a_corrupt_directory(tmp_path: Path) -> None:
    with pytest.raises(VigilInputError, match="no topology.json"):
        load_sim(tmp_path)
    run = simulate(SimConfig(nodes=2, minutes=10, seed=0))
    write_sim(run, tmp_path)
    (tmp_path / "events.jsonl").write_text('{"ts": "soon"}\n')
    with pytest.raises(VigilInputError, match="events.jsonl:1"):
        load_sim(tmp_path)


def test_an_application_error_is_injected_only_when_named() -> None:
    """The job's own exception is not in the default mix (seeded runs stay as they were); named, its rank writes
    the traceback and the job crashes."""
    run = simulate(SimConfig(nodes=4, minutes=30, seed=4, fault_types=("application_error",),
                             faults_per_node_hour=1.0))
    assert {g.fault_type for g in run.ground_truth} == {"application_error"}
    raised = [r for r in run.logs if r.line.startswith("ValueError: ")]
    assert raised and {r.entity for r in raised} <= {g.entity for g in run.ground_truth}
    default = simulate(SimConfig(nodes=16, minutes=240, seed=4, faults_per_node_hour=2.0))
    assert "application_error" not in {g.fault_type for g in default.ground_truth}
