"""The metric catalogue: every DCGM_* / vigil_* name with its family, Prometheus type, unit and help.

Counter-vs-gauge is a property of the metric, declared once in ``data/metrics.yaml``; detectors (rates of
counters), exporters (``# TYPE`` lines) and the simulator read it from here.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

from pydantic import BaseModel, ConfigDict

from vigil.knowledge.files import data_dir, read_data
from vigil.model import VigilInputError

MetricType = Literal["counter", "gauge", "info"]
# Entity families whose series are frames of the metric store (one row per entity).
ENTITY_FAMILIES = ("gpu", "node", "nic", "job")


class MetricSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    family: Literal["gpu", "node", "nic", "job", "agent", "server"]
    type: MetricType
    unit: str
    help: str

    @property
    def counter(self) -> bool:
        return self.type == "counter"


class MetricCatalogue(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int
    metrics: dict[str, MetricSpec]


@lru_cache(maxsize=1)
def metric_catalogue() -> dict[str, MetricSpec]:
    return read_data(data_dir() / "metrics.yaml", MetricCatalogue, "metric catalogue").metrics


def metric_spec(name: str) -> MetricSpec:
    spec = metric_catalogue().get(name)
    if spec is None:
        raise VigilInputError(f"metric {name!r} is not in the metric catalogue (vigil/knowledge/data/metrics.yaml)")
    return spec


def is_counter(name: str) -> bool:
    """True for cumulative metrics; a name outside the catalogue is read as a gauge (its raw value)."""
    spec = metric_catalogue().get(name)
    return spec is not None and spec.counter


def family_metrics(family: str) -> tuple[str, ...]:
    """Every catalogued metric of one family, in catalogue order."""
    return tuple(name for name, spec in metric_catalogue().items() if spec.family == family)
