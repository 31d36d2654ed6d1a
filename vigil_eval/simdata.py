"""Multi-class GPU-fault windows from the simulator (protocol (c)).

Each GPU is an entity; at every tick its window of dcgm-exporter metrics is labelled with the fault injected
on it at that time (``normal`` otherwise), from the run's ground truth. Inputs are prepared the way a real
scrape would need them:

- counters (``*_TOTAL``, ``*_COUNTER``, ``*_VIOLATION``, energy, PCIe bytes) become per-second rates, then
  ``log1p``: a raw counter only ever grows and says nothing about now;
- a GPU without values (fell off the bus) keeps its last values and gets ``vigil_missing_ratio`` = share of
  its metrics missing, so the gap is a signal, never a silent zero.

Context features per window (the "recent events" and "training state" part of TCE): log minutes since the
GPU's job started or restarted, log minutes since its last finished checkpoint, whether its job is down, and
log minutes since the GPU's last Xid of each family (application, ECC / row remap, engine, fallen off the bus,
GSP, NVLink, other), capped at a day: a fault that started an hour ago is still told apart by the Xid that
opened it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vigil.detect.learned.gpu_features import GpuFeaturizer
from vigil.detect.learned.windows import WindowSet
from vigil.knowledge.faults import fault_catalogue
from vigil.model import Event, GroundTruthFault, Topology, VigilInputError
from vigil.sources.replay import decoded_events
from vigil.store.metrics import MetricFrame
from vigil_eval.datasets import Dataset, EntitySeries

# Classes with no per-GPU signal by design (wrong numbers, no error): caught by training-health checks instead.
NOT_GPU_OBSERVABLE = frozenset({"silent_data_corruption"})


@dataclass
class GpuCube:
    """(ticks x GPUs x features) inputs, (ticks x GPUs) class labels and (ticks x GPUs x context) context."""

    ts: np.ndarray
    gpus: list[str]
    features: list[str]
    values: np.ndarray
    labels: np.ndarray
    context: np.ndarray
    classes: list[str]

    def window_set(self, history: int, *, gpus: Sequence[int] | None = None, ticks: slice = slice(None),
                   normal_stride: int = 1, seed: int = 0) -> WindowSet:
        """Windows of every chosen GPU at the chosen ticks; normal windows thinned to one in ``normal_stride``
        (at random offsets, so no GPU is always skipped), fault windows all kept."""
        rng = np.random.default_rng(seed)
        ws = WindowSet(history)
        tick_index = np.arange(len(self.ts))[ticks]
        for g in (range(len(self.gpus)) if gpus is None else gpus):
            lab = self.labels[:, g]
            keep = tick_index[(lab[tick_index] > 0) | (rng.random(len(tick_index)) < 1.0 / normal_stride)]
            ws.add(self.values[:, g, :], lab, context=self.context[:, g, :], rows=keep)
        return ws


def gpu_fault_classes() -> list[str]:
    """``normal`` plus the simulator's GPU fault types that show in a GPU's metrics or events."""
    faults = fault_catalogue().faults
    return ["normal", *(name for name, f in faults.items() if f.target == "gpu" and name not in NOT_GPU_OBSERVABLE)]


def gpu_cube(frames: Iterable[MetricFrame], events: Sequence[Event], ground_truth: Sequence[GroundTruthFault],
             topology: Topology, classes: Sequence[str]) -> GpuCube:
    """Build the GPU data set of one run from its ``gpu`` frames, events, ground truth and topology."""
    featurizer = GpuFeaturizer(topology)
    ordered = sorted(events, key=lambda e: e.ts)
    next_event = 0
    ts_list, inputs, contexts = [], [], []
    for frame in frames:
        if frame.family != "gpu":
            continue
        start = next_event
        while next_event < len(ordered) and ordered[next_event].ts <= frame.ts:
            next_event += 1
        x, ctx = featurizer.push(frame, ordered[start:next_event])
        ts_list.append(frame.ts)
        inputs.append(x)
        contexts.append(ctx)
    if not inputs:
        raise VigilInputError("simulated run has no gpu metric frames")
    ts = np.asarray(ts_list)
    gpus = featurizer.gpus
    class_index = {name: k for k, name in enumerate(classes)}
    gpu_pos = {g: i for i, g in enumerate(gpus)}
    labels = np.zeros((len(ts), len(gpus)), dtype=np.int64)
    for fault in ground_truth:
        if fault.entity in gpu_pos and fault.fault_type in class_index:
            span = (ts >= fault.start) & (ts <= fault.end)
            column = labels[:, gpu_pos[fault.entity]]
            column[span & (column == 0)] = class_index[fault.fault_type]
    return GpuCube(ts=ts, gpus=gpus, features=featurizer.features, values=np.stack(inputs), labels=labels,
                   context=np.stack(contexts), classes=list(classes))


def load_sim_dataset(root: Path, entities: Sequence[str] | None = None) -> Dataset:
    """A run written by ``vigil sim --out DIR``: every GPU is an entity, the first half of the run its train
    part and the second half its test part (``vigil detect eval --format sim``)."""
    from vigil.sources.sim.io import load_sim

    files = load_sim(root)
    classes = gpu_fault_classes()
    events = decoded_events(files.topology, files.events, files.logs())
    cube = gpu_cube(files.frames("gpu"), events, files.ground_truth, files.topology, classes)
    cut = len(cube.ts) // 2
    data: dict[str, EntitySeries] = {}
    for g, gpu in enumerate(cube.gpus):
        if entities and gpu not in entities:
            continue
        data[gpu] = EntitySeries(entity=gpu, train=cube.values[:cut, g], train_labels=cube.labels[:cut, g],
                                 test=cube.values[cut:, g], test_labels=cube.labels[cut:, g],
                                 train_context=cube.context[:cut, g], test_context=cube.context[cut:, g])
    if not data:
        raise VigilInputError(f"{root}: none of the requested GPUs is in the run")
    return Dataset(name=root.name, features=cube.features, classes=classes, entities=data)
