"""A real Prometheus scrapes the agent's /metrics: the names, labels and label hygiene survive the trip."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.collect.conftest import fast_settings
from tests.conftest import free_port, require_binary
from vigil.sources.collect.agent import Agent
from vigil.sources.collect.dcgm import DcgmExporterScraper
from vigil.sources.collect.host import HostCollector

pytestmark = pytest.mark.slow


def query(base: str, expr: str) -> list[dict]:
    response = httpx.get(f"{base}/api/v1/query", params={"query": expr}, timeout=10)
    response.raise_for_status()
    return response.json()["data"]["result"]


def test_prometheus_scrapes_the_agent(page_server, dcgm_page, tmp_path: Path) -> None:
    binary = require_binary("prometheus")
    page_server.page = dcgm_page.encode()
    agent = Agent(
        [HostCollector(node="n01"), DcgmExporterScraper(f"{page_server.url}/metrics", node="n01")],
        fast_settings(),
        cpu_ratio=lambda: 0.1,
    )
    agent.collect_once()
    server, agent_port = agent.serve(port=0)
    prom_port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, scrape_timeout: 1s}\n"
        f"scrape_configs: [{{job_name: vigil-agent, static_configs: [{{targets: ['127.0.0.1:{agent_port}']}}]}}]\n"
    )
    log = (tmp_path / "prometheus.log").open("w")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{prom_port}"
    try:
        deadline = time.monotonic() + 90
        found: list[dict] = []
        while time.monotonic() < deadline:
            try:
                found = query(base, 'DCGM_FI_DEV_GPU_TEMP{gpu="1"}')
            except httpx.HTTPError:
                found = []
            if found:
                break
            time.sleep(0.5)
        assert found, (tmp_path / "prometheus.log").read_text()[-2000:]
        [series] = found
        assert float(series["value"][1]) == 83
        assert series["metric"]["node"] == "n01" and series["metric"]["pod"] == "trainer"
        assert "UUID" not in series["metric"] and "Hostname" not in series["metric"]
        assert query(base, "vigil_node_up")[0]["value"][1] == "1"
        assert float(query(base, 'vigil_agent_source_up{source="dcgm"}')[0]["value"][1]) == 1
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()
        server.shutdown()
        agent.close()
