"""The tier policy: a YAML file mapping workloads (name globs) to the four tiers, each with GPU floor and
ceiling, grace period and preemption notice lead.

    interval: 5m
    inference: {requestsPerGpuS: 2.0, headroom: 0.2}
    tiers:
      - {tier: 1, name: online-inference, workloads: ["serve-*"], floorGpus: 16, ceilingGpus: 100000}
      - {tier: 2, name: high-priority-training, floorGpus: 200, ceilingGpus: 200}
      - {tier: 3, name: spot-training, gracePeriod: 5m, noticeLead: 15m}
      - {tier: 4, name: offline-inference, gracePeriod: 30s}

Tiers 1 and 2 are never preempted; 3 is preempted only after a notice; 4 at any moment.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from vigil.config import read_yaml
from vigil.model import VigilInputError, describe_validation_error
from vigil.remedy.jobspec import parse_duration

DEFAULT_TIERS = Path(__file__).with_name("default_tiers.yaml")
PREEMPTIBLE_TIERS = (3, 4)

Seconds = Annotated[float, BeforeValidator(parse_duration)]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class InferenceSizing(_Spec):
    """How forecast load becomes serving GPUs."""

    requests_per_gpu_s: float = Field(default=2.0, gt=0, alias="requestsPerGpuS")
    headroom: float = Field(default=0.2, ge=0, le=5)
    # kept off tier 3 above the forecast's envelope, for tier 4 to hand back at once when a burst comes
    burst_reserve: float = Field(default=0.3, ge=0, le=5, alias="burstReserve")

    def gpus_for(self, requests_per_s: float) -> int:
        """Serving GPUs that carry ``requests_per_s`` with the headroom kept free."""
        need = requests_per_s * (1.0 + self.headroom) / self.requests_per_gpu_s
        return int(-(-need // 1))


class Tier(_Spec):
    tier: int = Field(ge=1, le=4)
    name: str = Field(min_length=1)
    workloads: list[str] = Field(default_factory=list)
    floor_gpus: int = Field(default=0, ge=0, alias="floorGpus")
    ceiling_gpus: int = Field(default=100_000, ge=0, alias="ceilingGpus")
    grace_period_s: Seconds = Field(default=0.0, alias="gracePeriod")
    notice_lead_s: Seconds = Field(default=0.0, alias="noticeLead")
    # a preemptible tier gains and loses GPUs in whole blocks (a node, a job's size), so it does not churn
    block_gpus: int = Field(default=1, ge=1, alias="blockGpus")

    @property
    def preemptible(self) -> bool:
        return self.tier in PREEMPTIBLE_TIERS

    @model_validator(mode="after")
    def _bounds(self) -> Tier:
        if self.floor_gpus > self.ceiling_gpus:
            raise ValueError(f"tier {self.tier}: floorGpus {self.floor_gpus} above ceilingGpus {self.ceiling_gpus}")
        if self.tier == 3 and self.notice_lead_s < self.grace_period_s:
            # spot training checkpoints inside its grace period; the notice must leave it that long
            raise ValueError(f"tier 3: noticeLead {self.notice_lead_s:g}s shorter than gracePeriod")
        return self


class TierPolicy(_Spec):
    interval_s: Seconds = Field(default=300.0, alias="interval")
    inference: InferenceSizing = Field(default_factory=InferenceSizing)
    tiers: list[Tier]

    @model_validator(mode="after")
    def _four_tiers(self) -> TierPolicy:
        numbers = sorted(t.tier for t in self.tiers)
        if numbers != [1, 2, 3, 4]:
            raise ValueError(f"expected tiers 1, 2, 3 and 4 once each, got {numbers}")
        if self.interval_s <= 0:
            raise ValueError("interval must be positive")
        return self

    def tier(self, number: int) -> Tier:
        return next(t for t in self.tiers if t.tier == number)

    def tier_of(self, workload: str) -> int | None:
        """The tier whose workload globs match ``workload`` first (tier 1 tried first), or None."""
        for tier in sorted(self.tiers, key=lambda t: t.tier):
            if any(fnmatch.fnmatchcase(workload, pattern) for pattern in tier.workloads):
                return tier.tier
        return None

    def floors(self) -> int:
        return sum(t.floor_gpus for t in self.tiers)


def load_tier_policy(path: str | Path | None = None) -> TierPolicy:
    """The tier policy from ``path`` (the shipped default when None); a bad file is one VigilInputError line."""
    source = Path(path) if path is not None else DEFAULT_TIERS
    raw: Any = read_yaml(source, "tier policy")
    if not isinstance(raw, dict):
        raise VigilInputError(f"tier policy {source}: expected a mapping with interval, inference and tiers")
    try:
        return TierPolicy.model_validate(raw)
    except ValidationError as err:
        raise VigilInputError(f"tier policy {source}: {describe_validation_error(err)}") from None
