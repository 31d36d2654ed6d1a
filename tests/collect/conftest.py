"""Fixtures for the collector tests: a real local HTTP server that serves whatever page a test sets, and what the
agent tests share - a counting source, the server's app over a real store, a push round, the agent as a real
process on a kernel log file and its spool read as another process reads it."""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import REPO
from vigil.model import Event, FaultLevel, Node, Sample, entity_kind
from vigil.sources.collect.agent import Agent, AgentExposition, AgentSettings
from vigil.sources.collect.base import Collection, Source
from vigil.sources.collect.spool import SPOOL_FILE
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


class CountingSource(Source):
    name = "counting"
    kind = "host"

    def __init__(self, name: str = "counting", kind: str = "host") -> None:
        self.name, self.kind = name, kind
        super().__init__()
        self.reads = 0

    def collect(self, now: float) -> Collection:
        self.reads += 1
        out = Collection()
        out.add("vigil_node_load1", "node/n01", self.reads)
        return out


TOKEN = "refusals-token"


def server_app(tmp_path: Path, token: str = TOKEN, sent: str = TOKEN) -> tuple[Any, Any]:
    """The server's app over a real store, in this process, taking ``token``; its client sends ``sent``."""
    from fastapi.testclient import TestClient

    from vigil.config import Settings
    from vigil.faces.api.app import create_app
    from vigil.store.sql import Store

    settings = Settings(home=tmp_path, api_token=token)
    store = Store(settings.database_url())
    client = TestClient(create_app(store, settings=settings), base_url="http://vigil.test",
                        headers={"Authorization": f"Bearer {sent}"} if sent else {})
    return client, store


def xid(ts: float) -> Event:
    return Event(ts=ts, entity="gpu/n01/0", kind="xid", source="kernel", level=FaultLevel.DRAIN, attrs={"xid": 119},
                 message=f"Xid 119 at {ts}")


def push_round(agent: Agent, ts: float, events: list[Event] | None = None, inventory: Node | None = None) -> None:
    """One push round of the agent, as its loop makes it, in this thread: the queued events (and ``events``), a
    samples push of one sample taken at ``ts``."""
    pusher = agent._pusher
    assert pusher is not None
    batch, agent.pending_events = agent.pending_events + (events or []), []
    pusher._post(batch, agent._requeue, [Sample(ts=ts, entity="node/n01", metric="vigil_node_load1", value=ts)],
                 "n01", inventory)


def agent_with_client(client: Any, token: str = TOKEN) -> Agent:
    agent = Agent([CountingSource()], fast_settings(server_url="http://vigil.test", server_token=token),
                  cpu_ratio=lambda: 0.1)
    assert agent._pusher is not None
    agent._pusher._client = client
    return agent


def dropped_refused(agent: Agent, reason: str = "batch_refused") -> float:
    return next(s.value for family in AgentExposition(agent).collect() for s in family.samples
                if s.name == "vigil_agent_events_dropped_total" and s.labels == {"reason": reason})


def warnings_with(caplog: pytest.LogCaptureFixture, words: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and words in r.getMessage()]


def held_events(state: Path) -> int:
    """Events in an agent's spool, read as another process reads it (the agent's WAL included)."""
    path = state / SPOOL_FILE
    if not path.exists():
        return -1
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return int(conn.execute("SELECT count(*) FROM events").fetchone()[0])
    except sqlite3.Error:
        return -1
    finally:
        conn.close()


def died_writing(spool: Path, into: Path, name: str = SPOOL_FILE) -> None:
    """Copy the SQLite file ``spool`` to ``into / name`` as a program that died writing to it left it (a sqlite3
    shell in rollback-journal mode): pages of a transaction never committed in the file, a hot ``-journal`` beside
    it holding the pages as they were, which SQLite rolls back at the next open to write."""
    shell = sqlite3.connect(spool, isolation_level=None)
    try:
        shell.execute("PRAGMA journal_mode=DELETE")
        shell.execute("PRAGMA cache_size=1")  # pages spill into the file before the commit
        shell.execute("BEGIN")
        shell.executemany("INSERT INTO events (body) VALUES (?)", [("x" * 1000,)] * 200)
        into.mkdir(parents=True, exist_ok=True)
        for suffix in ("", "-journal"):
            shutil.copy(f"{spool}{suffix}", into / f"{name}{suffix}")
        shell.execute("ROLLBACK")
    finally:
        shell.close()


class Switch:
    """The server's real app behind a switch on its events route: ``up`` passes every request, ``down`` answers
    503 storing nothing (the server away), ``lost`` lets the app store the events and answers 503 in place of its
    answer (the answer lost on the way back: the agent cannot know they were stored)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.mode = "up"
        self.events_posts: list[tuple[str, int]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].endswith("/api/v1/events"):
            await self.app(scope, receive, send)
            return
        mode = self.mode
        answered: list[int] = []

        async def swallow(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                answered.append(message["status"])

        if mode == "down":
            while (await receive()).get("more_body"):
                pass
        elif mode == "lost":
            await self.app(scope, receive, swallow)
        else:
            await self.app(scope, receive, send)
            self.events_posts.append((mode, 0))
            return
        self.events_posts.append((mode, answered[0] if answered else 0))
        await send({"type": "http.response.start", "status": 503, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"unavailable"})


def xid_line(i: int) -> str:
    return f"[ {100 + i}.5] NVRM: Xid (PCI:0000:18:00): 13, pid={1000 + i}, name=train, Graphics Exception {i}\n"


@contextmanager
def agent_process(url: str, kmsg: Path, state: Path, log: Path, **overrides: str) -> Iterator[subprocess.Popen[bytes]]:
    """`vigil agent` on node n01 following ``kmsg``, its spool under ``state``; ``overrides``: environment settings."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "VIGIL_AGENT_NODE": "n01", "VIGIL_AGENT_SERVER_TOKEN": TOKEN,
           "VIGIL_AGENT_PUSH_INTERVAL_S": "0.2", "VIGIL_AGENT_INTERVALS": '{"kernel": 0.1}',
           "VIGIL_AGENT_PUSH_SAMPLES": "false", **overrides}
    with log.open("ab") as out:
        process = subprocess.Popen([sys.executable, "-m", "vigil", "agent", "--server", url, "--kmsg-file", str(kmsg),
                                    "--dcgm-url", "", "--port", "0", "--state-dir", str(state)],
                                   env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)
