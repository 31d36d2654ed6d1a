"""Simulated GPU-fault windows and the streaming adapter that runs a trained TCE beside the rules."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from vigil.detect.learned.gpu_features import CONTEXT_FEATURES, GpuFeaturizer
from vigil.detect.learned.tce import TCEDetector
from vigil.detect.stream import LearnedStreamDetector
from vigil.model import Event, FaultLevel, GroundTruthFault, Job, VigilInputError
from vigil.sources.replay import KernelLineDecoder, decoded_events
from vigil.sources.sim.cluster import build_topology
from vigil.sources.sim.generator import FaultPlan, SimConfig, simulate
from vigil.store.metrics import MetricFrame
from vigil_eval.simdata import gpu_cube, gpu_fault_classes

torch.set_num_threads(1)


def small_run(seed: int = 0, plans: tuple[FaultPlan, ...] | None = None):  # type: ignore[no-untyped-def]
    return simulate(SimConfig(nodes=2, gpus=4, minutes=40, seed=seed, interval_s=30.0, plans=plans,
                              benign_noise=False))


def test_featurizer_rates_missing_values_and_context() -> None:
    topo = build_topology(1, 2, job_nodes=1)
    gpus = [g.id for g in topo.nodes[0].gpus]
    job = topo.jobs[0].entity
    metrics = ["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"]
    feat = GpuFeaturizer(topo)
    feat.push(MetricFrame(0.0, "gpu", gpus, metrics, np.array([[50.0, 10.0], [51.0, 0.0]])),
              [Event(ts=0.0, entity=job, kind="job", attrs={"reason": "started"})])
    x, ctx = feat.push(MetricFrame(60.0, "gpu", gpus, metrics, np.array([[52.0, 70.0], [np.nan, np.nan]])),
                       [Event(ts=30.0, entity=gpus[0], kind="xid", attrs={"xid": 48})])
    assert feat.features == ["DCGM_FI_DEV_GPU_TEMP", "rate(DCGM_FI_DEV_ECC_SBE_VOL_TOTAL)", "vigil_missing_ratio"]
    assert x[0, 1] == pytest.approx(np.log1p(1.0))  # 60 errors in 60 s
    assert x[1].tolist() == [51.0, 0.0, 1.0]  # missing: last values kept, flagged, no phantom rate
    assert ctx.shape == (2, len(CONTEXT_FEATURES))
    assert ctx[0, 0] == pytest.approx(np.log1p(1.0))  # one minute since the job started
    ecc = 3 + 1  # the "ecc" Xid family column
    assert ctx[0, ecc] == pytest.approx(np.log1p(0.5)) and ctx[1, ecc] > 6


def test_cube_labels_follow_the_ground_truth() -> None:
    run = small_run(plans=(FaultPlan("gpu_thermal", "gpu/n000/1", 600.0, 900.0),))
    classes = gpu_fault_classes()
    assert "silent_data_corruption" not in classes and classes[0] == "normal"
    cube = gpu_cube((f for t in run.ticks() for f in t.frames), run.events, run.ground_truth, run.topology, classes)
    g = cube.gpus.index("gpu/n000/1")
    labelled = cube.ts[cube.labels[:, g] == classes.index("gpu_thermal")] - run.start_ts
    truth = next(f for f in run.ground_truth if f.fault_type == "gpu_thermal")
    assert labelled.min() >= truth.start - run.start_ts and labelled.max() <= truth.end - run.start_ts
    assert (cube.labels[:, [i for i in range(len(cube.gpus)) if i != g]] == 0).all()
    ws = cube.window_set(20, normal_stride=4, seed=0)
    assert (ws.labels > 0).sum() == (cube.labels > 0).sum()
    assert ws.context is not None and ws.context.shape[1] == len(CONTEXT_FEATURES)


def test_stream_detector_opens_an_anomaly_for_a_learned_fault() -> None:
    plans = tuple(FaultPlan("gpu_thermal", f"gpu/n00{n}/{g}", 300.0 + 120 * g, 900.0)
                  for n in range(2) for g in range(4) if (n + g) % 2 == 0)
    run = small_run(plans=plans)
    classes = ["normal", "gpu_thermal"]
    events = decoded_events(run.topology, run.events, run.logs)
    cube = gpu_cube((f for t in run.ticks() for f in t.frames), events, run.ground_truth, run.topology, classes)
    det = TCEDetector(recent=8, history=24, scales=(4,), hidden=16, epochs=6, batch_size=64, prototypes=4, seed=0)
    det.fit(cube.window_set(24), classes=classes, features=cube.features)
    stream = LearnedStreamDetector(det, run.topology, min_probability=0.5)
    opened = []
    kernel = KernelLineDecoder(run.topology)
    for tick in run.ticks():
        opened.extend(stream.update(tick.frames, [*tick.events, *kernel.decode(tick.kernel_lines)]))
    found = {a.entity for a in stream.close() if a.fault_type == "gpu_thermal"}
    faulty = {p.entity for p in plans}
    assert len(found & faulty) >= len(faulty) - 1
    assert len(found - faulty) <= 1
    assert all(a.detector == "tce" and a.level == FaultLevel.DEGRADED for a in opened)


def test_stream_detector_refuses_untrained_or_mismatched_models() -> None:
    topo = build_topology(1, 2, job_nodes=1)
    with pytest.raises(VigilInputError, match="trained model"):
        LearnedStreamDetector(TCEDetector(), topo)
    rng = np.random.default_rng(0)
    det = TCEDetector(recent=4, history=8, scales=(2,), hidden=8, epochs=1, prototypes=0)
    det.fit(rng.normal(size=(64, 8, 3)).astype(np.float32), rng.integers(0, 2, 64))
    stream = LearnedStreamDetector(det, topo)
    frame = MetricFrame(0.0, "gpu", [g.id for g in topo.nodes[0].gpus], ["a"], np.zeros((2, 1)))
    with pytest.raises(VigilInputError, match="GPU features"):
        stream.update([frame], [])


def test_ground_truth_on_other_entities_is_ignored() -> None:
    topo = build_topology(1, 2, job_nodes=1)
    gpus = [g.id for g in topo.nodes[0].gpus]
    frames = [MetricFrame(float(t), "gpu", gpus, ["DCGM_FI_DEV_GPU_TEMP"], np.full((2, 1), 50.0)) for t in range(5)]
    truth = [GroundTruthFault(fault_type="gpu_thermal", entity="node/n000", start=0.0, end=10.0)]
    cube = gpu_cube(frames, [], truth, topo, ["normal", "gpu_thermal"])
    assert not cube.labels.any()
    assert isinstance(topo.jobs[0], Job)


def test_learned_detectors_load_only_a_trained_gpu_model(tmp_path: Path) -> None:
    from vigil.detect.learned.tce import save_detector
    from vigil.detect.stream import GPU_MODEL_DIR, learned_detectors

    topo = build_topology(1, 2, job_nodes=1)
    assert learned_detectors(topo, tmp_path) == []
    rng = np.random.default_rng(0)
    det = TCEDetector(recent=4, history=8, scales=(2,), hidden=8, epochs=1, prototypes=0)
    det.fit(rng.normal(size=(64, 8, 3)).astype(np.float32), rng.integers(0, 2, 64))
    save_detector(det, tmp_path / GPU_MODEL_DIR)
    [stream] = learned_detectors(topo, tmp_path)
    assert stream.name == "tce" and stream.detector.history == 8
