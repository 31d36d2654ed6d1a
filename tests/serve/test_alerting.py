"""End to end through real Prometheus and Alertmanager (Debian's): Vigil's /metrics -> an alert rule ->
Alertmanager's webhook (its own v4 payload, bearer token) -> Vigil's receiver -> an Event in the store; and
Alertmanager repeating a firing alert stores it once."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from tests.serve.conftest import TOKEN, SimCluster, free_port, require_binary, serve_in_thread, wait_for
from vigil.config import Settings
from vigil.faces.api.app import create_app
from vigil.model import FaultLevel
from vigil.sources.promql import PromQLSource
from vigil.store.sql import Store

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


# Alertmanager sending every firing alert again each 2 s (repeat_interval; it looks each group_interval).
REPEATING = """
route:
  receiver: vigil
  group_by: [alertname, Hostname, gpu]
  group_wait: 0s
  group_interval: 1s
  repeat_interval: 2s
receivers:
  - name: vigil
    webhook_configs:
      - url: {vigil_url}/api/v1/alertmanager
        send_resolved: true
        http_config:
          authorization: {{type: Bearer, credentials: "{token}"}}
"""


def _rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def test_an_alert_alertmanager_repeats_is_one_event_until_it_fires_again(tmp_path: Path) -> None:
    """One alert posted to Alertmanager's API as Prometheus posts it: Alertmanager notifies Vigil of it three
    times while it fires, once when it resolves, and again once it fires anew. Vigil stores one firing event per
    start and one resolution."""
    alertmanager = require_binary("prometheus-alertmanager")
    store = Store(f"sqlite:///{tmp_path / 'vigil.db'}")
    app = create_app(store, settings=Settings(home=tmp_path, api_token=TOKEN))
    received, repeated = app.state.ctx.collector.alerts_received, app.state.ctx.collector.alerts_repeated

    def notified(status: str) -> int:
        return received[status] + repeated[status]

    alert = {"labels": {"alertname": "GpuXid", "Hostname": "n003", "gpu": "5", "severity": "critical"},
             "annotations": {"summary": "GPU has fallen off the bus"}}
    with serve_in_thread(app) as vigil_url, ExitStack() as stack, httpx.Client() as client:
        port = free_port()
        (tmp_path / "alertmanager.yml").write_text(REPEATING.format(vigil_url=vigil_url, token=TOKEN))
        _start(stack, [alertmanager, f"--config.file={tmp_path / 'alertmanager.yml'}",
                       f"--storage.path={tmp_path / 'am'}", f"--web.listen-address=127.0.0.1:{port}",
                       "--cluster.listen-address="], tmp_path / "alertmanager.log")
        alerts_api = f"http://127.0.0.1:{port}/api/v2/alerts"

        def post(**times: str) -> bool:
            try:
                return client.post(alerts_api, json=[{**alert, **times}]).status_code == 200
            except httpx.TransportError:
                return False  # not listening yet

        started = _rfc3339(time.time() - 30)
        wait_for(lambda: post(startsAt=started), 30, "Alertmanager to take the alert")
        wait_for(lambda: notified("firing") >= 3, 30, "Alertmanager to notify the firing alert three times")
        assert post(startsAt=started, endsAt=_rfc3339(time.time()))
        wait_for(lambda: notified("resolved") >= 1, 30, "Alertmanager to notify the resolution")
        assert post(startsAt=_rfc3339(time.time()))
        wait_for(lambda: notified("firing") >= 5, 30, "Alertmanager to notify the alert firing again, twice")
        firing, resolved = store.events(kind="alert_firing"), store.events(kind="alert_resolved")
    assert len(firing) == 2 and firing[0].ts < resolved[0].ts < firing[1].ts
    assert len(resolved) == 1 and len({e.attrs["fingerprint"] for e in firing + resolved}) == 1
    # each alert counted once, Alertmanager's repeats apart
    assert (received["firing"], received["resolved"]) == (2, 1) and repeated["firing"] >= 3
    store.close()
