"""/metrics: Vigil's state under Prometheus naming and cardinality conventions."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from tests.serve.conftest import SimCluster
from vigil.faces.api.app import create_app
from vigil.model import IncidentStatus

ALLOWED_LABELS = {"node", "gpu", "job", "level", "detector", "status", "version", "cluster"}


def test_metrics_reflect_store_and_follow_conventions(cluster: SimCluster) -> None:
    with TestClient(create_app(cluster.store, cluster.metrics, cluster.settings())) as client:
        response = client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(response.text)}
    for family in families.values():
        assert family.name.startswith("vigil_")
        for sample in family.samples:
            assert set(sample.labels) <= ALLOWED_LABELS, (family.name, sample.labels)
    health = cluster.store.node_health()
    gpu_levels = {
        f"gpu/{s.labels['node']}/{s.labels['gpu']}": s.value for s in families["vigil_gpu_fault_level"].samples
    }
    assert len(gpu_levels) == cluster.run.topology.gpu_count()
    assert gpu_levels == {e: float(level) for e, level in health.items() if e.startswith("gpu/")}
    assert max(gpu_levels.values()) >= 3
    open_count = sum(s.value for s in families["vigil_incidents_open"].samples)
    expected = sum(
        len(cluster.store.incidents(status=s, limit=10000)) for s in (IncidentStatus.OPEN, IncidentStatus.ACKNOWLEDGED)
    )
    assert open_count == expected > 0
    detectors = {s.labels["detector"] for s in families["vigil_detector_score_max"].samples}
    newest = cluster.store.incidents(limit=1)[0]
    recent = cluster.store.anomalies(since=newest.end - 3600.0, limit=5000)
    assert detectors == {a.detector for a in recent} and detectors
    scores = {s.labels["detector"]: s.value for s in families["vigil_detector_score_max"].samples}
    assert scores == {d: max(a.score for a in recent if a.detector == d) for d in detectors}
    assert families["vigil_alertmanager_alerts"].type == "counter"


def test_metrics_carry_gpu_waste_per_job_and_node(cluster: SimCluster) -> None:
    from vigil.detect.waste import gpu_waste, window_of

    with TestClient(create_app(cluster.store, cluster.metrics, cluster.settings())) as client:
        page = client.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(page)}
    start, end = window_of(cluster.metrics)  # type: ignore[misc]
    report = gpu_waste(cluster.metrics, cluster.run.topology, max(start, end - 900.0), end)
    for key in ("job", "node"):
        rows = {r.name: r for r in report.summary(key)}
        assert rows, key
        waste = {s.labels[key]: s.value for s in families[f"vigil_{key}_gpu_waste_ratio"].samples}
        assert waste == pytest.approx({n: r.waste_rate for n, r in rows.items() if r.waste_rate is not None})
        allocated = {s.labels[key]: s.value for s in families[f"vigil_{key}_gpus_allocated"].samples}
        assert allocated == {n: float(r.allocated_gpus) for n, r in rows.items()}
        idle = {s.labels[key]: s.value for s in families[f"vigil_{key}_gpus_idle"].samples}
        assert idle == {n: float(len(r.idle_gpus)) for n, r in rows.items()}
    assert all(0.0 <= s.value <= 1.0 for s in families["vigil_job_gpu_waste_ratio"].samples)
