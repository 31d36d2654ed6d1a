"""The TrainingJob spec: what to run, how to checkpoint, and what to do when it fails.

apiVersion: vigil/v1
kind: TrainingJob
metadata: {name: tiny}
spec:
  replicas: 2
  command: [python, -m, vigil_eval.tinytrain, --steps, "40"]
  devices: [cpu:0, cpu:1, cpu:2]        # more devices than replicas = spares for failover
  checkpoint: {dir: ckpt, everySteps: 5, keepLast: 3}
  eval:                                 # optional: evaluate every complete checkpoint while the job runs
    command: [python, eval.py, "{checkpoint}"]
    maxParallel: 1
  failoverPolicy: {maxRetries: 3, action: restart, excludeFailedDevice: true}
  healthCheck:
    hangTimeout: 60s
    metrics:
      - {name: vanishing-gradient, metric: grad_norm, aggregation: avg, window: 5m,
         op: "<", threshold: 0.01, action: alert}
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from vigil.config import read_yaml
from vigil.model import ActionKind, VigilInputError, describe_validation_error
from vigil.sources.probe.records import DEFAULT_HANG_TIMEOUT_S

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: str | float | int) -> float:
    """``"5m"`` -> 300.0; plain numbers are seconds."""
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"duration must not be negative, got {value}")
        return float(value)
    match = _DURATION.match(str(value))
    if not match:
        raise ValueError(f"bad duration {value!r}: expected a number with unit ms, s, m, h or d (e.g. 5m)")
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2) or "s"]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


FAILOVER_ACTIONS: dict[str, ActionKind] = {
    "restart": ActionKind.RESTART_JOB,
    "migrate": ActionKind.MIGRATE_JOB,
    "alert": ActionKind.ALERT,
}


class FailoverPolicy(_Spec):
    max_retries: int = Field(default=3, ge=0, le=100, alias="maxRetries")
    action: Literal["restart", "migrate", "alert"] = "restart"
    # Restart the failed rank on a spare device rather than the one it failed on.
    exclude_failed_device: bool = Field(default=True, alias="excludeFailedDevice")

    @property
    def action_kind(self) -> ActionKind:
        return FAILOVER_ACTIONS[self.action]


class MetricCondition(_Spec):
    """Fires when ``aggregation(metric over the last window) op threshold`` holds."""

    name: str = Field(min_length=1, max_length=100)
    metric: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    aggregation: Literal["avg", "min", "max", "last"] = "avg"
    window_s: float = Field(default=300.0, alias="window")
    op: Literal["<", "<=", ">", ">=", "=="] = "<"
    threshold: float
    min_samples: int = Field(default=3, ge=1, alias="minSamples")
    action: Literal["restart", "migrate", "alert"] = "alert"

    _window = field_validator("window_s", mode="before")(lambda v: parse_duration(v))

    def holds(self, values: list[float]) -> bool:
        if len(values) < self.min_samples:
            return False
        if self.aggregation == "avg":
            observed = sum(values) / len(values)
        elif self.aggregation == "min":
            observed = min(values)
        elif self.aggregation == "max":
            observed = max(values)
        else:
            observed = values[-1]
        return {
            "<": observed < self.threshold,
            "<=": observed <= self.threshold,
            ">": observed > self.threshold,
            ">=": observed >= self.threshold,
            "==": observed == self.threshold,
        }[self.op]


class HealthCheck(_Spec):
    hang_timeout_s: float = Field(default=DEFAULT_HANG_TIMEOUT_S, alias="hangTimeout")
    metrics: list[MetricCondition] = Field(default_factory=list)

    _hang = field_validator("hang_timeout_s", mode="before")(lambda v: parse_duration(v))


class CheckpointSpec(_Spec):
    dir: str = "checkpoints"
    every_steps: int = Field(default=10, ge=1, alias="everySteps")
    keep_last: int = Field(default=3, ge=1, alias="keepLast")


class EvalSpec(_Spec):
    """Evaluate every complete checkpoint while the job runs (``vigil checkpoint watch`` on its directory):
    asynchronously, each exactly once across restarts, a failure an incident."""

    command: list[str] = Field(min_length=1)  # {checkpoint} and {step} are filled in; python is Vigil's own
    max_parallel: int = Field(default=1, ge=1, le=64, alias="maxParallel")
    devices: list[str] = Field(default_factory=list)  # CUDA devices, one evaluation per device
    retries: int = Field(default=1, ge=0, le=10)
    timeout_s: float | None = Field(default=None, gt=0, alias="timeout")
    logdir: str | None = None  # TensorBoard scalars go to <logdir>/eval; relative paths are under the run dir
    interval_s: float = Field(default=2.0, gt=0, le=3600, alias="interval")

    _durations = field_validator("timeout_s", "interval_s", mode="before")(
        lambda v: None if v is None else parse_duration(v)
    )


class PrecheckSpec(_Spec):
    """PreCheck before the first start: a bad machine keeps the job from starting at all."""

    enabled: bool = False
    baseline: str | None = None  # baseline file; default <home>/precheck-baselines.json
    tolerance: float = Field(default=0.5, ge=0.0, lt=1.0)


class Metadata(_Spec):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$", max_length=100)
    labels: dict[str, str] = Field(default_factory=dict)


class TrainingJobBody(_Spec):
    replicas: int = Field(ge=1, le=1024)
    command: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    devices: list[str] = Field(default_factory=list)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    eval: EvalSpec | None = None
    failover_policy: FailoverPolicy = Field(default_factory=FailoverPolicy, alias="failoverPolicy")
    health_check: HealthCheck = Field(default_factory=HealthCheck, alias="healthCheck")
    precheck: PrecheckSpec = Field(default_factory=PrecheckSpec)

    @model_validator(mode="after")
    def _enough_devices(self) -> TrainingJobBody:
        if self.devices and len(self.devices) < self.replicas:
            raise ValueError(f"{len(self.devices)} devices listed for {self.replicas} replicas")
        if len(set(self.devices)) != len(self.devices):
            raise ValueError("devices must be distinct")
        return self

    def initial_devices(self) -> list[str]:
        """Device of each rank; without a list, rank r gets ``local:<r>``."""
        if self.devices:
            return self.devices[: self.replicas]
        return [f"local:{r}" for r in range(self.replicas)]

    def spare_devices(self) -> list[str]:
        return self.devices[self.replicas :]


class TrainingJob(_Spec):
    api_version: Literal["vigil/v1"] = Field(default="vigil/v1", alias="apiVersion")
    kind: Literal["TrainingJob"] = "TrainingJob"
    metadata: Metadata
    spec: TrainingJobBody

    @property
    def name(self) -> str:
        return self.metadata.name

    @classmethod
    def from_dict(cls, data: Any, source: str = "job spec") -> TrainingJob:
        if not isinstance(data, dict):
            raise VigilInputError(f"{source}: expected a TrainingJob mapping at the top level")
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            raise VigilInputError(f"{source}: {describe_validation_error(err)}") from None


def load_jobspec(path: str | Path) -> TrainingJob:
    path = Path(path)
    return TrainingJob.from_dict(read_yaml(path, "job spec"), source=f"job spec {path}")
