"""The samples pushes the server has not taken outlive the agent: each written to the spool's samples queue before
it is first sent, removed once it leaves the backlog, and sent after a restart oldest first, each under its key, so
the server stores each once - against the server's real app on real HTTP, the agent a real process killed with
SIGKILL while the server is away or while it holds the answer to a push it stored; bounded like the backlog, the
oldest dropped and counted."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.collect.conftest import TOKEN, agent_process
from tests.conftest import wait_for
from tests.serve.conftest import serve_in_thread
from vigil.sources.collect.agent import BACKLOG_FULL, EXPIRED, EventPusher
from vigil.sources.collect.spool import SPOOL_FILE, EventSpool


def spooled_samples(state: Path) -> list[float]:
    """The time of each samples push held in an agent's spool, oldest first, read as another process reads it."""
    path = state / SPOOL_FILE
    if not path.exists():
        return []
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT body FROM samples ORDER BY made, id").fetchall()
    except sqlite3.Error:
        return []
    finally:
        conn.close()
    return [json.loads(body)["samples"][0]["ts"] for (body,) in rows]


class SamplesSwitch:
    """The server's real app behind a switch on its samples route: ``down`` answers 503 storing nothing, ``held``
    lets the app store the push and keeps its answer until ``release`` is set (the agent waiting on a push the server
    has stored); ``keys`` lists the Idempotency-Key of every samples POST, ``held_keys`` those of the pushes held."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.mode = "up"
        self.posts: list[str] = []
        self.keys: list[str] = []
        self.held_keys: list[str] = []
        self.release = threading.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].endswith("/api/v1/samples"):
            await self.app(scope, receive, send)
            return
        mode = self.mode
        self.posts.append(mode)
        self.keys.append(dict(scope["headers"]).get(b"idempotency-key", b"").decode())
        if mode == "up":
            await self.app(scope, receive, send)
            return
        if mode == "held":
            async def swallow(message: dict[str, Any]) -> None:
                pass

            await self.app(scope, receive, swallow)
            self.held_keys.append(self.keys[-1])
            while not self.release.is_set():
                await asyncio.sleep(0.05)
        else:
            while (await receive()).get("more_body"):
                pass
        await send({"type": "http.response.start", "status": 503, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"unavailable"})


@contextmanager
def samples_agent(url: str, state: Path, log: Path, **env: str) -> Iterator[subprocess.Popen[bytes]]:
    """`vigil agent` pushing its host samples every 0.2 s (no events source but an empty kernel log file)."""
    kmsg = state.parent / "kern.log"
    kmsg.touch()
    with agent_process(url, kmsg, state, log, VIGIL_AGENT_INTERVALS='{"kernel": 0.2, "host": 0.2}',
                        VIGIL_AGENT_PUSH_SAMPLES="true", VIGIL_AGENT_SAMPLES_BACKLOG_PUSHES="1000", **env) as process:
        yield process


@pytest.mark.slow
def test_an_agent_killed_while_the_server_is_away_sends_its_samples_backlog_after_its_restart_once_in_order(
    tmp_path: Path,
) -> None:
    """The server's samples route is away while the agent makes at least 8 pushes; the agent is killed (SIGKILL).
    Started again with the server back, it sends the pushes its spool held: each stored once, oldest first, after
    the new agent's own first push (before: the backlog lived in memory and died with the process)."""
    from vigil.config import Settings
    from vigil.faces.api.app import create_app
    from vigil.store.sql import Store

    settings = Settings(home=tmp_path / "home", api_token=TOKEN)
    store = Store(settings.database_url())
    switch = SamplesSwitch(create_app(store, settings=settings))
    state, log = tmp_path / "state", tmp_path / "agent.log"
    with serve_in_thread(switch) as url:
        switch.mode = "down"
        with samples_agent(url, state, log) as agent:
            wait_for(lambda: len(spooled_samples(state)) >= 8, 60, "8 samples pushes spooled, the server away")
            agent.send_signal(signal.SIGKILL)
            agent.wait(timeout=30)
        held = spooled_samples(state)
        assert store.pushes_after(0) == [] and held == sorted(held) and len(set(held)) == len(held)
        switch.mode = "up"
        with samples_agent(url, state, log) as agent:
            wait_for(lambda: spooled_samples(state) == [] and len(store.pushes_after(0)) > len(held), 60,
                     "the spooled pushes sent")
            agent.send_signal(signal.SIGTERM)
            assert agent.wait(timeout=30) == 0
    stored = [p.ts for p in store.pushes_after(0)]
    assert [ts for ts in stored if ts in held] == held, (stored, held, log.read_text()[-3000:])
    assert len(stored) == len(set(stored))  # none stored twice
    store.close()


def spooled_keys(state: Path) -> list[str]:
    """The key of each samples push held in an agent's spool, read as another process reads it."""
    path = state / SPOOL_FILE
    if not path.exists():
        return []
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return [key for (key,) in conn.execute("SELECT key FROM samples ORDER BY id")]
    except sqlite3.Error:
        return []
    finally:
        conn.close()


