"""A real Prometheus scrapes the simulated dcgm-exporter and Vigil's /metrics; Vigil reads back via PromQL."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from tests.serve.conftest import SimCluster, free_port, reader_cookies, require_binary, serve_in_thread, wait_for
from vigil.faces.api.app import create_app
from vigil.model import VigilInputError
from vigil.sources.promql import PromQLSource
from vigil.sources.sim import SimConfig, simulate
from vigil.store.metrics import MetricStore

pytestmark = pytest.mark.slow

CONFIG = """
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: dcgm-exporter
    metrics_path: /sim/dcgm/metrics
    static_configs: [{{targets: ["{target}"]}}]
  - job_name: vigil
    static_configs: [{{targets: ["{target}"]}}]
"""


@pytest.fixture
def live_metrics() -> MetricStore:
    return MetricStore()


@pytest.fixture
def prometheus_stack(
    cluster: SimCluster, live_metrics: MetricStore, tmp_path: Path
) -> Iterator[tuple[str, PromQLSource]]:
    binary = require_binary("prometheus")
    app = create_app(cluster.store, live_metrics, cluster.settings())
    with serve_in_thread(app) as base_url:
        port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(CONFIG.format(target=base_url.removeprefix("http://")))
        log = (tmp_path / "prometheus.log").open("w")
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        source = PromQLSource(f"http://127.0.0.1:{port}")
        try:
            source.wait_ready(timeout_s=60)
            yield base_url, source
        finally:
            process.terminate()
            process.wait(timeout=30)
            source.close()
            log.close()


def _value(source: PromQLSource, expr: str) -> float | None:
    found = source.query(expr)
    return float(found[0].values[0]) if found else None


def test_prometheus_scrapes_both_and_vigil_reads_back(
    cluster: SimCluster, live_metrics: MetricStore, prometheus_stack: tuple[str, PromQLSource]
) -> None:
    base_url, source = prometheus_stack
    ticks = iter(simulate(SimConfig(nodes=2, gpus=4, minutes=5, seed=4)).ticks())
    gpu_frame = next(f for f in next(ticks).frames if f.family == "gpu")
    live_metrics.append(gpu_frame)

    wait_for(lambda: _value(source, 'count(up{job=~"dcgm-exporter|vigil"} == 1)') == 2, 60, "both targets up")
    energy = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
    column = list(gpu_frame.metrics).index(energy)
    selector = f'{energy}{{Hostname="n000",gpu="1"}}'
    wait_for(lambda: _value(source, selector) == float(gpu_frame.values[1, column]), 30, "first frame scraped")

    # The simulator moves on; Prometheus' next scrape and Vigil's PromQL read must follow.
    later = next(f for f in next(ticks).frames if f.family == "gpu")
    live_metrics.append(later)
    assert later.values[1, column] != gpu_frame.values[1, column]
    wait_for(lambda: _value(source, selector) == float(later.values[1, column]), 30, "second frame scraped")
    assert _value(source, "count(DCGM_FI_DEV_GPU_TEMP)") == 8
    # The detectors' input read back from Prometheus is the frame the simulator produced, value for value.
    read_back = source.gpu_frame(list(later.metrics), entities=list(later.entities))
    np.testing.assert_array_equal(read_back.values, later.values)
    assert source.gpu_frame(["DCGM_FI_DEV_GPU_TEMP"]).entities == sorted(later.entities)
    # The engine's read: one row per (metric, GPU), named from the labels, each the frame's value.
    rows = [(m, e, np.float32(v)) for m, e, v, _ in source.samples(list(later.metrics)) if e in later.entities]
    assert len(rows) == len({(m, e) for m, e, _ in rows})
    assert {(m, e): v for m, e, v in rows} == {
        (m, e): later.values[i, j] for i, e in enumerate(later.entities) for j, m in enumerate(later.metrics)
        if not np.isnan(later.values[i, j])}
    ts, values = source.series("gpu/n000/1", energy, step=1.0)
    assert len(ts) >= 2 and float(later.values[1, column]) in values.tolist()

    # Vigil's own families came through the same Prometheus.
    health = cluster.store.node_health()
    worst = max(int(level) for entity, level in health.items() if entity.startswith("gpu/"))
    wait_for(lambda: _value(source, "max(vigil_gpu_fault_level)") is not None, 30, "vigil_gpu_fault_level")
    assert _value(source, "max(vigil_gpu_fault_level)") == worst
    bad_gpu = next(e for e, level in health.items() if e.startswith("gpu/") and level == worst)
    _, node, index = bad_gpu.split("/")
    assert _value(source, f'vigil_gpu_fault_level{{node="{node}",gpu="{index}"}}') == worst

    # The REST API answers metric questions from Prometheus when configured with it.
    app = create_app(cluster.store, None, cluster.settings(), prom=source)
    with TestClient(app, cookies=reader_cookies()) as client:
        answer = client.get("/api/v1/metrics/query", params={"query": f"{energy}{{Hostname='n001'}}"}).json()
        assert len(answer) == 4 and {a["labels"]["Hostname"] for a in answer} == {"n001"}
        series = client.get("/api/v1/metrics/series", params={"entity": "gpu/n000/1", "metric": energy}).json()
        assert np.isclose(series["values"][-1], float(later.values[1, column]))
        bad = client.get("/api/v1/metrics/query", params={"query": "sum(("})
        assert bad.status_code == 400 and "bad_data" in bad.json()["detail"]


def test_unreachable_prometheus_is_one_clear_error() -> None:
    source = PromQLSource(f"http://127.0.0.1:{free_port()}", timeout_s=2)
    with pytest.raises(VigilInputError, match="cannot reach the metrics API"):
        source.query("up")
    with pytest.raises(VigilInputError, match="metric name .*expected"):
        source.gpu_frame(['up{job=~"x"}'])
    with pytest.raises(VigilInputError, match="expected http"):
        PromQLSource("prometheus:9090")
