"""Fixtures for the collector tests: a real local HTTP server that serves whatever page a test sets."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from vigil.model import entity_kind
from vigil.sources.collect.agent import AgentSettings
from vigil.sources.collect.base import Collection
from vigil.store.metrics import MetricFrame

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "collect"


class PageServer:
    def __init__(self) -> None:
        self.page = b""
        self.status = 200
        self.received: list[bytes] = []
        self.headers: list[dict[str, str]] = []
        self.paths: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                self.send_response(server.status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(server.page)))
                self.end_headers()
                self.wfile.write(server.page)

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                server.received.append(body)
                server.paths.append(self.path)
                server.headers.append(dict(self.headers))
                self.send_response(server.status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def page_server() -> Iterator[PageServer]:
    server = PageServer()
    yield server
    server.close()


@pytest.fixture
def dcgm_page() -> str:
    return (FIXTURES / "dcgm_exporter_page.txt").read_text()


def fast_settings(**overrides: object) -> AgentSettings:
    base: dict[str, object] = {
        "node": "n01",
        "intervals": {"host": 0.1, "gpu": 0.1, "network": 0.1, "kernel": 0.1},
        "timeout_s": 10.0,
        "load_check_s": 0.05,
        "port": 0,
        "dcgm_url": "",
    }
    base.update(overrides)
    return AgentSettings(**base)  # type: ignore[arg-type]


def frames(collection: Collection, ts: float) -> list[MetricFrame]:
    """A collection's points as one metric frame per family (gpu, node, nic), the shape the rules read."""
    by_family: dict[str, dict[tuple[str, str], float]] = {}
    for point in collection.points:
        by_family.setdefault(entity_kind(point.entity), {})[(point.entity, point.metric)] = point.value
    out = []
    for family, values in sorted(by_family.items()):
        entities = sorted({e for e, _ in values})
        metrics = sorted({m for _, m in values})
        matrix = np.full((len(entities), len(metrics)), np.nan, dtype=np.float32)
        for (entity, metric), value in values.items():
            matrix[entities.index(entity), metrics.index(metric)] = value
        out.append(MetricFrame(ts, family, entities, metrics, matrix))
    return out
