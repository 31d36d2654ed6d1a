from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from vigil.faces.cli.precheck import inspect_command, precheck_command
from vigil.model import VigilInputError
from vigil.precheck.baseline import Baselines, hardware_key, verdicts
from vigil.precheck.checks import CheckResult
from vigil.precheck.runner import CheckOptions, run_local

QUICK = CheckOptions(allreduce_mb=1.0, memcpy_mb=8.0, matmul_n=128, repeats=3)


def result(name: str, value: float, higher: bool = True) -> CheckResult:
    return CheckResult(name, value, "x", higher_is_better=higher)


def test_verdict_names_the_failing_check_per_machine() -> None:
    baseline = {"allreduce_busbw": 10.0, "allreduce_latency": 100.0, "matmul_gflops": 50.0}
    per_rank = [
        (
            "good-node",
            [result("allreduce_busbw", 9.0), result("allreduce_latency", 120.0, False), result("matmul_gflops", 48.0)],
        ),
        (
            "bad-node",
            [result("allreduce_busbw", 9.5), result("allreduce_latency", 400.0, False), result("matmul_gflops", 10.0)],
        ),
        (
            "bad-node",
            [result("allreduce_busbw", 9.5), result("allreduce_latency", 110.0, False), result("matmul_gflops", 49.0)],
        ),
        ("nvml-node", [CheckResult("nvml_health/gpu3", 1.0, "problems", False, "PCIe link x8 below x16")]),
    ]
    machines = {m.host: m for m in verdicts(per_rank, baseline, tolerance=0.5)}
    assert machines["good-node"].verdict == "good" and machines["good-node"].failing == []
    assert machines["bad-node"].verdict == "bad"
    assert machines["bad-node"].failing == ["allreduce_latency", "matmul_gflops"]
    assert machines["nvml-node"].failing == ["nvml_health/gpu3"]  # decided without a baseline


@pytest.mark.slow
def test_real_gloo_precheck_against_a_baseline(tmp_path: Path) -> None:
    per_rank = run_local(2, QUICK, node_names=["node-a", "node-b"])
    assert [host for host, _ in per_rank] == ["node-a", "node-b"]
    names = {r.name for r in per_rank[0][1]}
    assert {"allreduce_busbw", "allreduce_latency", "host_memcpy_bandwidth", "matmul_gflops"} <= names
    assert all(r.value and r.value > 0 for r in per_rank[0][1] if not r.skipped)
    d2h = next(r for r in per_rank[0][1] if r.name == "d2h_bandwidth")
    assert d2h.skipped and "no CUDA" in d2h.detail  # no GPU in CI: said, not faked

    baselines = Baselines(tmp_path / "baselines.json")
    baselines.record(hardware_key(2), [r for _, results in per_rank for r in results])
    baselines.save()
    stored = Baselines.load(tmp_path / "baselines.json").entries[hardware_key(2)]
    assert set(stored) == {"allreduce_busbw", "allreduce_latency", "host_memcpy_bandwidth", "matmul_gflops"}
    # A baseline far above this machine's matmul (a faster GPU type, say) fails exactly that check;
    # the others get a baseline far below what any run here measures.
    far = {name: value / 1000 for name, value in stored.items()}
    far["allreduce_latency"] = stored["allreduce_latency"] * 1000
    far["matmul_gflops"] = stored["matmul_gflops"] * 1000
    machines = verdicts(per_rank, far, tolerance=0.5)
    assert [(m.host, m.verdict, m.failing) for m in machines] == [
        ("node-a", "bad", ["matmul_gflops"]),
        ("node-b", "bad", ["matmul_gflops"]),
    ]


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("precheck")(precheck_command)
    app.command("inspect")(inspect_command)
    return app


@pytest.mark.slow
def test_cli_precheck_json_and_inspect_rounds(tmp_path: Path) -> None:
    runner = CliRunner()
    baseline = tmp_path / "b.json"
    recorded = runner.invoke(
        _app(),
        ["precheck", "--quick", "--record-baseline", "--baseline", str(baseline), "--tolerance", "0.99", "--json"],
    )
    machines = json.loads(recorded.stdout)
    assert recorded.exit_code == 0, recorded.output
    assert machines[0]["verdict"] == "good" and baseline.exists()
    rounds = tmp_path / "inspect.jsonl"
    inspected = runner.invoke(
        _app(),
        [
            "inspect",
            "--interval",
            "0.1",
            "--count",
            "1",
            "--quick",
            "--baseline",
            str(baseline),
            "--tolerance",
            "0.99",
            "--out",
            str(rounds),
        ],
    )
    assert inspected.exit_code == 0, inspected.output
    lines = [json.loads(line) for line in rounds.read_text().splitlines()]
    assert [line["round"] for line in lines] == [0]
    assert lines[0]["machines"][0]["checks"][0]["baseline"] is not None


