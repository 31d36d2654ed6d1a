"""The engine's start-up and its optional detectors: a half-done action left by a killed predecessor is
finished before the first tick (`vigil engine --actuator slurm`, a real subprocess), and a trained learned
detector runs beside the rules, its findings the evidence of their incidents."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.remedy.killed_drain import kill_mid_drain, scontrol_updates
from tests.run.clock import Clock
from tests.run.live_processes import vigil_env
from vigil.config import Settings
from vigil.detect.learned.tce import TCEDetector, save_detector
from vigil.model import ActionStatus, Gpu, Node, Sample, VigilInputError
from vigil.remedy.audit import AuditLog
from vigil.run.engine import Engine
from vigil.store.sql import Store

GPUS = [(node, index) for node in ("n01", "n02") for index in range(2)]


def test_engine_finishes_an_action_its_killed_predecessor_left_half_done(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    url = f"sqlite:///{tmp_path / 'home' / 'vigil.db'}"
    store = Store(url)  # the store as the server that was executing left it: n1 is one node of ten
    for name in ["n1", *(f"n{i}" for i in range(2, 11))]:
        store.register_node(Node(name=name))
    store.close()
    kill_mid_drain(tmp_path, bin_dir / "scontrol", url)
    assert [a.id for a in AuditLog(url).unfinished()] == ["act-drain-n1"]

    engine_env = vigil_env(VIGIL_HOME=str(tmp_path / "home"), VIGIL_EXECUTE_ACTIONS="true",
                           PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    done = subprocess.run([sys.executable, "-m", "vigil", "engine", "--once", "--actuator", "slurm"],
                          env=engine_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "resumed 1 interrupted action" in done.stderr
    audit = AuditLog(url)
    assert audit.unfinished() == [], [(a.status, a.result) for a in audit.actions()]
    assert scontrol_updates(tmp_path) == 2  # the killed call and the one that completed
    assert [(a.id, a.status) for a in audit.actions()] == [("act-drain-n1", ActionStatus.EXECUTED)]
    # A second start finds nothing left to do.
    again = subprocess.run([sys.executable, "-m", "vigil", "engine", "--once", "--actuator", "slurm"],
                           env=engine_env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "resumed" not in again.stderr and scontrol_updates(tmp_path) == 2


def test_engine_acts_through_the_configured_backend_and_only_with_execute_actions(tmp_path: Path) -> None:
    """`vigil engine` without --actuator takes remedy_backend (VIGIL_REMEDY_BACKEND); execute_actions off, it
    resumes nothing; an explicit --actuator none wins over the setting."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    url = f"sqlite:///{tmp_path / 'home' / 'vigil.db'}"
    store = Store(url)
    for name in ["n1", *(f"n{i}" for i in range(2, 11))]:
        store.register_node(Node(name=name))
    store.close()
    kill_mid_drain(tmp_path, bin_dir / "scontrol", url)
    env = vigil_env(VIGIL_HOME=str(tmp_path / "home"), VIGIL_REMEDY_BACKEND="slurm",
                    PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    def engine_once(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "vigil", "engine", "--once", *args], env={**env, **extra},
                              capture_output=True, text=True, timeout=120)

    dry = engine_once()
    assert dry.returncode == 0, dry.stderr
    assert "remedy backend slurm: dry-run" in dry.stderr and "resumed" not in dry.stderr
    assert len(AuditLog(url).unfinished()) == 1 and scontrol_updates(tmp_path) == 1  # only the killed call
    explicit = engine_once("--actuator", "none", VIGIL_EXECUTE_ACTIONS="true")
    assert explicit.returncode == 0 and "resumed" not in explicit.stderr and scontrol_updates(tmp_path) == 1
    live = engine_once(VIGIL_EXECUTE_ACTIONS="true")
    assert live.returncode == 0, live.stderr
    assert "resumed 1 interrupted action" in live.stderr and scontrol_updates(tmp_path) == 2
    assert AuditLog(url).unfinished() == []
    bad = engine_once("--actuator", "pbs")
    lines = [line for line in bad.stderr.splitlines() if line.strip()]
    assert bad.returncode == 2 and len(lines) == 1 and "--actuator 'pbs'" in lines[0]


def _tiny_model(path: Path) -> None:
    """A TCE that learned one thing: a GPU running warm (75-82 C, below the rules' 87 C) for a while is
    gpu_thermal; 55-65 C is normal."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    n, history = 400, 8
    labels = rng.integers(0, 2, n)
    temp = np.where(labels[:, None] == 1, rng.uniform(75, 82, (n, history)), rng.uniform(55, 65, (n, history)))
    util = rng.uniform(90, 100, (n, history))
    windows = np.stack([temp, util, np.zeros((n, history))], axis=2).astype(np.float32)
    detector = TCEDetector(recent=4, history=history, scales=(2,), hidden=8, epochs=8, prototypes=0, seed=0)
    detector.fit(windows, labels, classes=["normal", "gpu_thermal"],
                 features=["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_UTIL", "vigil_missing_ratio"])
    save_detector(detector, path)


def test_learned_detector_findings_become_incident_evidence(tmp_path: Path) -> None:
    _tiny_model(tmp_path / "model")
    settings = Settings(home=tmp_path / "home", detector_model=str(tmp_path / "model"), resolve_after_s=600.0)
    store = Store(settings.database_url())
    for node in ("n01", "n02"):
        store.register_node(Node(name=node, gpus=[Gpu(node=node, index=i) for i in range(2)]))
    clock = Clock()
    engine = Engine(store, settings, notifiers=[], clock=clock)

    def scrape(warm: set[tuple[str, int]]) -> None:
        for node in ("n01", "n02"):
            samples = []
            for index in range(2):
                entity = f"gpu/{node}/{index}"
                temp = 79.0 if (node, index) in warm else 60.0
                samples += [Sample(ts=clock.now, entity=entity, metric="DCGM_FI_DEV_GPU_TEMP", value=temp),
                            Sample(ts=clock.now, entity=entity, metric="DCGM_FI_DEV_GPU_UTIL", value=96.0),
                            Sample(ts=clock.now, entity=entity, metric="DCGM_FI_DEV_SM_CLOCK", value=1980.0)]
            store.add_samples(node, samples)

    for _ in range(12):
        clock.now += 10.0
        scrape(set())
        engine.tick()
    assert store.incidents() == []
    for _ in range(10):
        clock.now += 10.0
        scrape({("n02", 1)})
        engine.tick()
    [incident] = store.incidents()
    assert incident.scope == "gpu/n02/1" and incident.fault_types == ["gpu_thermal"]
    assert incident.evidence[0].kind == "detector" and "TCE: p(gpu_thermal)" in incident.evidence[0].summary
    assert store.diagnosis(incident.id) is not None


def test_a_configured_model_that_is_not_there_is_refused(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, detector_model=str(tmp_path / "missing"))
    with pytest.raises(VigilInputError, match="no trained model"):
        Engine(Store(settings.database_url()), settings, notifiers=[])
