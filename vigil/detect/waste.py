"""GPU waste: allocated GPUs against the GPUs really used, per job and per machine.

A GPU is *allocated* when a job's placement holds it. How much of it is *used* at one scrape is its
activity: DCGM's graphics-engine-active ratio when the exporter profiles (``DCGM_FI_PROF_GR_ENGINE_ACTIVE``,
the better measure: a kernel that occupies one SM counts fully in ``GPU_UTIL``), else ``DCGM_FI_DEV_GPU_UTIL``
/ 100. The waste rate over a window is one minus the mean activity of the allocated GPUs. A GPU is *idle*
when its activity stayed below ``idle_activity`` for the whole window and it holds less than ``idle_memory_mib``
of memory: nothing is running there, so the allocation can be given back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from vigil.model import Topology, VigilInputError, parse_entity
from vigil.store.metrics import MetricStore

ACTIVITY_METRICS = ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_GPU_UTIL")
MEMORY_METRIC = "DCGM_FI_DEV_FB_USED"


@dataclass(frozen=True)
class GpuUse:
    gpu: str
    job: str | None
    mean_activity: float | None  # None: no samples in the window
    max_activity: float | None
    memory_mib: float | None
    idle: bool


@dataclass(frozen=True)
class WasteRow:
    """One job's or node's allocated GPUs, how many had samples, their mean activity, and the idle ones."""

    name: str
    allocated_gpus: int
    measured_gpus: int
    mean_activity: float | None
    waste_rate: float | None
    idle_gpus: list[str]


@dataclass
class WasteReport:
    """Waste per job and per node over [start, end]; ``gpus`` holds every allocated GPU's figures."""

    start: float
    end: float
    gpus: list[GpuUse] = field(default_factory=list)

    def _rows(self, key: str) -> dict[str, list[GpuUse]]:
        groups: dict[str, list[GpuUse]] = {}
        for use in self.gpus:
            name = use.job if key == "job" else parse_entity(use.gpu)[1][0]
            if name is not None:
                groups.setdefault(name, []).append(use)
        return groups

    def summary(self, key: str) -> list[WasteRow]:
        """One row per job (``key="job"``) or node (``key="node"``), most wasteful first."""
        rows = []
        for name, uses in self._rows(key).items():
            measured = [u.mean_activity for u in uses if u.mean_activity is not None]
            mean = float(np.mean(measured)) if measured else None
            idle = [u.gpu for u in uses if u.idle]
            rows.append(WasteRow(name, len(uses), len(measured), mean, None if mean is None else 1.0 - mean, idle))
        return sorted(rows, key=lambda r: (-(r.waste_rate or 0.0), r.name))


def gpu_waste(
    metrics: MetricStore,
    topology: Topology,
    start: float,
    end: float,
    idle_activity: float = 0.05,
    idle_memory_mib: float = 1024.0,
) -> WasteReport:
    """Allocated vs used for every GPU a job holds, from the stored dcgm metrics in [start, end]."""
    if not end > start:
        raise VigilInputError(f"the window must end after it starts (start {start}, end {end})")
    report = WasteReport(start, end)
    for job in topology.jobs:
        for gpu in dict.fromkeys(job.placement):
            report.gpus.append(_use(metrics, gpu, job.id, start, end, idle_activity, idle_memory_mib))
    return report


def _activity(metrics: MetricStore, gpu: str, start: float, end: float) -> np.ndarray | None:
    family = metrics.family_of(gpu)
    if family is None:
        return None
    names = metrics.metrics(family)
    for metric in ACTIVITY_METRICS:
        if metric in names:
            _, values = metrics.series(gpu, metric, start, end)
            values = values[np.isfinite(values)].astype(np.float64)
            if len(values):
                return values / 100.0 if metric == "DCGM_FI_DEV_GPU_UTIL" else values
    return None


def _use(
    metrics: MetricStore,
    gpu: str,
    job: str | None,
    start: float,
    end: float,
    idle_activity: float,
    idle_memory_mib: float,
) -> GpuUse:
    activity = _activity(metrics, gpu, start, end)
    memory = None
    family = metrics.family_of(gpu)
    if family is not None and MEMORY_METRIC in metrics.metrics(family):
        _, used = metrics.series(gpu, MEMORY_METRIC, start, end)
        used = used[np.isfinite(used)]
        memory = float(used.max()) if len(used) else None
    if activity is None:
        return GpuUse(gpu, job, None, None, memory, idle=False)
    idle = float(activity.max()) < idle_activity and (memory is None or memory < idle_memory_mib)
    return GpuUse(gpu, job, float(activity.mean()), float(activity.max()), memory, idle)


def window_of(metrics: MetricStore, families: Sequence[str] = ("gpu",)) -> tuple[float, float] | None:
    """The stored time span of the GPU metrics (first, last scrape), or None when nothing is stored."""
    spans = []
    for family in families:
        if family in metrics.families():
            ts, _ = metrics.window(family, metrics.frame_count(family))
            if len(ts):
                spans.append((float(ts.min()), float(ts.max())))
    if not spans:
        return None
    return min(s for s, _ in spans), max(e for _, e in spans)
