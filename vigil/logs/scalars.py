"""Online checks on training scalars (TensorBoard event files): NaN / Inf, loss spikes, stalls and
vanishing gradients.

:class:`ScalarMonitor` takes points one at a time (``update``), so it can follow a live run; its state is
a bounded window per tag. ``check_event_dir`` replays the event files of a run directory through it.

- non-finite: any NaN / Inf value of any tag (``nan_loss``).
- loss spike: a loss value more than ``spike_z`` robust deviations (median absolute deviation over the
  last ``window`` points) above the window's median, and at least ``spike_ratio`` times it.
- stall: the wall-clock gap between two points of a tag is over ``stall_factor`` times the median gap
  and over ``stall_min_s`` (``job_hang``); ``stalled(now)`` checks a live run for silence.
- vanishing gradient: a gradient-norm tag averaging under ``vanishing_below`` over a full window.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel

from vigil.model import FaultLevel, VigilInputError

LOSS_TAG = re.compile(r"(?i)(^|[/_.])loss($|[/_.])")
GRAD_NORM_TAG = re.compile(r"(?i)grad(ient)?[_/.]?norm")


class ScalarFinding(BaseModel):
    tag: str
    step: int
    wall_time: float
    fault_type: str
    level: FaultLevel
    value: float
    detail: str


@dataclass
class _Series:
    values: deque[float]
    gaps: deque[float]
    last_wall: float | None = None


@dataclass
class ScalarMonitor:
    window: int = 50
    spike_z: float = 8.0
    spike_ratio: float = 1.5
    stall_factor: float = 10.0
    stall_min_s: float = 120.0
    vanishing_below: float = 0.01
    _series: dict[str, _Series] = field(default_factory=dict, repr=False)

    @property
    def tags(self) -> list[str]:
        """The scalar tags seen so far."""
        return sorted(self._series)

    def update(self, tag: str, step: int, wall_time: float, value: float) -> list[ScalarFinding]:
        """Take one point; return what is wrong with it (usually nothing)."""
        series = self._series.setdefault(tag, _Series(deque(maxlen=self.window), deque(maxlen=self.window)))
        found: list[ScalarFinding] = []
        if series.last_wall is not None:
            gap = wall_time - series.last_wall
            if len(series.gaps) >= 5:
                typical = statistics.median(series.gaps)
                if gap > self.stall_min_s and gap > self.stall_factor * max(typical, 1e-3):
                    found.append(self._finding(tag, step, wall_time, value, "job_hang", FaultLevel.OBSERVE,
                                               f"{gap:.0f} s since the previous point (typical {typical:.1f} s)"))
            series.gaps.append(max(gap, 0.0))
        series.last_wall = wall_time
        if not math.isfinite(value):
            found.append(self._finding(tag, step, wall_time, value, "nan_loss", FaultLevel.OBSERVE,
                                       f"{tag} is {value}"))
            return found  # a NaN must not poison the window
        if LOSS_TAG.search(tag) and len(series.values) >= 10:
            center = statistics.median(series.values)
            spread = statistics.median(abs(v - center) for v in series.values) * 1.4826
            if value > center + self.spike_z * max(spread, 1e-9) and value > self.spike_ratio * abs(center):
                found.append(self._finding(tag, step, wall_time, value, "loss_spike", FaultLevel.OBSERVE,
                                           f"{tag} {value:.4g} vs recent median {center:.4g}"))
        series.values.append(value)
        if (GRAD_NORM_TAG.search(tag) and len(series.values) == self.window
                and statistics.fmean(series.values) < self.vanishing_below):
            found.append(self._finding(tag, step, wall_time, value, "vanishing_gradient", FaultLevel.OBSERVE,
                                       f"{tag} mean {statistics.fmean(series.values):.2e} over {self.window} points"))
            series.values.clear()  # report once per window, not on every following point
        return found

    def stalled(self, now: float) -> list[str]:
        """Tags that have been silent for over ``stall_min_s`` and ``stall_factor`` typical gaps."""
        silent = []
        for tag, series in self._series.items():
            if series.last_wall is None or len(series.gaps) < 5:
                continue
            typical = statistics.median(series.gaps)
            quiet = now - series.last_wall
            if quiet > self.stall_min_s and quiet > self.stall_factor * max(typical, 1e-3):
                silent.append(tag)
        return silent

    @staticmethod
    def _finding(tag: str, step: int, wall: float, value: float, fault: str, level: FaultLevel,
                 detail: str) -> ScalarFinding:
        return ScalarFinding(tag=tag, step=step, wall_time=wall, fault_type=fault, level=level, value=value,
                             detail=detail)


def read_scalars(run_dir: Path) -> list[tuple[str, int, float, float]]:
    """(tag, step, wall_time, value) of every scalar in the run's event files, in file order."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    if not run_dir.exists():
        raise VigilInputError(f"TensorBoard run {run_dir} does not exist")
    files = sorted(run_dir.rglob("events.out.tfevents.*")) if run_dir.is_dir() else [run_dir]
    if not files:
        raise VigilInputError(f"TensorBoard run {run_dir} has no events.out.tfevents.* files")
    points = []
    for path in files:
        records = 0
        try:
            for event in EventFileLoader(str(path)).Load():
                records += 1
                for value in event.summary.value:
                    scalar = _scalar_of(value)
                    if scalar is not None:
                        points.append((value.tag, int(event.step), float(event.wall_time), scalar))
        except Exception as err:  # the loader raises several unrelated types on corrupt records
            raise VigilInputError(f"TensorBoard file {path} is corrupt: {type(err).__name__}: {err}") from None
        if records == 0 and path.stat().st_size > 0:
            # The loader stops quietly at a bad record; a real file always starts with a version record.
            raise VigilInputError(f"TensorBoard file {path} is corrupt: no readable record")
    return points


def _scalar_of(value: object) -> float | None:
    if value.HasField("simple_value"):  # type: ignore[attr-defined]
        return float(value.simple_value)  # type: ignore[attr-defined]
    if value.HasField("tensor"):  # type: ignore[attr-defined]
        tensor = value.tensor  # type: ignore[attr-defined]
        if tensor.float_val:
            return float(tensor.float_val[0])
        if tensor.double_val:
            return float(tensor.double_val[0])
    return None


def check_event_dir(run_dir: Path, monitor: ScalarMonitor | None = None) -> list[ScalarFinding]:
    """Replay a run's scalars through the checks, in wall-clock order."""
    monitor = monitor or ScalarMonitor()
    findings = []
    for tag, step, wall, value in sorted(read_scalars(run_dir), key=lambda p: (p[2], p[1])):
        findings.extend(monitor.update(tag, step, wall, value))
    return findings
