"""Model inputs of the learned GPU detector, computed the same way for training and live detection.

``GpuFeaturizer`` turns one ``gpu`` metric frame and the events since the previous one into (GPUs x features)
inputs and (GPUs x context) temporal-context features. The offline training set (``vigil_eval.simdata``) and
the streaming detector (``vigil.detect.stream``) both use it, so what the model sees live is what it was
trained on.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vigil.knowledge.metrics import is_counter
from vigil.knowledge.xid import xid_codes_of
from vigil.model import Event, Topology
from vigil.store.metrics import MetricFrame

# Context features group Xid codes by the fault the Xid table gives them.
XID_FAMILY_FAULTS: dict[str, tuple[str, ...]] = {
    "application": ("gpu_app_error",),
    "ecc": ("gpu_dbe", "gpu_row_remap_failure", "gpu_sbe_storm"),
    "engine": ("gpu_xid",),
    "lost": ("gpu_lost",),
    "gsp": ("gpu_gsp_timeout",),
    "nvlink": ("nvlink_error",),
}
XID_FAMILIES: dict[str, tuple[int, ...]] = {
    name: tuple(sorted(code for fault in faults for code in xid_codes_of(fault)))
    for name, faults in XID_FAMILY_FAULTS.items()
}
CONTEXT_FEATURES = ("log_min_since_job_start", "log_min_since_checkpoint", "job_down",
                    *(f"log_min_since_xid_{name}" for name in (*XID_FAMILIES, "other")))
NEVER_S = 86400.0
# The input that says how much of a GPU's row was missing (appended after the metrics).
MISSING_FEATURE = "vigil_missing_ratio"

class GpuFeaturizer:
    """Turns one ``gpu`` frame and the events since the last one into model inputs, tick by tick.

    The same object builds the offline training set (``gpu_cube``) and feeds the streaming detector
    (vigil.detect.stream), so what the model sees live is computed exactly as in training.
    """

    def __init__(self, topology: Topology) -> None:
        self.family_of = {code: k for k, codes in enumerate(XID_FAMILIES.values()) for code in codes}
        self.gpus: list[str] = []
        self.metrics: list[str] = []
        self.features: list[str] = []
        self._last: dict[str, dict[str, float]] = {"start": {}, "checkpoint": {}, "crash": {}}
        self._xid_last: np.ndarray = np.zeros((0, len(XID_FAMILIES) + 1))
        self._prev_ts: float | None = None
        self._prev_raw: np.ndarray | None = None
        self._filled: np.ndarray | None = None
        self._jobs: list[str | None] = []
        self.set_topology(topology)

    def set_topology(self, topology: Topology) -> None:
        """Which job each GPU runs (a job started or moved); what was seen so far stays."""
        self.job_of_gpu = {gpu: job.entity for job in topology.jobs for gpu in job.placement}
        self._jobs = [self.job_of_gpu.get(g) for g in self.gpus]

    def _bind(self, frame: MetricFrame) -> None:
        self.gpus, self.metrics = list(frame.entities), list(frame.metrics)
        self._gpu_pos = {g: i for i, g in enumerate(self.gpus)}
        self._counters = np.array([is_counter(m) for m in self.metrics])
        self.features = [f"rate({m})" if is_counter(m) else m for m in self.metrics] + [MISSING_FEATURE]
        self._xid_last = np.full((len(self.gpus), len(XID_FAMILIES) + 1), -np.inf)
        self._jobs = [self.job_of_gpu.get(g) for g in self.gpus]

    def push(self, frame: MetricFrame, events: Sequence[Event]) -> tuple[np.ndarray, np.ndarray]:
        """(GPUs x features) inputs and (GPUs x context) features at ``frame.ts``."""
        if list(frame.entities) != self.gpus or list(frame.metrics) != self.metrics:
            self._bind(frame)
            self._prev_ts = self._prev_raw = self._filled = None
        for ev in events:
            reason = str(ev.attrs.get("reason"))
            if ev.kind == "job":
                key = {"started": "start", "restarted": "start", "checkpoint_end": "checkpoint",
                       "crashed": "crash"}.get(reason)
                if key is not None:
                    self._last[key][ev.entity] = max(ev.ts, self._last[key].get(ev.entity, -np.inf))
            elif ev.kind == "xid" and ev.entity in self._gpu_pos:
                family = self.family_of.get(int(ev.attrs.get("xid", 0)), len(XID_FAMILIES))
                row = self._gpu_pos[ev.entity]
                self._xid_last[row, family] = max(self._xid_last[row, family], ev.ts)
        raw = np.asarray(frame.values, dtype=np.float64)
        missing = ~np.isfinite(raw)
        # A missing value keeps the last one seen; never seen is 0 (the GPU was absent from the start).
        filled = np.where(missing, self._filled if self._filled is not None else 0.0, raw)
        values = filled.copy()
        if self._prev_raw is not None and self._prev_ts is not None and frame.ts > self._prev_ts:
            rate = (filled[:, self._counters] - self._prev_raw[:, self._counters]) / (frame.ts - self._prev_ts)
        else:
            rate = np.zeros((len(self.gpus), int(self._counters.sum())))
        values[:, self._counters] = np.log1p(np.maximum(rate, 0.0))
        self._prev_ts, self._prev_raw, self._filled = frame.ts, filled, filled
        inputs = np.concatenate([values, missing.mean(axis=1, keepdims=True)], axis=1).astype(np.float32)
        return inputs, self._context(frame.ts)

    def _since(self, ts: float, last: np.ndarray) -> np.ndarray:
        return np.log1p(np.minimum(ts - last, NEVER_S) / 60.0)

    def _context(self, ts: float) -> np.ndarray:
        context = np.zeros((len(self.gpus), len(CONTEXT_FEATURES)), dtype=np.float32)
        for key, column in (("start", 0), ("checkpoint", 1)):
            last = np.array([self._last[key].get(j, -np.inf) if j else -np.inf for j in self._jobs])
            context[:, column] = self._since(ts, last)
        started = np.array([self._last["start"].get(j, -np.inf) if j else -np.inf for j in self._jobs])
        crashed = np.array([self._last["crash"].get(j, -np.inf) if j else -np.inf for j in self._jobs])
        context[:, 2] = crashed > started
        context[:, 3:] = self._since(ts, self._xid_last)
        return context
