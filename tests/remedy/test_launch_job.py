"""`vigil launch job job.yaml` through the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vigil.faces.cli.main import app

JOB = """
apiVersion: vigil/v1
kind: TrainingJob
metadata: {name: cli-job}
spec:
  replicas: 2
  command: [python, -m, vigil_eval.tinytrain, --steps, "16"]
  env: {VIGIL_INJECT_FAULT: "kill:rank=0:step=9"}
  checkpoint: {dir: ckpt, everySteps: 4}
  failoverPolicy: {maxRetries: 1, action: restart}
  healthCheck: {hangTimeout: 20s}
"""


@pytest.mark.slow
def test_launch_job_restarts_per_failover_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VIGIL_DB_URL", f"sqlite:///{tmp_path}/vigil.db")
    from vigil.config import settings

    settings.cache_clear()
    spec = tmp_path / "job.yaml"
    spec.write_text(JOB)
    result = CliRunner().invoke(app, ["launch", "job", str(spec), "--out", str(tmp_path / "run"), "--json"])
    settings.cache_clear()
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["succeeded"] and report["attempts"] == 2
    assert report["anomalies"][0]["fault_type"] == "rank_exit"
    assert report["actions"][0]["kind"] == "restart_job" and report["actions"][0]["status"] == "executed"
    assert (tmp_path / "run" / "ckpt").is_dir() and (tmp_path / "run" / "result.json").exists()


def test_launch_job_bad_spec_is_a_clear_error(tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("metadata: {name: x}\nspec: {replicas: 0, command: [a]}")
    result = CliRunner().invoke(app, ["launch", "job", str(spec)])
    assert result.exit_code != 0
    assert "replicas" in str(result.exception)


EVAL_JOB = Path(__file__).resolve().parents[1] / "checkpoint" / "eval_job.py"


@pytest.mark.slow
def test_launch_job_with_eval_evaluates_every_checkpoint_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The spec's eval field: the watcher runs beside the job, across its restart, and drains at the end."""
    from collections import Counter

    from vigil.checkpoint.manager import complete_steps

    monkeypatch.setenv("VIGIL_DB_URL", f"sqlite:///{tmp_path}/vigil.db")
    monkeypatch.setenv("EVAL_LOG", str(tmp_path / "evals.log"))
    from vigil.config import settings

    settings.cache_clear()
    spec = tmp_path / "job.yaml"
    spec.write_text(
        JOB.replace("checkpoint: {dir: ckpt, everySteps: 4}", "checkpoint: {dir: ckpt, everySteps: 4, keepLast: 100}")
        + f'  eval: {{command: [python, "{EVAL_JOB}", "{{checkpoint}}"], interval: 0.2, logdir: tb}}\n'
    )
    result = CliRunner().invoke(app, ["launch", "job", str(spec), "--out", str(tmp_path / "run"), "--json"])
    settings.cache_clear()
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["succeeded"] and report["attempts"] == 2  # the kill at step 9 restarted the job
    steps = complete_steps(tmp_path / "run" / "ckpt")
    assert steps == [4, 8, 12, 16]
    evaluations = {e["step"]: e for e in report["evaluations"]}
    assert sorted(evaluations) == steps and all(e["state"] == "done" for e in evaluations.values())
    runs = Counter(int(line) for line in (tmp_path / "evals.log").read_text().split())
    assert runs == Counter(steps)  # each checkpoint evaluated exactly once, none missed
    losses = [evaluations[s]["metrics"]["loss"] for s in steps]
    assert losses[-1] < losses[0]  # a real evaluation of a training job: the held-out loss fell
    assert any((tmp_path / "run" / "tb" / "eval").iterdir())  # the scalars, as TensorBoard reads them


def test_eval_field_is_checked_with_the_spec(tmp_path: Path) -> None:
    from vigil.model import VigilInputError
    from vigil.remedy.jobspec import load_jobspec

    spec = tmp_path / "job.yaml"
    for bad, field in (("{command: []}", "command"), ("{command: [x], maxParallel: 0}", "maxParallel"),
                       ("{command: [x], timeout: 0}", "timeout"), ("{command: [x], surprise: 1}", "surprise")):
        spec.write_text(JOB + f"  eval: {bad}\n")
        with pytest.raises(VigilInputError, match=field):
            load_jobspec(spec)
    spec.write_text(JOB + "  eval: {command: [python, e.py, '{checkpoint}'], timeout: 5m}\n")
    assert load_jobspec(spec).spec.eval.timeout_s == 300.0  # type: ignore[union-attr]
