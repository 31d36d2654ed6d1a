"""Two engines on one PostgreSQL store: one judges, holding the store's engine lease (vigil.run.engine.LEASE), the
other stands by; killed, the active one's place is taken by the other, which reads on from the cursor - no event is
judged twice (each incident alerted once) and none is lost."""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.run.engine_process import EngineProcess
from tests.run.engine_site import Site
from tests.serve.conftest import REPO, fresh_database
from tests.serve.conftest import postgres_url as postgres_url
from vigil.remedy.commands import this_host
from vigil.run.engine import CURSOR, LEASE
from vigil.store.sql import LeaseLost

pytestmark = pytest.mark.slow


class Webhook:
    """A Slack-compatible webhook receiver: the texts posted to it, in order."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        received = self.texts

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                received.append(json.loads(body)["text"])
                self.send_response(200)
                self.end_headers()

            def log_message(self, *_args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def about(self, node: str) -> list[str]:
        return [text for text in self.texts if node in text]


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    hook = Webhook()
    yield hook
    hook.server.shutdown()


def test_one_of_two_engines_judges_and_the_other_takes_over_when_it_is_killed(
        postgres_url: str, tmp_path: Path, webhook: Webhook) -> None:
    """Engine A takes the lease, B stands by (one line); an Xid on n01 is alerted once, by A, while both run. A is
    killed (SIGKILL); B takes over (one line), reads on from the cursor A saved: an Xid on n02 stored after the kill
    is alerted once, the n01 one not again. Before, both engines judged every row: each incident alerted twice."""
    site = Site(fresh_database(postgres_url, "two_engines"), tmp_path / "site")
    env = {**os.environ, "VIGIL_HOME": str(tmp_path / "home"), "VIGIL_DB_URL": site.store.url,
           "VIGIL_ENGINE_INTERVAL_S": "0.2", "VIGIL_REMEDY_LEASE_S": "5", "VIGIL_REMEDY_LEASE_RENEW_S": "1",
           "VIGIL_RESOLVE_AFTER_S": "3600", "VIGIL_ALERT_WEBHOOK_URL": webhook.url, "PYTHONPATH": str(REPO)}

    def ticks() -> int:
        return int(site.store.cursor(CURSOR)[1].get("ticks", 0))

    first = EngineProcess(env)
    second: EngineProcess | None = None
    try:
        wait_for(lambda: first.said("vigil engine on"), 120, "engine A to run")
        second = EngineProcess(env)
        wait_for(lambda: second is not None and second.said("standing by"), 120, "engine B to stand by")
        site.store.add_events([site.xid("n01", 1)])
        wait_for(lambda: len(webhook.about("n01")) >= 1, 60, "the n01 Xid to be alerted")
        seen = ticks()
        wait_for(lambda: ticks() >= seen + 5, 60, "five more ticks of engine A")
        assert len(webhook.about("n01")) == 1, webhook.texts
        holder = site.store.lease_holder(LEASE)
        assert holder is not None and holder[0].rsplit(":", 2)[:2] == [this_host(), str(first.process.pid)]
        first.process.send_signal(signal.SIGKILL)
        first.end()
        site.store.add_events([site.xid("n02", 2)])
        wait_for(lambda: second is not None and second.said("taking over from engine"), 60, "engine B to take over")
        wait_for(lambda: len(webhook.about("n02")) >= 1, 60, "the n02 Xid to be alerted")
        seen = ticks()
        wait_for(lambda: ticks() >= seen + 5, 60, "five more ticks of engine B")
    finally:
        first.end()
        if second is not None:
            second.end()
    assert (len(webhook.about("n01")), len(webhook.about("n02"))) == (1, 1), webhook.texts
    assert len(site.store.anomalies()) == 2
    assert [line for line in second.lines if "standing by" in line][:1] and len(
        [line for line in second.lines if "standing by" in line]) == 1
    site.store.close()


def test_an_engine_that_lost_its_lease_writes_no_cursor(postgres_url: str, tmp_path: Path) -> None:
    """An engine that stalled past its lease while another (another host's) took over: its next tick ends in
    LeaseLost and its cursor write is refused, so it cannot move the cursor from under the new holder; an engine of
    another host stands by while the lease holds, and takes it once it lapses."""
    site = Site(fresh_database(postgres_url, "lease_lost"), tmp_path)
    active = site.engine()
    assert active.start()
    other = site.engine()
    other.owner = "other-host:1"
    assert not other.start(wait=False) and other.standing_by == active.owner
    assert other.tick().standby
    # the active one stalls past its lease: the other takes over
    position, state = site.store.cursor(LEASE)
    site.store.set_cursor(LEASE, 0.0, state)
    assert other.start(wait=False) and other.standing_by is None
    site.store.add_events([site.xid("n01", 1)])
    with pytest.raises(LeaseLost):
        active.tick()
    with pytest.raises(LeaseLost):
        active._save_cursor()
    assert other.tick().events == 1
    assert site.store.cursor(CURSOR)[1]["events"] == other.event_cursor.id
    site.store.close()
