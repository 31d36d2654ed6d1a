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
