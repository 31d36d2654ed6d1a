"""The closed loop with real parts: `vigil serve` (engine inside) and two `vigil agent` processes reading
dcgm-exporter pages over HTTP and kernel-log files, a real Alertmanager (Debian's) receiving the incidents,
and a real Prometheus scraping the agents for the PromQL path. Faults are injected only by writing the
formats machines write: an Xid line in a kernel log, a higher double-bit ECC counter on a dcgm-exporter page.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.collect.conftest import PageServer
from tests.run.live_processes import answers, start, vigil_env
from tests.run.pages import dcgm_page, xid_line
from tests.serve.conftest import TOKEN, free_port, require_binary, wait_for

pytestmark = pytest.mark.slow

NODES = ("n01", "n02")
ALERTMANAGER = """
route: {receiver: sink, group_wait: 1s, group_interval: 1s, repeat_interval: 1h}
receivers: [{name: sink}]
"""
PROMETHEUS = """
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
scrape_configs:
  - job_name: vigil-agents
    static_configs: [{{targets: [{targets}]}}]
"""


@dataclass
class LiveCluster:
    url: str
    alertmanager: str
    tmp: Path
    pages: dict[str, PageServer]
    kmsg: dict[str, Path]
    prometheus: bool
    logs: list[Path] = field(default_factory=list)
    agents: dict[str, str] = field(default_factory=dict)  # node -> the agent's /metrics URL

    def get(self, path: str) -> Any:
        response = httpx.get(self.url + path, timeout=10, headers={"Authorization": f"Bearer {TOKEN}"})
        response.raise_for_status()
        return response.json()

    def incidents(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.get("/api/v1/incidents")
        return result

    def set_page(self, node: str, dbe: dict[int, int] | None = None) -> None:
        self.pages[node].page = dcgm_page(node, dbe=dbe).encode()

    def write_kernel(self, node: str, line: str) -> None:
        with self.kmsg[node].open("a") as fh:
            fh.write(line + "\n")

    def alerts(self) -> list[dict[str, Any]]:
        response = httpx.get(self.alertmanager + "/api/v2/alerts", params={"filter": 'alertname="VigilIncident"'})
        response.raise_for_status()
        result: list[dict[str, Any]] = response.json()
        return result

    # The engine stores an incident before its diagnosis and the actions it proposes: an incident just seen
    # may not have them yet.
    def diagnosis(self, incident: str) -> dict[str, Any]:
        path = f"/api/v1/incidents/{incident}/diagnosis"
        self.wait(lambda: answers(self.url + path, TOKEN), 60, f"the diagnosis of {incident}")
        result: dict[str, Any] = self.get(path)
        return result

    def actions(self, incident: str, expected: tuple[str, str]) -> list[dict[str, Any]]:
        """The incident's proposed actions, once ``expected`` (kind, target) is among them."""
        path = f"/api/v1/actions?incident_id={incident}"
        self.wait(lambda: expected in {(a["kind"], a["target"]) for a in self.get(path)}, 60,
                  f"{expected[0]} {expected[1]} proposed for {incident}")
        result: list[dict[str, Any]] = self.get(path)
        return result

    def wait(self, condition: Callable[[], bool], timeout_s: float, what: str) -> None:
        try:
            wait_for(condition, timeout_s, what, interval_s=0.25)
        except AssertionError:
            for log in self.logs:
                print(f"--- {log.name}\n{log.read_text()[-3000:]}")
            # what the server holds, to tell a fault never detected from an extra incident or a stalled engine
            with contextlib.suppress(httpx.HTTPError):
                print("--- incidents", [(i["scope"], i["fault_types"], i["status"]) for i in self.incidents()])
                print("--- engine", self.get("/api/v1/engine"))
                print("--- events", [(e["kind"], e["entity"]) for e in self.get("/api/v1/events?limit=20")])
                for node, metrics in self.agents.items():
                    health = [line for line in httpx.get(metrics, timeout=10).text.splitlines()
                              if line.startswith(("vigil_agent_source", "vigil_agent_events", "vigil_agent_kernel"))]
                    print(f"--- agent {node}", health)
            raise


