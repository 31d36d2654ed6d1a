"""The RCA stress evaluation: cases the knowledge base was not written for, development and held-out apart."""

from __future__ import annotations

from pathlib import Path

import pytest

from vigil.knowledge.xid import xid_info
from vigil.model import VigilInputError
from vigil_eval.rca_stress import (
    SIM_XIDS,
    SUBSETS,
    StressCase,
    _prepare,
    build_stress_cases,
    run_stress_case,
    xid_families,
)
from vigil_eval.realcorpus import load_cases


def test_families_come_from_the_vendor_catalogue(shared_data: Path) -> None:
    families = xid_families(shared_data / "xid" / "xid_catalog.csv")
    assert set(families["gpu_dbe"]) == {48, 94, 95, 140}
    assert set(families["gpu_gsp_timeout"]) == {119, 120}
    assert {74, 136, 144, 150}.issubset(families["nvlink_error"])
    # codes the catalogue blames on the application are in no family
    assert not {13, 31, 43, 45}.intersection(*families.values())
    for fault, sim_codes in SIM_XIDS.items():
        assert set(families[fault]) - set(sim_codes), f"{fault} has no sibling code to rewrite to"


def test_cases_are_deterministic_and_splits_use_their_own_real_logs(shared_data: Path) -> None:
    dev = build_stress_cases(3, "development")
    assert [c.plans for c in dev] == [c.plans for c in build_stress_cases(3, "development")]
    held = build_stress_cases(3, "held_out")
    assert {c.subset for c in dev} == set(SUBSETS) == {c.subset for c in held}
    assert [c.plans for c in dev] != [c.plans for c in held]
    split = {c.id: c.split for c in load_cases()}
    assert {split[c.real_log] for c in dev if c.real_log} == {"development"}
    assert {split[c.real_log] for c in held if c.real_log} == {"held_out"}
    for case in dev:
        if case.subset.startswith("concurrent"):
            assert case.truths == (0, 1) and case.plans[0].entity != case.plans[1].entity
    with pytest.raises(VigilInputError):
        build_stress_cases(0, "development")


def _case(subset: str) -> StressCase:
    return next(c for c in build_stress_cases(2, "development") if c.subset == subset)


def test_each_subset_changes_what_it_says(shared_data: Path) -> None:
    swap = _case("xid_family")
    run, _ = _prepare(swap, {})
    old, new = swap.xid_swap or (0, 0)
    kernel = "\n".join(r.line for r in run.logs if r.source == "kernel")
    assert f"): {new}," in kernel and (old == 0 or f"): {old}," not in kernel)
    assert xid_info(new).known

    run, _ = _prepare(_case("missing_kernel"), {})
    assert not [r for r in run.logs if r.source == "kernel"]
    run, _ = _prepare(_case("missing_dcgm"), {})
    assert all(f.family != "gpu" for tick in run.ticks() for f in tick.frames)
    noisy = _case("noisy_node")
    run, _ = _prepare(noisy, {})
    lines = [r.line for r in run.logs if r.source == "kernel"]
    assert any("Link up" in line for line in lines) and any("Machine check events logged" in line for line in lines)

    real = _case("real_text")
    run, _ = _prepare(real, {})
    source = next(c for c in load_cases() if c.id == real.real_log)
    root = (source.directory / source.root_file).read_text(encoding="utf-8").splitlines()[source.root_line - 1]
    root_words = root.split()[-3:]
    assert any(" ".join(root_words) in r.line for r in run.logs)


def test_a_concurrent_case_scores_both_faults(shared_data: Path) -> None:
    case = _case("concurrent_node")
    result = run_stress_case(case)
    assert [(t.entity, t.fault_type) for t in result.truths] == [(p.entity, p.fault_type) for p in case.plans]
    assert all(t.detected for t in result.truths)
    assert all(t.rank is None or 1 <= t.rank <= 10 for t in result.truths)
