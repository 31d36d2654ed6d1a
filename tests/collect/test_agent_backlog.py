"""The agent's backlog of samples pushes the server has not taken: kept through an outage (the server unreachable,
failing, or its answer lost after it stored a push), each push under its own Idempotency-Key, sent again oldest
first once the server answers, the oldest dropped beyond the backlog's limits (count, bytes, age) with one warning
an episode. Against the real server: its app under uvicorn over a real store, stopped and started again on its
port, or answering 503 in front of its route."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.collect.conftest import CountingSource, fast_settings
from tests.conftest import free_port, wait_for
from vigil.config import Settings
from vigil.faces.api.app import create_app
from vigil.model import Sample
from vigil.sources.collect.agent import (
    BACKLOG_FULL,
    EXPIRED,
    IDEMPOTENCY_KEY_HEADER,
    REFUSED,
    Agent,
    AgentExposition,
    AgentSettings,
    EventPusher,
)
from vigil.store.sql import Store

TOKEN = "backlog-token"
LOOK = 1767226000.0  # the first push's time; push i is taken at LOOK + i


class OutageSwitch:
    """The server's app behind a switch: "up" serves, "failing" answers samples pushes 503 without storing them, "lost"
    stores them and answers 503 (the answer lost on the way back), "lose_one" does so once and then serves. Every
    samples push that reaches it is listed as (key, the push's number: its time less LOOK)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.mode = "up"
        self.seen: list[tuple[str, float]] = []

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] != "http" or not scope["path"].endswith("/samples"):
            await self.app(scope, receive, send)
            return
        chunks, more = [], True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        key = dict(scope["headers"]).get(IDEMPOTENCY_KEY_HEADER.lower().encode(), b"").decode()
        self.seen.append((key, json.loads(body)["samples"][0]["ts"] - LOOK))
        if self.mode == "failing":
            await send({"type": "http.response.start", "status": 503, "headers": []})
            await send({"type": "http.response.body", "body": b"down for maintenance"})
            return
        given = False

        async def replay() -> dict[str, Any]:
            nonlocal given
            if given:
                return await receive()
            given = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def answer(message: dict[str, Any]) -> None:
            if self.mode in ("lost", "lose_one") and message["type"] == "http.response.start":
                message = {**message, "status": 503}
                if self.mode == "lose_one":
                    self.mode = "up"
            await send(message)

        await self.app(scope, replay, answer)


