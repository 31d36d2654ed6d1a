"""A trained TCE model as a StreamDetector: the pipeline (and ``vigil demo``) runs it beside the rules.

Per tick the adapter turns the ``gpu`` frame and the new events into model inputs with the same
``GpuFeaturizer`` that built the training set, appends them to a ring buffer of the last ``history`` ticks per
GPU, scores every GPU's window in one batch, and opens an ``Anomaly`` for a GPU whose most likely class is a
fault with probability >= ``min_probability``. An anomaly stays open while the model keeps naming the same
fault and closes after ``hold_s`` seconds without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from vigil.detect.base import StreamDetector
from vigil.detect.learned.gpu_features import MISSING_FEATURE, GpuFeaturizer
from vigil.knowledge.faults import fault_level
from vigil.model import Anomaly, Event, Evidence, FaultLevel, Topology, VigilInputError
from vigil.store.metrics import MetricFrame

if TYPE_CHECKING:
    # torch is imported only once a trained model is loaded, so the demo runs without the [learn] extra
    from vigil.detect.learned.tce import TCEDetector


def _fault_level(fault_type: str) -> FaultLevel:
    """The fault catalogue's level; a class the catalogue does not hold (a model trained on other labels)
    is reported as degraded: worth a look, never a drain on the model's word alone."""
    try:
        return fault_level(fault_type)
    except VigilInputError:
        return FaultLevel.DEGRADED


class LearnedStreamDetector(StreamDetector):
    """Wraps a fitted ``TCEDetector`` trained on GPU windows (``vigil detect train --format sim``)."""

    def __init__(self, detector: TCEDetector, topology: Topology, *, min_probability: float = 0.5,
                 hold_s: float = 120.0) -> None:
        if getattr(detector, "model_", None) is None:
            raise VigilInputError("the learned stream detector needs a trained model")
        self.detector = detector
        self.name = detector.name
        self.min_probability = min_probability
        self.hold_s = hold_s
        self.featurizer = GpuFeaturizer(topology)
        self.active: dict[str, Anomaly] = {}
        self.closed: list[Anomaly] = []
        self._buffer: np.ndarray | None = None
        self._seen = 0

    def set_topology(self, topology: Topology) -> None:
        """Read the jobs' placement from a newer topology (the context features); the windows stay."""
        self.featurizer.set_topology(topology)

    def resume(self, anomaly: Anomaly) -> None:
        """Take up an anomaly of this detector stored before a restart as open."""
        self.active.setdefault(anomaly.entity, anomaly)

    @classmethod
    def from_path(cls, path: Path, topology: Topology, **kw: float) -> LearnedStreamDetector:
        from vigil.detect.learned.tce import load_detector

        return cls(load_detector(path), topology, **kw)

    def _as_trained(self, frame: MetricFrame) -> MetricFrame:
        """The frame with the metrics the model was trained on, in its order: a live source reports what its
        exporters have (a column appears when one first does), and a metric it lacks reads as missing, as in
        training. A model whose features carry no metric names reads the frame as it comes."""
        metrics = trained_metrics(self.detector.features_)
        if not metrics or metrics == list(frame.metrics):
            return frame
        values = np.full((len(frame.entities), len(metrics)), np.nan, dtype=np.float64)
        for j, metric in enumerate(metrics):
            if metric in frame.metrics:
                values[:, j] = frame.column(metric)
        return MetricFrame(ts=frame.ts, family=frame.family, entities=list(frame.entities), metrics=metrics,
                           values=values)

    def _window(self, inputs: np.ndarray) -> np.ndarray:
        history = self.detector.history
        if self._buffer is None or self._buffer.shape[1:] != inputs.shape:
            # Before the history fills, the first row repeats, exactly as the offline windows are padded.
            self._buffer = np.repeat(inputs[None], history, axis=0)
            self._seen = 0
        else:
            self._buffer = np.roll(self._buffer, -1, axis=0)
            self._buffer[-1] = inputs
        self._seen += 1
        return self._buffer.transpose(1, 0, 2)

    def update(self, frames: Sequence[MetricFrame], events: Sequence[Event]) -> list[Anomaly]:
        frame = next((f for f in frames if f.family == "gpu"), None)
        if frame is None:
            return []
        inputs, context = self.featurizer.push(self._as_trained(frame), events)
        if self.detector.features_ and len(self.detector.features_) != inputs.shape[1]:
            raise VigilInputError(f"the model reads {len(self.detector.features_)} GPU features, "
                                  f"the frames give {inputs.shape[1]}")
        windows = self._window(inputs)
        probs = self.detector.predict_proba(windows, context if self.detector.n_context_ else None)
        best = probs.argmax(axis=1)
        opened = []
        for g in np.flatnonzero((best > 0) & (probs[np.arange(len(best)), best] >= self.min_probability)):
            gpu = self.featurizer.gpus[g]
            fault_type = self.detector.classes_[int(best[g])]
            probability = float(probs[g, best[g]])
            current = self.active.get(gpu)
            if current is not None and current.fault_type == fault_type:
                current.end = frame.ts
                current.score = max(current.score, probability)
                continue
            if current is not None:
                self.closed.append(self.active.pop(gpu))
            anomaly = Anomaly(entity=gpu, start=frame.ts, end=frame.ts, detector=self.name, fault_type=fault_type,
                              level=_fault_level(fault_type), score=probability, evidence=[Evidence(
                                  kind="detector", entity=gpu, ts=frame.ts,
                                  summary=f"TCE: p({fault_type}) = {probability:.2f} over the last "
                                          f"{self.detector.history} samples", value=probability)])
            self.active[gpu] = anomaly
            opened.append(anomaly)
        for gpu, anomaly in list(self.active.items()):
            if frame.ts - anomaly.end > self.hold_s:
                self.closed.append(self.active.pop(gpu))
        return opened

    def close(self) -> list[Anomaly]:
        self.closed.extend(self.active.values())
        self.active.clear()
        return self.closed


GPU_MODEL_DIR = Path("models") / "tce-gpu"


def trained_metrics(features: Sequence[str]) -> list[str]:
    """The raw metrics behind a model's GPU features (``rate(X)`` is X; the missing ratio is derived); empty
    when the features are not metric names (a model fitted on bare arrays names them m0, m1, ...)."""
    metrics = [f[len("rate("):-1] if f.startswith("rate(") and f.endswith(")") else f
               for f in features if f != MISSING_FEATURE]
    return metrics if metrics and all(m.startswith(("DCGM_", "vigil_")) for m in metrics) else []


def learned_detectors(topology: Topology, home: Path, model: Path | None = None) -> list[LearnedStreamDetector]:
    """The learned GPU detector at ``model`` (a clear error when there is none), else the one trained into
    ``<home>/models/tce-gpu`` (``vigil detect train --format sim --data RUN --out <home>/models/tce-gpu``) if
    any, else none."""
    if model is not None:
        return [LearnedStreamDetector.from_path(model, topology)]
    path = home / GPU_MODEL_DIR
    if not (path / "meta.json").exists():
        return []
    return [LearnedStreamDetector.from_path(path, topology)]
