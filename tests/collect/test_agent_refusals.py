"""What the agent does with each route's refusals: an events batch (or inventory, or rank-log push) the server refuses
for good is dropped or sent again without holding the round, a batch it fails is kept, and neither keeps the
samples push of the same round from going; a refused token keeps everything. Against the server's real app (its
own validation refusing a newer agent's field, its own token check) or a MockTransport where a status is picked."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.collect.conftest import (
    TOKEN,
    agent_with_client,
    dropped_refused,
    push_round,
    server_app,
    warnings_with,
    xid,
)
from vigil.model import Event, FaultLevel, Node
from vigil.sources.collect.agent import PUSH_REFUSED, REFUSED


class Drifting:
    """The server's real app behind the agent's client. While ``drift`` is on, each event (on the routes of
    ``drifting``) and the inventory the agent sends carry a field this server does not know - a newer agent's, during
    a rolling upgrade - and the server's own validation refuses them (HTTP 422). Every route posted to is listed in
    ``routes``. The app's answer is handed over as the agent's own HTTP client's response (the test client's is
    another library's class), so that the agent reads it as it reads one off the wire."""

    def __init__(self, server: Any, drifting: frozenset[str] = frozenset({"events", "inventory"})) -> None:
        self.server = server
        self.drift = True
        self.drifting = drifting
        self.routes: list[str] = []

    def post(self, url: str, **kwargs: Any) -> httpx.Response:
        route = url.rsplit("/", 1)[-1]
        self.routes.append(route)
        if self.drift and route == "events" and route in self.drifting:
            kwargs["json"] = [{**event, "trace_parent": "00-ab"} for event in kwargs["json"]]
        elif self.drift and route == "inventory" and route in self.drifting:
            kwargs["json"] = {**kwargs["json"], "rack_unit": 7}
        answer = self.server.post(url, **kwargs)
        return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content,
                              request=httpx.Request("POST", url))


def test_an_events_batch_the_server_refuses_is_dropped_counted_warned_once_an_episode_and_the_samples_go(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """The real events route refuses a newer agent's events (422, an extra field): the batch is dropped, not queued
    again, counted in vigil_agent_events_dropped_total{reason="batch_refused"} (not with the rank-log lines'
    reason="refused"), and the round's samples push is stored all
    the same. One warning names the status and the server's detail; a second refused batch is not logged, a batch
    taken ends the episode and the next refusal warns again."""
    server, store = server_app(tmp_path)
    client = Drifting(server)
    agent = agent_with_client(client)
    caplog.set_level(logging.WARNING, logger="vigil.agent")

    push_round(agent, 1.0, [xid(1.0), xid(1.5)])
    assert not agent.pending_events and store.events(kind="xid", limit=10) == []
    assert [p.ts for p in store.pushes_after(0)] == [1.0]
    assert dropped_refused(agent) == 2 and dropped_refused(agent, "refused") == 0
    push_round(agent, 2.0, [xid(2.0)])
    assert dropped_refused(agent) == 3 and not agent.pending_events
    assert [p.ts for p in store.pushes_after(0)] == [1.0, 2.0]
    [warning] = warnings_with(caplog, "event(s) (HTTP")
    assert "HTTP 422" in warning and "extra_forbidden" in warning and "trace_parent" in warning

    client.drift = False  # the server upgraded: the next batch is taken
    push_round(agent, 3.0, [xid(3.0)])
    assert [e.ts for e in store.events(kind="xid", limit=10)] == [3.0]
    client.drift = True  # another server of the rollout, not yet upgraded: a new episode
    push_round(agent, 4.0, [xid(4.0)])
    assert len(warnings_with(caplog, "event(s) (HTTP")) == 2 and dropped_refused(agent) == 4
    assert [p.ts for p in store.pushes_after(0)] == [1.0, 2.0, 3.0, 4.0]
    assert agent._pusher is not None and not agent._pusher.backlog and agent._pusher.samples_pushes_sent == 4


def _mock(answer: Any, seen: list[str]) -> httpx.Client:
    """A client whose server answers each request with ``answer(route)``: a status, or an exception to raise."""

    def server(request: httpx.Request) -> httpx.Response:
        route = request.url.path.rsplit("/", 1)[-1]
        seen.append(route)
        status = answer(route)
        if isinstance(status, Exception):
            raise status
        return httpx.Response(status, json={"detail": "no"} if status >= 400 else {"stored": 1, "duplicates": 0})

    return httpx.Client(transport=httpx.MockTransport(server))


@pytest.mark.parametrize("failure", [500, 503, 408, 425, 429, "answer lost"])
def test_an_events_batch_the_server_fails_is_kept_and_the_samples_push_goes_all_the_same(failure: Any) -> None:
    """The events route failing (5xx), refusing for now (408 / 425 / 429) or its answer lost: the batch is queued
    again whole, and the samples push behind it in the round is sent and taken; next round the batch goes."""
    seen: list[str] = []
    events_up = False

    def answer(route: str) -> Any:
        if route == "events" and not events_up:
            return httpx.ReadTimeout("answer lost") if failure == "answer lost" else failure
        return 201

    agent = agent_with_client(_mock(answer, seen))
    pusher = agent._pusher
    assert pusher is not None
    batch = [xid(1.0), xid(1.5)]
    push_round(agent, 1.0, batch)
    assert seen == ["events", "samples"]
    assert agent.pending_events == batch and not pusher.backlog and pusher.samples_pushes_sent == 1
    assert dropped_refused(agent) == 0
    events_up = True
    push_round(agent, 2.0)
    assert seen[2:] == ["events", "samples"] and not agent.pending_events and pusher.sent == 2


def test_a_server_that_cannot_be_reached_keeps_everything_and_the_round_stops_at_the_first_request() -> None:
    """No connection to the server (as before): the events batch is kept, the samples push waits in the backlog and
    is not tried this round (it would wait for the same connection); both go when the server is back."""
    seen: list[str] = []
    up = False

    def answer(route: str) -> Any:
        return 201 if up else httpx.ConnectError("connection refused")

    agent = agent_with_client(_mock(answer, seen))
    pusher = agent._pusher
    assert pusher is not None
    push_round(agent, 1.0, [xid(1.0)])
    assert seen == ["events"] and len(agent.pending_events) == 1 and len(pusher.backlog) == 1
    up = True
    push_round(agent, 2.0)
    assert seen[1:] == ["events", "samples", "samples"] and not agent.pending_events and not pusher.backlog


@pytest.mark.parametrize("refused", ["wrong token", "no token on the server"])
def test_a_refused_token_keeps_the_events_and_samples_and_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, refused: str,
) -> None:
    """The real server's token check: a token it does not know (401), or a server with no token set, which refuses
    every write (403). The events and samples pushes are kept - in the queue and the backlog, none dropped as
    refused - and one warning says the token was refused; once the token is taken, every event and push is
    stored once."""
    if refused == "wrong token":
        server, store = server_app(tmp_path, token=TOKEN, sent="rotated-away")
        status = 401
    else:
        server, store = server_app(tmp_path, token="", sent=TOKEN)
        status = 403
    client = Drifting(server)
    client.drift = False
    agent = agent_with_client(client)
    caplog.set_level(logging.WARNING, logger="vigil.agent")
    pusher = agent._pusher
    assert pusher is not None

    push_round(agent, 1.0, [xid(1.0)])
    push_round(agent, 2.0, [xid(2.0)])
    assert [e.ts for e in agent.pending_events] == [1.0, 2.0]
    assert len(pusher.backlog) == 2 and pusher.samples_pushes_dropped[REFUSED] == 0
    assert dropped_refused(agent) == 0 and store.events(limit=10) == [] and store.pushes_after(0) == []
    [warning] = warnings_with(caplog, "token")
    assert f"HTTP {status}" in warning and "VIGIL_AGENT_SERVER_TOKEN" in warning

    if refused == "wrong token":  # the token put right: everything kept is delivered
        server.headers["Authorization"] = f"Bearer {TOKEN}"
        push_round(agent, 3.0)
        assert [e.ts for e in store.events(kind="xid", limit=10)] == [1.0, 2.0]
        assert sorted(p.ts for p in store.pushes_after(0)) == [1.0, 2.0, 3.0]
        assert not agent.pending_events and not pusher.backlog