def _start_cluster(tmp: Path, stack: ExitStack, prometheus: bool) -> LiveCluster:
    """Alertmanager, `vigil serve` and one `vigil agent` per node (each with its dcgm-exporter page and kernel
    log); with ``prometheus`` the agents are scraped by Prometheus and the engine reads PromQL instead of
    their pushed samples."""
    alertmanager_bin = require_binary("prometheus-alertmanager")
    am_port, port = free_port(), free_port()
    (tmp / "alertmanager.yml").write_text(ALERTMANAGER)
    logs = [tmp / "alertmanager.log", tmp / "serve.log"]
    start(stack, [alertmanager_bin, f"--config.file={tmp / 'alertmanager.yml'}",
                  f"--web.listen-address=127.0.0.1:{am_port}", f"--storage.path={tmp / 'am'}",
                  "--cluster.listen-address="], logs[0])
    pages, kmsg, agent_ports = {}, {}, {}
    for node in NODES:
        pages[node] = PageServer()
        stack.callback(pages[node].close)
        pages[node].page = dcgm_page(node).encode()
        kmsg[node] = tmp / f"kmsg-{node}.log"
        kmsg[node].write_text("")
        agent_ports[node] = free_port()
    server_env = {"VIGIL_HOME": str(tmp / "home"), "VIGIL_API_TOKEN": TOKEN, "VIGIL_ENGINE_INTERVAL_S": "0.5",
                  "VIGIL_ALERTMANAGER_URL": f"http://127.0.0.1:{am_port}", "VIGIL_ALERT_RESEND_S": "5"}
    if prometheus:
        prom_bin = require_binary("prometheus")
        prom_port = free_port()
        targets = ", ".join(f'"127.0.0.1:{p}"' for p in agent_ports.values())
        (tmp / "prometheus.yml").write_text(PROMETHEUS.format(targets=targets))
        logs.append(tmp / "prometheus.log")
        start(stack, [prom_bin, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                      f"--web.listen-address=127.0.0.1:{prom_port}"], logs[-1])
        server_env["VIGIL_METRICS_URL"] = f"http://127.0.0.1:{prom_port}"
    start(stack, [sys.executable, "-m", "vigil", "serve", "--port", str(port)], logs[1], vigil_env(**server_env))
    url = f"http://127.0.0.1:{port}"
    cluster = LiveCluster(url, f"http://127.0.0.1:{am_port}", tmp, pages, kmsg, prometheus, logs,
                          {node: f"http://127.0.0.1:{p}/metrics" for node, p in agent_ports.items()})
    cluster.wait(lambda: answers(url + "/api/v1/health"), 60, "vigil serve to answer")
    for node in NODES:
        logs.append(tmp / f"agent-{node}.log")
        start(stack, [sys.executable, "-m", "vigil", "agent", "--interval", "0.5", "--port", str(agent_ports[node]),
                      "--dcgm-url", pages[node].url + "/metrics", "--server", url,
                      "--kmsg-file", str(kmsg[node])], logs[-1],
              vigil_env(VIGIL_AGENT_NODE=node, VIGIL_AGENT_SERVER_TOKEN=TOKEN, VIGIL_AGENT_PUSH_INTERVAL_S="0.5",
                        VIGIL_AGENT_PUSH_SAMPLES="false" if prometheus else "true"))
    cluster.wait(lambda: answers(cluster.alertmanager + "/-/ready"), 60, "Alertmanager to be ready")
    cluster.wait(lambda: sorted(n["name"] for n in cluster.get("/api/v1/nodes")) == list(NODES)
                 and all(len(n["gpus"]) == 4 for n in cluster.get("/api/v1/nodes")), 60,
                 "both agents to register their GPUs")
    return cluster


@pytest.fixture(params=[False, True], ids=["agent-push", "prometheus"])
def live(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LiveCluster]:
    with ExitStack() as stack:
        yield _start_cluster(tmp_path, stack, prometheus=request.param)


def _ticks(cluster: LiveCluster) -> int:
    return int(cluster.get("/api/v1/engine")["ticks"])


def test_faults_written_as_machines_write_them_become_incidents(live: LiveCluster) -> None:
    if live.prometheus:
        query = "/api/v1/metrics/query?query=DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
        live.wait(lambda: answers(live.url + query, TOKEN) and len(live.get(query)) == 8, 60,
                  "Prometheus to hold both agents' GPUs")
    else:
        live.wait(lambda: live.get("/api/v1/engine")["pushes"] >= 4, 60, "the engine to read both agents")
    # Healthy: the engine goes round many times over both nodes and opens nothing.
    start = _ticks(live)
    live.wait(lambda: _ticks(live) >= start + 20, 60, "20 rounds of the engine")
    assert live.incidents() == []

    live.write_kernel("n01", xid_line(gpu=1, code=79))
    live.set_page("n02", dbe={2: 1})
    live.wait(lambda: len(live.incidents()) == 2, 90, "two incidents")
    incidents = {i["scope"]: i for i in live.incidents()}
    assert set(incidents) == {"gpu/n01/1", "gpu/n02/2"}
    assert incidents["gpu/n01/1"]["fault_types"] == ["gpu_lost"]
    assert incidents["gpu/n02/2"]["fault_types"] == ["gpu_dbe"]
    for scope, incident in incidents.items():
        diagnosis = live.diagnosis(incident["id"])
        assert diagnosis["root_cause"]["entity"] == scope
        assert diagnosis["root_cause"]["fault_type"] == incident["fault_types"][0]
        node = "node/" + scope.split("/")[1]
        actions = live.actions(incident["id"], ("cordon", node))
        assert all(a["status"] == "proposed" and a["dry_run"] for a in actions)
    live.wait(lambda: len(live.alerts()) == 2, 30, "Alertmanager to hold both incidents")
    labels = sorted((a["labels"]["node"], a["labels"]["gpu"], a["labels"]["fault"], a["labels"]["severity"])
                    for a in live.alerts())
    assert labels == [("n01", "1", "gpu_lost", "critical"), ("n02", "2", "gpu_dbe", "critical")]
    # /metrics reads the server's heat-map snapshot, which is up to cache_ttl_s (1 s) old: an incident stored
    # within that second (the alert can reach Alertmanager sooner) shows on a later scrape.
    live.wait(lambda: re.search(r"^vigil_gpu_fault_level\{gpu=\"1\",node=\"n01\"\} 4\.0$",
                                httpx.get(live.url + "/metrics").text, re.M) is not None,
              10, "the exporter to show gpu/n01/1 at level 4")