def _measured(sick: bool = False) -> list[tuple[str, list[CheckResult]]]:
    nvml = CheckResult("nvml_health/gpu0", 1.0 if sick else 0.0, "problems", False, "ECC" if sick else "")
    return [("node-a", [result("matmul_gflops", 50.0), result("allreduce_latency", 100.0, False), nvml])]


def test_precheck_without_a_baseline_says_so_and_exits_3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No baseline: nothing to compare with, so neither good (0) nor bad (1), and the way to record one."""
    measured = _measured()
    monkeypatch.setattr("vigil.precheck.runner.run_local", lambda nproc, options: measured)
    runner = CliRunner()
    baseline = tmp_path / "b.json"
    unjudged = runner.invoke(_app(), ["precheck", "--baseline", str(baseline), "--json"])
    assert unjudged.exit_code == 3, unjudged.output
    assert [m["verdict"] for m in json.loads(unjudged.stdout)] == ["no baseline"]
    assert "vigil precheck --record-baseline" in " ".join(unjudged.stderr.split())
    human = runner.invoke(_app(), ["precheck", "--baseline", str(baseline)])
    assert human.exit_code == 3 and "no baseline" in human.stdout
    recorded = runner.invoke(_app(), ["precheck", "--baseline", str(baseline), "--record-baseline", "--json"])
    assert recorded.exit_code == 0 and json.loads(recorded.stdout)[0]["verdict"] == "good"
    assert runner.invoke(_app(), ["precheck", "--baseline", str(baseline)]).exit_code == 0
    # NVML health needs no baseline: a sick GPU is bad (1) with or without one
    measured[:] = _measured(sick=True)
    sick = runner.invoke(_app(), ["precheck", "--baseline", str(tmp_path / "none.json"), "--json"])
    assert sick.exit_code == 1 and json.loads(sick.stdout)[0]["failing"] == ["nvml_health/gpu0"]


def test_bad_input(tmp_path: Path) -> None:
    bad = tmp_path / "b.json"
    bad.write_text("{not json")
    with pytest.raises(VigilInputError, match="not valid JSON"):
        Baselines.load(bad)
    bad.write_text('{"k": {"matmul_gflops": "fast"}}')
    with pytest.raises(VigilInputError, match="expected"):
        Baselines.load(bad)
    with pytest.raises(VigilInputError, match="--nproc"):
        run_local(0)
    with pytest.raises(VigilInputError, match="cannot be read"):
        Baselines.load(tmp_path)  # a directory given as --baseline
    with pytest.raises(VigilInputError, match="cannot be written"):
        Baselines(tmp_path / "b.json" / "below-a-file.json").save()
    runner = CliRunner()
    assert runner.invoke(_app(), ["inspect", "--interval", "0"]).exit_code != 0


def test_bad_machines_become_anomalies_the_policies_act_on() -> None:
    from vigil.model import ActionKind, FaultLevel
    from vigil.remedy.policy import PolicyEngine, load_policies

    per_rank = [
        ("slow-node", [result("matmul_gflops", 10.0)]),
        ("sick-node", [CheckResult("nvml_health/gpu1", 1.0, "problems", False, "page retirement pending")]),
        ("fine-node", [result("matmul_gflops", 50.0)]),
    ]
    machines = {m.host: m for m in verdicts(per_rank, {"matmul_gflops": 50.0}, tolerance=0.5)}
    assert machines["fine-node"].to_anomaly(0.0) is None
    slow = machines["slow-node"].to_anomaly(1.0)
    sick = machines["sick-node"].to_anomaly(1.0)
    assert slow is not None and sick is not None
    assert (slow.entity, slow.fault_type, slow.level) == (
        "node/slow-node",
        "precheck:matmul_gflops",
        FaultLevel.DEGRADED,
    )
    assert "vs baseline 50" in slow.evidence[0].summary
    assert (sick.level, sick.fault_type) == (FaultLevel.DRAIN, "precheck:nvml_health/gpu1")
    engine = PolicyEngine(load_policies())
    assert [a.kind for a in engine.plan(sick)] == [ActionKind.CORDON, ActionKind.DRAIN]
    assert [a.kind for a in engine.plan(slow)] == [ActionKind.ALERT, ActionKind.RUN_DIAGNOSTICS]