@pytest.mark.slow
def test_an_agent_killed_while_the_server_holds_the_answer_to_its_push_sends_it_again_after_its_restart_stored_once(
    tmp_path: Path,
) -> None:
    """The server stores the agent's first samples push and holds its answer; the agent, waiting on it, is killed
    (SIGKILL). The push is on disk already (before: it was written only once the request failed, 5 s later, and died
    with the process). Started again with the server answering, the agent sends it again under its key and the
    server stores it once: the push is in the store once, its key was posted twice, and the spool is left empty."""
    from vigil.config import Settings
    from vigil.faces.api.app import create_app
    from vigil.store.sql import Store

    settings = Settings(home=tmp_path / "home", api_token=TOKEN)
    store = Store(settings.database_url())
    switch = SamplesSwitch(create_app(store, settings=settings))
    state, log = tmp_path / "state", tmp_path / "agent.log"
    with serve_in_thread(switch) as url:
        switch.mode = "held"
        with samples_agent(url, state, log) as agent:
            wait_for(lambda: len(switch.held_keys) == 1, 60, "the first samples push stored, its answer held")
            agent.send_signal(signal.SIGKILL)
            agent.wait(timeout=30)
        key = switch.held_keys[0]
        stored = store.pushes_after(0)
        assert len(stored) == 1 and spooled_keys(state) == [key], (spooled_keys(state), log.read_text()[-3000:])
        switch.mode = "up"
        switch.release.set()
        with samples_agent(url, state, log) as agent:
            wait_for(lambda: spooled_keys(state) == [] and switch.keys.count(key) == 2
                     and len(store.pushes_after(0)) >= 2, 60, "the spooled push sent again and a new one stored")
            agent.send_signal(signal.SIGTERM)
            assert agent.wait(timeout=30) == 0
    pushes = store.pushes_after(0)
    assert [p.ts for p in pushes].count(stored[0].ts) == 1, ([p.ts for p in pushes], log.read_text()[-3000:])
    assert len({p.ts for p in pushes}) == len(pushes)  # none stored twice
    store.close()


def _pusher(state: Path, answer: int, clock: list[float], **limits: Any) -> tuple[EventPusher, EventSpool]:
    spool = EventSpool(state, 100, 2**20)
    pusher = EventPusher("http://vigil.test", clock=lambda: clock[0], wall=lambda: 1_000_000.0 + clock[0],
                         backlog_pushes=limits.get("pushes", 5), backlog_bytes=limits.get("bytes", 2**20),
                         backlog_age_s=limits.get("age", 300.0))
    pusher._client = httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(answer, json={})))
    pusher.attach_spool(spool.samples(limits.get("pushes", 5), limits.get("bytes", 2**20)))
    return pusher, spool


def _sample_round(pusher: EventPusher, ts: float) -> None:
    from vigil.model import Sample

    pusher._post([], lambda _: None, [Sample(ts=ts, entity="node/n01", metric="m", value=1.0)], "n01", None)


def test_the_spooled_backlog_is_bounded_the_oldest_dropped_counted_and_expired_by_wall_time_on_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """A push the server takes leaves the disk with its answer. Past the backlog's count (or bytes) the oldest push
    leaves the disk too, counted as backlog_full and warned once; an agent started 285 s after the last push keeps
    the pushes younger than the age limit (300 s, from when each was made) and drops the older, counted as
    expired."""
    state, clock = tmp_path / "state", [0.0]
    pusher, spool = _pusher(state, 201, clock)
    _sample_round(pusher, 1.0)
    assert spooled_samples(state) == [] and pusher.samples_pushes_sent == 1
    spool.close()
    pusher, spool = _pusher(state, 503, clock)
    for ts in range(10, 17):
        clock[0] = float(ts * 10)
        _sample_round(pusher, float(ts))
    assert spooled_samples(state) == [12.0, 13.0, 14.0, 15.0, 16.0]
    assert pusher.samples_pushes_dropped[BACKLOG_FULL] == 2 and "dropped" in caplog.text
    spool.close()
    clock[0] = 445.0  # pushes made at 120..160 (wall clock 1,000,120..): 325..285 s ago
    pusher, spool = _pusher(state, 201, clock)
    assert pusher.samples_pushes_dropped[EXPIRED] == 3 and spooled_samples(state) == [15.0, 16.0]
    assert "held from before this start" in caplog.text
    _sample_round(pusher, 17.0)
    assert spooled_samples(state) == [] and pusher.samples_pushes_sent == 3
    spool.close()
    small_state = tmp_path / "bytes"
    pusher, spool = _pusher(small_state, 503, clock, pushes=100, bytes=300)
    for ts in range(20, 25):
        _sample_round(pusher, float(ts))
    assert spooled_samples(small_state) == [22.0, 23.0, 24.0] and pusher.samples_pushes_dropped[BACKLOG_FULL] == 2
    assert pusher.backlog_bytes <= 300 and pusher.spool is not None and pusher.spool.bytes <= 300
    spool.close()
