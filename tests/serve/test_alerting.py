"""End to end through real Prometheus and Alertmanager (Debian's): Vigil's /metrics -> an alert rule ->
Alertmanager's webhook (its own v4 payload, bearer token) -> Vigil's receiver -> an Event in the store."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.serve.conftest import TOKEN, SimCluster, free_port, require_binary, serve_in_thread, wait_for
from vigil.faces.api.app import create_app
from vigil.model import FaultLevel
from vigil.sources.promql import PromQLSource

pytestmark = pytest.mark.slow

RULES = """
groups:
  - name: vigil
    rules:
      - alert: GpuMustBeIsolated
        expr: vigil_gpu_fault_level >= 4
        labels: {severity: critical}
        annotations: {summary: "GPU {{ $labels.gpu }} of {{ $labels.node }} is at fault level isolate"}
"""

PROMETHEUS = """
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
rule_files: ["{rules}"]
alerting:
  alertmanagers: [{{static_configs: [{{targets: ["127.0.0.1:{am_port}"]}}]}}]
scrape_configs:
  - job_name: vigil
    static_configs: [{{targets: ["{vigil}"]}}]
"""

ALERTMANAGER = """
route:
  receiver: vigil
  group_by: [alertname, node, gpu]
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: vigil
    webhook_configs:
      - url: {vigil_url}/api/v1/alertmanager
        send_resolved: true
        http_config:
          authorization: {{type: Bearer, credentials: "{token}"}}
"""


def _start(stack: ExitStack, args: list[str], log: Path) -> subprocess.Popen[bytes]:
    out = stack.enter_context(log.open("w"))
    process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)

    def stop() -> None:
        process.terminate()
        process.wait(timeout=30)

    stack.callback(stop)
    return process


@pytest.fixture
def alerting(cluster: SimCluster, tmp_path: Path) -> Iterator[str]:
    prometheus = require_binary("prometheus")
    alertmanager = require_binary("prometheus-alertmanager")
    app = create_app(cluster.store, cluster.metrics, cluster.settings())
    with serve_in_thread(app) as vigil_url, ExitStack() as stack:
        am_port, prom_port = free_port(), free_port()
        (tmp_path / "rules.yml").write_text(RULES)
        (tmp_path / "prometheus.yml").write_text(
            PROMETHEUS.format(rules=tmp_path / "rules.yml", am_port=am_port, vigil=vigil_url.removeprefix("http://"))
        )
        (tmp_path / "alertmanager.yml").write_text(ALERTMANAGER.format(vigil_url=vigil_url, token=TOKEN))
        _start(
            stack,
            [
                alertmanager,
                f"--config.file={tmp_path / 'alertmanager.yml'}",
                f"--storage.path={tmp_path / 'am'}",
                f"--web.listen-address=127.0.0.1:{am_port}",
                "--cluster.listen-address=",
            ],
            tmp_path / "alertmanager.log",
        )
        _start(
            stack,
            [
                prometheus,
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
                "--log.level=warn",
            ],
            tmp_path / "prometheus.log",
        )
        source = PromQLSource(f"http://127.0.0.1:{prom_port}")
        source.wait_ready(timeout_s=60)
        stack.callback(source.close)
        yield vigil_url


def test_alert_on_vigil_metrics_comes_back_as_an_event(cluster: SimCluster, alerting: str) -> None:
    isolated = {
        e for e, level in cluster.store.node_health().items() if e.startswith("gpu/") and level >= FaultLevel.ISOLATE
    }
    assert isolated, "the simulated cluster should hold at least one GPU at level isolate"

    def received() -> set[str]:
        return {
            e.entity
            for e in cluster.store.events(kind="alert_firing", limit=10000)
            if e.attrs.get("alertname") == "GpuMustBeIsolated"
        }

    wait_for(lambda: received() >= isolated, 90, "Alertmanager to deliver the GpuMustBeIsolated alerts")
    event = next(
        e
        for e in cluster.store.events(kind="alert_firing", limit=10000)
        if e.attrs.get("alertname") == "GpuMustBeIsolated"
    )
    assert event.source == "alertmanager" and event.level is FaultLevel.ISOLATE
    assert event.attrs["receiver"] == "vigil" and event.attrs["fingerprint"]
    assert "is at fault level isolate" in event.message