class RealServer:
    """The Vigil server's app under uvicorn on one loopback port, over a real SQLite store; ``stop`` closes the port
    (the agent's connections are refused) and ``start`` opens it again."""

    def __init__(self, tmp_path: Path) -> None:
        settings = Settings(home=tmp_path, api_token=TOKEN)
        self.store = Store(settings.database_url())
        self.switch = OutageSwitch(create_app(self.store, settings=settings))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        import uvicorn

        self._server = uvicorn.Server(uvicorn.Config(self.switch, host="127.0.0.1", port=self.port,  # type: ignore[arg-type]
                                                     log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        wait_for(lambda: self._server.started, 30, "uvicorn to start")

    def stop(self) -> None:
        assert self._thread is not None
        self._server.should_exit = True
        self._thread.join(timeout=30)
        assert not self._thread.is_alive()

    def stored(self) -> list[int]:
        """The numbers of the node's pushes the store holds, in the order it stored them."""
        return [round(p.ts - LOOK) for p in self.store.pushes_after(0) if p.node == "n01"]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RealServer]:
    real = RealServer(tmp_path)
    real.start()
    yield real
    if real._thread is not None and real._thread.is_alive():
        real.stop()
    real.store.close()


def push_round(pusher: EventPusher, number: int) -> None:
    """One push round of the agent (no events): a push of one sample taken at LOOK + number."""
    pusher._post([], lambda events: None,
                 [Sample(ts=LOOK + number, entity="node/n01", metric="vigil_node_load1", value=1.0)], "n01", None)


def test_a_backlog_kept_through_an_outage_is_delivered_newest_first_then_oldest_first_and_stored_once(
        server: RealServer) -> None:
    """Pushes 1-2 taken; the server unreachable for 3-6 and failing (503) for 7-8; at 9 it stores push 9 and its
    answer is lost; from 10 it answers. Every push is stored once - each round's own push first (the server's live
    view fresh at once), then the backlog in the order it was taken - and each was sent under one key however often
    (before: only the newest unanswered push was kept, so 3-7 were lost; then the backlog went before the round's
    own push)."""
    pusher = EventPusher(server.url, TOKEN)
    for number in (1, 2):
        push_round(pusher, number)
    server.stop()
    for number in range(3, 7):
        push_round(pusher, number)
    assert [round(json.loads(p.body)["samples"][0]["ts"] - LOOK) for p in pusher.backlog] == [3, 4, 5, 6]
    server.switch.mode = "failing"
    server.start()
    for number in (7, 8):
        push_round(pusher, number)
    server.switch.mode = "lost"
    push_round(pusher, 9)
    server.switch.mode = "up"
    push_round(pusher, 10)
    assert server.stored() == [1, 2, 9, 10, *range(3, 9)]
    sent = [number for _, number in server.switch.seen]
    # each round sends its own push first, then the oldest first, and stops at the first push without an answer
    assert sent == [1, 2, 7, 8, 9, 10, *range(3, 10)]  # 7 and 8 failing, 9 lost, then all
    keys: dict[float, set[str]] = {}
    for key, number in server.switch.seen:
        keys.setdefault(number, set()).add(key)
    assert all(len(k) == 1 for k in keys.values()) and len({k for ks in keys.values() for k in ks}) == 10
    assert not pusher.backlog and pusher.backlog_bytes == 0 and pusher.samples_pushes_sent == 10
    assert pusher.samples_pushes_dropped == {BACKLOG_FULL: 0, EXPIRED: 0, REFUSED: 0}


def test_the_agent_loop_delivers_every_push_once_through_an_outage(server: RealServer) -> None:
    """The agent's own loop and push thread: pushes taken, the server stopped until at least 5 wait, started again
    losing the answer to the first push it stores (the round's own, newer than all waiting). Every push the agent
    made is stored once, the waiting ones in the order taken, each under one key."""
    agent = Agent([CountingSource()], fast_settings(server_url=server.url, server_token=TOKEN, push_interval_s=0.05),
                  cpu_ratio=lambda: 0.1)
    pusher = agent._pusher
    assert pusher is not None

    def steps_until(condition: Callable[[], bool], what: str) -> None:
        wait_for(lambda: (agent.step(), not pusher.busy and condition())[1], 60, what, interval_s=0.02)

    try:
        steps_until(lambda: pusher.samples_pushes_sent >= 2, "two pushes taken")
        server.stop()
        before = len(server.switch.seen)
        steps_until(lambda: len(pusher.backlog) >= 5, "five pushes waiting")
        waited = len(pusher.backlog)
        waiting = [json.loads(p.body)["samples"][0]["ts"] - LOOK for p in pusher.backlog]
        server.switch.mode = "lose_one"
        server.start()
        steps_until(lambda: not pusher.backlog and pusher.samples_pushes_sent >= 2 + waited, "the backlog taken")
    finally:
        agent.close()
    taken = [p.ts for p in server.store.pushes_after(0) if p.node == "n01"]
    assert len(set(taken)) == len(taken) == pusher.samples_pushes_sent
    assert {round(ts - LOOK, 6) for ts in taken} >= {round(n, 6) for n in waiting}
    keys: dict[str, set[float]] = {}
    for key, number in server.switch.seen:
        keys.setdefault(key, set()).add(number)
    assert len(keys) == len(taken) and all(len(numbers) == 1 for numbers in keys.values())
    # the first push after the outage, the round's own and newer than every waiting one, had its answer lost and was
    # sent again under its key; the waiting ones went oldest first
    after = server.switch.seen[before:]
    assert after[0][1] > max(waiting) and after.count(after[0]) == 2
    assert [n for _, n in after if n in waiting] == sorted(waiting)
    assert pusher.samples_pushes_dropped == {BACKLOG_FULL: 0, EXPIRED: 0, REFUSED: 0}


@pytest.mark.parametrize("limit", ["pushes", "bytes", "age"])
def test_the_oldest_pushes_beyond_the_limits_are_dropped_with_one_warning_an_episode(
        server: RealServer, limit: str, caplog: pytest.LogCaptureFixture) -> None:
    """A backlog that holds 4 pushes, the round's new one included (by count, by bytes, or by age: a push every
    15 s, 50 s kept): push 1 taken, the server away for 2-7, back at 8 - pushes 2-4 are dropped and 5-8 stored, in
    order; away again for 9-12, back at 13 - push 9 dropped. One warning for each of the two outages, the drops
    counted by reason."""
    clock = [0.0]
    size = len(json.dumps({"node": "n01", "samples": [Sample(ts=LOOK + 1, entity="node/n01",
                                                             metric="vigil_node_load1", value=1.0)
                                                      .model_dump(mode="json")]}, separators=(",", ":")))
    limits = {"pushes": {"backlog_pushes": 4}, "bytes": {"backlog_bytes": 4 * size + size // 2},
              "age": {"backlog_age_s": 50.0}}[limit]
    pusher = EventPusher(server.url, TOKEN, clock=lambda: clock[0], **limits)  # type: ignore[arg-type]

    def round_at(number: int) -> None:
        clock[0] = 15.0 * number
        push_round(pusher, number)

    with caplog.at_level(logging.WARNING, logger="vigil.agent"):
        round_at(1)
        server.stop()
        for number in range(2, 8):
            round_at(number)
        assert [round(json.loads(p.body)["samples"][0]["ts"] - LOOK) for p in pusher.backlog] == [4, 5, 6, 7]
        server.start()
        round_at(8)
        server.stop()
        for number in range(9, 13):
            round_at(number)
        server.start()
        round_at(13)
    assert server.stored() == [1, 8, 5, 6, 7, 13, 10, 11, 12]
    reason = EXPIRED if limit == "age" else BACKLOG_FULL
    assert pusher.samples_pushes_dropped == {BACKLOG_FULL: 0, EXPIRED: 0, REFUSED: 0, reason: 4}
    warned = [r for r in caplog.records if "the oldest unanswered ones are dropped" in r.getMessage()]
    assert len(warned) == 2
    assert not pusher.backlog and pusher.backlog_bytes == 0


def _answering(statuses: list[int], seen: list[int]) -> EventPusher:
    """A pusher whose server answers its samples pushes with ``statuses`` in turn; each push's number is kept."""
    answers = iter(statuses)

    def server(request: httpx.Request) -> httpx.Response:
        seen.append(round(json.loads(request.content)["samples"][0]["ts"] - LOOK))
        return httpx.Response(next(answers), json={"stored": 1, "duplicates": 0})

    pusher = EventPusher("http://vigil.test")
    pusher._client = httpx.Client(transport=httpx.MockTransport(server))
    return pusher


def test_a_refused_push_of_the_backlog_is_dropped_alone_and_one_refused_for_now_holds_the_rest() -> None:
    """Pushes 1-3 failing (503); at 4 the server takes 4, refuses 1 (422: dropped alone), takes 2 and answers 3 with
    429 (a rate limit: 3 is kept, nothing behind it sent); at 5 it takes 5 and 3."""
    seen: list[int] = []
    pusher = _answering([503, 503, 503, 201, 422, 201, 429, 201, 201], seen)
    for number in range(1, 6):
        push_round(pusher, number)
    assert seen == [1, 2, 3, 4, 1, 2, 3, 5, 3]
    assert not pusher.backlog and pusher.samples_pushes_sent == 4
    assert pusher.samples_pushes_dropped == {BACKLOG_FULL: 0, EXPIRED: 0, REFUSED: 1}


def test_the_agent_takes_its_backlog_limits_from_its_settings_and_shows_the_backlog() -> None:
    """VIGIL_AGENT_SAMPLES_BACKLOG_*: a backlog of 2 pushes with no server listening - after 3 rounds 2 are kept
    and 1 dropped, in the report and the metrics."""
    settings = fast_settings(server_url="http://127.0.0.1:9", samples_backlog_pushes=2,
                             samples_backlog_bytes=10**6, samples_backlog_age_s=120.0, samples_backlog_per_round=7)
    agent = Agent([], settings, cpu_ratio=lambda: 0.1)
    assert agent._pusher is not None and agent._pusher.backlog_limits == (2, 10**6, 120.0)
    assert agent._pusher.backlog_per_round == 7
    defaults = AgentSettings(_env_file=None)
    assert (defaults.samples_backlog_pushes, defaults.samples_backlog_bytes, defaults.samples_backlog_age_s,
            defaults.samples_backlog_per_round) == (24, 4 * 2**20, 300.0, 20)
    for number in (1, 2, 3):
        push_round(agent._pusher, number)
    backlog = agent.report()["samples_backlog"]
    assert backlog["pushes"] == 2 and backlog["bytes"] == agent._pusher.backlog_bytes > 0
    assert backlog["dropped"] == {BACKLOG_FULL: 1, EXPIRED: 0, REFUSED: 0} and backlog["sent"] == 0
    metrics = {(s.name, tuple(sorted(s.labels.items()))): s.value for family in AgentExposition(agent).collect()
               for s in family.samples}
    assert metrics[("vigil_agent_samples_backlog_pushes", ())] == 2
    assert metrics[("vigil_agent_samples_backlog_bytes", ())] == backlog["bytes"]
    assert metrics[("vigil_agent_samples_pushes_dropped_total", (("reason", BACKLOG_FULL),))] == 1
    assert metrics[("vigil_agent_samples_pushes_sent_total", ())] == 0



def test_the_default_backlog_keeps_what_the_engine_judges_live_and_ends_well_inside_the_key_window() -> None:
    """The backlog's age limit is the server's live_push_max_age_s (300 s): an older push is stored by the server but
    never used for live detection, so keeping an hour of them (3600 s before: ~235 useless pushes a node after an
    outage) cost memory, bandwidth and store writes for nothing. Its count holds the age limit's pushes at the
    default interval; the limit stays KEY_WINDOW_MARGIN_S below the server's key window and a longer one is refused."""
    from pydantic import ValidationError

    from vigil.sources.collect.agent import KEY_WINDOW_MARGIN_S

    server = Settings(_env_file=None)  # type: ignore[call-arg]
    agent = AgentSettings(_env_file=None)  # type: ignore[call-arg]
    assert agent.samples_backlog_age_s == server.live_push_max_age_s
    assert agent.samples_backlog_pushes * agent.push_interval_s >= agent.samples_backlog_age_s
    assert agent.samples_backlog_pushes <= 2 * agent.samples_backlog_per_round  # drained in 2 rounds
    assert agent.samples_backlog_age_s <= server.push_key_window_s - KEY_WINDOW_MARGIN_S
    assert AgentSettings(_env_file=None, samples_backlog_age_s=3300.0).samples_backlog_age_s == 3300.0  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        AgentSettings(_env_file=None, samples_backlog_age_s=3600.0)  # type: ignore[call-arg]
    # the agent's pusher takes the defaults: a push 301 s old is dropped, not sent
    clock = [1000.0]
    pusher = EventPusher("http://vigil.test", clock=lambda: clock[0])
    pusher._client = httpx.Client(transport=httpx.MockTransport(lambda request: httpx.Response(503)))
    push_round(pusher, 1)
    clock[0] += 299.0
    push_round(pusher, 2)
    assert len(pusher.backlog) == 2
    clock[0] += 2.0
    push_round(pusher, 3)
    assert len(pusher.backlog) == 2 and pusher.samples_pushes_dropped[EXPIRED] == 1


def test_a_round_sends_its_own_push_first_and_at_most_the_cap_of_the_backlog() -> None:
    """10 pushes wait (the server failing); with at most 3 of the backlog a round, each round after sends its own push
    first and then the 3 oldest waiting - the backlog drained over 4 rounds, not in one (before: all 10 then the
    round's own in one round)."""
    seen: list[int] = []
    pusher = _answering([503] * 10 + [201] * 14, seen)
    pusher.backlog_per_round = 3
    for number in range(1, 11):
        push_round(pusher, number)
    assert seen == list(range(1, 11)) and len(pusher.backlog) == 10
    rounds = []
    for number in range(11, 15):
        before = len(seen)
        push_round(pusher, number)
        rounds.append(seen[before:])
    assert rounds == [[11, 1, 2, 3], [12, 4, 5, 6], [13, 7, 8, 9], [14, 10]]
    assert not pusher.backlog and pusher.samples_pushes_sent == 14


def test_a_push_that_comes_of_age_during_a_round_is_dropped_not_sent() -> None:
    """The age limit is checked for each push as it comes up, not once a round: pushes made at 0, 15 and 30 s wait
    (the server failing), each answer takes 10 s and 50 s are kept - in the round at 45 s, push 1 is 55 s old when
    its turn comes after the round's own push, and is dropped (sent, and maybe stored twice past the server's key
    window, before)."""
    clock = [0.0]
    seen: list[int] = []
    answers = iter([503, 503, 503, 201, 201, 201])

    def server(request: httpx.Request) -> httpx.Response:
        seen.append(round(json.loads(request.content)["samples"][0]["ts"] - LOOK))
        clock[0] += 10.0
        return httpx.Response(next(answers), json={"stored": 1, "duplicates": 0})

    pusher = EventPusher("http://vigil.test", backlog_age_s=50.0, clock=lambda: clock[0])
    pusher._client = httpx.Client(transport=httpx.MockTransport(server))
    for number in (1, 2, 3, 4):
        clock[0] = 15.0 * (number - 1)
        push_round(pusher, number)
    assert seen == [1, 2, 3, 4, 2, 3]
    assert pusher.samples_pushes_dropped == {BACKLOG_FULL: 0, EXPIRED: 1, REFUSED: 0} and not pusher.backlog