def test_an_inventory_the_server_refuses_does_not_hold_the_round_and_is_sent_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """The real inventory route refuses a newer agent's inventory (422): the events and samples of the round are
    stored all the same, the inventory is not taken for registered and goes again next round (warned once), and
    an upgraded server takes it."""
    server, store = server_app(tmp_path)
    client = Drifting(server, drifting=frozenset({"inventory"}))  # events are sent as this server knows them
    agent = agent_with_client(client)
    pusher = agent._pusher
    assert pusher is not None
    caplog.set_level(logging.WARNING, logger="vigil.agent")
    node = Node(name="n01")

    push_round(agent, 1.0, [xid(1.0)], inventory=node)
    push_round(agent, 2.0, inventory=node)
    assert [e.ts for e in store.events(kind="xid", limit=10)] == [1.0]
    assert [p.ts for p in store.pushes_after(0)] == [1.0, 2.0]
    assert pusher.registered is None and client.routes.count("inventory") == 2
    [warning] = warnings_with(caplog, "inventory")
    assert "HTTP 422" in warning and "rack_unit" in warning
    client.drift = False
    push_round(agent, 3.0, inventory=node)
    assert pusher.registered == node


@pytest.mark.parametrize(("status", "kept"), [(400, False), (413, False), (422, False), (401, True), (503, True),
                                              (404, True), (421, True)])
def test_a_rank_log_push_refused_for_good_is_dropped_one_that_fails_is_kept_and_the_samples_go(
    status: int, kept: bool,
) -> None:
    """A rank-log push answered with a 4xx that refuses it for good (a push too large, invalid) is dropped and
    counted as push_refused; a token refused, a server failing or a request misrouted (404 / 421) keeps it; the
    samples go either way."""
    seen: list[str] = []
    agent = agent_with_client(_mock(lambda route: status if route == "rank-logs" else 201, seen))
    line = Event(ts=1.0, entity="job/llm/rank/1", kind="rank_log", source="rank", level=FaultLevel.DEGRADED,
                 message="ValueError: bad batch")
    push_round(agent, 1.0, [line])
    assert seen == ["rank-logs", "samples"]
    assert agent.pending_events == ([line] if kept else [])
    assert agent.events_refused_by_reason == ({} if kept else {PUSH_REFUSED: 1})
    assert agent._pusher is not None and agent._pusher.samples_pushes_sent == 1


def test_a_samples_push_answered_with_a_refused_token_is_kept_not_dropped() -> None:
    """The samples route answering 401 / 403: the push stays in the backlog, the round stops there, and it goes
    when the token is taken (it was dropped as refused before)."""
    seen: list[str] = []
    status = 401
    agent = agent_with_client(_mock(lambda route: status, seen))
    pusher = agent._pusher
    assert pusher is not None
    push_round(agent, 1.0)
    push_round(agent, 2.0)
    assert len(pusher.backlog) == 2 and pusher.samples_pushes_dropped[REFUSED] == 0
    status = 201
    push_round(agent, 3.0)
    assert not pusher.backlog and pusher.samples_pushes_sent == 3
    assert seen == ["samples", "samples", "samples", "samples", "samples"]  # 1; 2 (1 behind it not tried); 3, 1, 2
