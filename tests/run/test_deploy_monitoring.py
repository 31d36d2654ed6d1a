"""The shipped monitoring: Prometheus alert rules load in the real Prometheus (promtool and a running server),
and every Grafana dashboard is well-formed with queries the real Prometheus accepts."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import require_binary
from tests.run.live_processes import answers, start
from tests.serve.conftest import REPO, free_port, wait_for

pytestmark = pytest.mark.slow

RULES = sorted((REPO / "deploy" / "prometheus").glob("*.yml"))
DASHBOARDS = sorted((REPO / "deploy" / "grafana").glob("*.json"))


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = require_binary("prometheus")
    tmp = tmp_path_factory.mktemp("prometheus")
    port = free_port()
    files = ", ".join(f'"{r}"' for r in RULES)
    (tmp / "prometheus.yml").write_text(f"global: {{evaluation_interval: 1s}}\nrule_files: [{files}]\n")
    with ExitStack() as stack:
        start(stack, [binary, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                      f"--web.listen-address=127.0.0.1:{port}"], tmp / "prometheus.log")
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: answers(url + "/-/ready"), 60, "Prometheus to be ready")
        yield url


def test_rules_pass_promtool() -> None:
    assert RULES
    promtool = require_binary("promtool")
    done = subprocess.run([promtool, "check", "rules", *map(str, RULES)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_rules_load_in_prometheus(prometheus: str) -> None:
    groups = httpx.get(prometheus + "/api/v1/rules").json()["data"]["groups"]
    loaded = {rule["name"] for group in groups for rule in group["rules"]}
    assert {"VigilEngineStalled", "VigilAgentDown", "VigilGpuIsolate"} <= loaded
    assert all(rule["health"] != "err" for group in groups for rule in group["rules"])


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dashboard["panels"] if p.get("type") != "row"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_dashboard_is_valid(path: Path, prometheus: str) -> None:
    dashboard = json.loads(path.read_text())
    assert {"uid", "title", "panels", "schemaVersion", "templating"} <= set(dashboard)
    assert dashboard["uid"].startswith("vigil-") and len(dashboard["uid"]) <= 40
    ids = [p["id"] for p in _panels(dashboard)]
    assert len(ids) == len(set(ids)) and ids
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    for panel in _panels(dashboard):
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
        for target in panel["targets"]:
            expr = target["expr"]
            for name in variables:
                expr = expr.replace(f"${name}", ".*")
            assert "$" not in expr, f"{panel['title']}: unknown variable in {target['expr']}"
            answer = httpx.get(prometheus + "/api/v1/query", params={"query": expr}).json()
            assert answer["status"] == "success", f"{path.name} {panel['title']}: {answer.get('error')}"
