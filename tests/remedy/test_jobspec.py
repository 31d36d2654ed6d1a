from __future__ import annotations

from pathlib import Path

import pytest

from vigil.model import ActionKind, VigilInputError
from vigil.remedy.jobspec import load_jobspec, parse_duration

GOOD = """
apiVersion: vigil/v1
kind: TrainingJob
metadata: {name: llama-8b}
spec:
  replicas: 2
  command: [python, train.py]
  devices: [cpu:0, cpu:1, cpu:2]
  checkpoint: {dir: /ckpt, everySteps: 100, keepLast: 5}
  failoverPolicy: {maxRetries: 5, action: migrate}
  healthCheck:
    hangTimeout: 2m
    metrics:
      - {name: vanishing-gradient, metric: grad_norm, aggregation: avg, window: 5m, op: "<", threshold: 0.01}
"""


def test_full_spec_parses(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(GOOD)
    job = load_jobspec(path)
    assert job.name == "llama-8b"
    assert job.spec.failover_policy.action_kind is ActionKind.MIGRATE_JOB
    assert job.spec.failover_policy.max_retries == 5
    assert job.spec.health_check.hang_timeout_s == 120.0
    condition = job.spec.health_check.metrics[0]
    assert condition.window_s == 300.0
    assert condition.holds([0.001, 0.002, 0.003]) and not condition.holds([0.5, 0.001, 0.001])
    assert not condition.holds([0.001])  # too few samples to judge
    assert job.spec.initial_devices() == ["cpu:0", "cpu:1"] and job.spec.spare_devices() == ["cpu:2"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("metadata: {name: x}\nspec: {replicas: 0, command: [a]}", "replicas"),
        ("metadata: {name: x}\nspec: {replicas: 1, command: []}", "command"),
        ("metadata: {name: 'bad name'}\nspec: {replicas: 1, command: [a]}", "metadata.name"),
        ("metadata: {name: x}\nspec: {replicas: 1, command: [a], failoverPolicy: {action: pray}}", "action"),
        ("metadata: {name: x}\nspec: {replicas: 3, command: [a], devices: [d0, d1]}", "2 devices listed for 3"),
        ("metadata: {name: x}\nspec: {replicas: 1, command: [a], healthCheck: {hangTimeout: -1}}", "negative"),
        ("kind: Deployment\nmetadata: {name: x}\nspec: {replicas: 1, command: [a]}", "kind"),
        ("[1, 2]", "expected a TrainingJob mapping"),
        ("metadata: {name: x", "not valid YAML"),
    ],
)
def test_bad_specs_get_one_line_errors(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(body)
    with pytest.raises(VigilInputError, match=message) as err:
        load_jobspec(path)
    assert "\n" not in str(err.value)


def test_durations() -> None:
    assert parse_duration("5m") == 300 and parse_duration("250ms") == 0.25 and parse_duration(7) == 7.0
    with pytest.raises(ValueError, match="bad duration"):
        parse_duration("five minutes")
    with pytest.raises(VigilInputError, match="does not exist"):
        load_jobspec("/no/such/job.yaml")
