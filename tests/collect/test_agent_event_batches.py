"""How the agent sends its events queue: in POSTs bounded by bytes and count, a batch a proxy refuses as too large
(413) split in half until it fits, a 422 costing only the events the server names, a batch refused whole without
names split down to the event refused alone - never a whole batch dropped for one event or for its size. Against the
server's real app (its own validation) or a MockTransport standing for a proxy with nginx's 1 MiB body limit."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.collect.conftest import agent_with_client, dropped_refused, push_round, server_app, warnings_with, xid
from vigil.model import Event
from vigil.sources.collect.agent import AgentSettings

NGINX_BODY_LIMIT = 2**20


class Proxy:
    """A proxy with a body limit in front of an events route that stores what it takes (JSON lists of events) and
    refuses, 422 naming nothing (an older server's answer), the events whose message is ``bad``."""

    def __init__(self, limit: int = NGINX_BODY_LIMIT) -> None:
        self.limit = limit
        self.stored: list[float] = []
        self.answers: list[int] = []
        self.sizes: list[tuple[int, int]] = []  # (bytes, events) of each POST the server took
        self.fail_after: int | None = None  # answer 503 from this POST on

    def __call__(self, request: httpx.Request) -> httpx.Response:
        route = request.url.path.rsplit("/", 1)[-1]
        if route != "events":
            return httpx.Response(201, json={"stored": 1, "duplicates": 0})
        status = self._status(request)
        self.answers.append(status)
        return httpx.Response(status, json={"detail": "no"} if status >= 400 else {"stored": 1, "duplicates": 0})

    def _status(self, request: httpx.Request) -> int:
        if self.fail_after is not None and len(self.answers) >= self.fail_after:
            return 503
        if len(request.content) > self.limit:
            return 413
        body = json.loads(request.content)
        if any(e["message"] == "bad" for e in body):
            return 422
        self.stored += [e["ts"] for e in body]
        self.sizes.append((len(request.content), len(body)))
        return 201


def _proxied(proxy: Proxy, **settings: Any) -> Any:
    agent = agent_with_client(httpx.Client(transport=httpx.MockTransport(proxy)))
    pusher = agent._pusher
    assert pusher is not None
    if settings:
        limits = AgentSettings(**settings)
        pusher.events_batch_limits = (limits.events_batch_bytes, limits.events_batch_max)
    return agent, pusher


def test_a_queue_of_8500_xid_events_behind_a_1_mib_proxy_goes_in_bounded_posts_and_every_event_is_stored() -> None:
    """8,500 queued Xid events (1.1 MB as one body) after an outage, nginx's default 1 MiB limit in front: the
    default limits (512 KiB, 1,000 events) send them in 9 POSTs, none refused, every event stored once in order
    (before: one POST, 413, all 8,500 dropped as refused)."""
    events = [xid(1.0 + i / 1000) for i in range(8500)]
    assert len(json.dumps([e.model_dump(mode="json") for e in events])) > NGINX_BODY_LIMIT
    proxy = Proxy()
    agent, pusher = _proxied(proxy)
    push_round(agent, 10.0, events)
    assert proxy.stored == [e.ts for e in events] and not agent.pending_events
    assert 413 not in proxy.answers and len(proxy.answers) == 9
    assert all(size <= 512 * 1024 and count <= 1000 for size, count in proxy.sizes)
    assert dropped_refused(agent) == 0 and pusher.sent == 8500 and pusher.samples_pushes_sent == 1


def test_a_batch_too_large_for_the_proxy_is_split_and_an_event_too_large_alone_is_the_only_one_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Batch limits above the proxy's (4 MiB, 10,000 events): the 8,500 events are answered 413 and go again as
    halves, all stored in order; an event larger than the limit on its own is dropped alone, counted as
    batch_refused and warned about once, its neighbours stored (before: the whole batch dropped)."""
    caplog.set_level(logging.WARNING, logger="vigil.agent")
    events = [xid(1.0 + i / 1000) for i in range(8500)]
    huge = xid(0.5).model_copy(update={"message": "x" * (NGINX_BODY_LIMIT + 1)})
    events.insert(4000, huge)
    proxy = Proxy()
    agent, _pusher = _proxied(proxy, events_batch_bytes=4 * 2**20, events_batch_max=10_000)
    push_round(agent, 10.0, events)
    assert proxy.stored == [e.ts for e in events if e is not huge] and not agent.pending_events
    assert proxy.answers[0] == 413 and proxy.answers.count(413) < 30
    assert dropped_refused(agent) == 1
    [warning] = warnings_with(caplog, "event(s) (HTTP")
    assert "HTTP 413" in warning


def test_a_batch_refused_whole_without_names_costs_only_the_events_refused_alone() -> None:
    """A server answering 422 without naming the bad events (an older server's plain detail): the batch is split
    down to the two bad events, which are dropped; the 98 others are stored (before: all 100 dropped)."""
    events = [xid(float(i)) for i in range(100)]
    events[17] = events[17].model_copy(update={"message": "bad"})
    events[80] = events[80].model_copy(update={"message": "bad"})
    proxy = Proxy()
    agent, _pusher = _proxied(proxy)
    push_round(agent, 200.0, events)
    assert sorted(proxy.stored) == [float(i) for i in range(100) if i not in (17, 80)]
    assert dropped_refused(agent) == 2 and not agent.pending_events


def test_a_server_failing_midway_keeps_exactly_the_events_not_yet_taken_in_order() -> None:
    """The server fails (503) after some POSTs of a split batch: the events taken are not queued again, the ones
    refused are not counted twice, and the rest is queued in order and stored next round."""
    events = [xid(float(i)) for i in range(40)]
    events[3] = events[3].model_copy(update={"message": "bad"})
    proxy = Proxy()
    proxy.fail_after = 9  # 422 for 0-9, 0-4, 2-4, 3-4, 3 (dropped); 0-1, 2, 4, 5-9 taken; 503 for 10-19
    agent, _pusher = _proxied(proxy, events_batch_max=10)
    push_round(agent, 100.0, events)
    kept = [e.ts for e in agent.pending_events]
    assert kept == [float(i) for i in range(10, 40)]
    assert proxy.stored + kept == [e.ts for e in events if e.message != "bad"]
    proxy.fail_after = None
    push_round(agent, 101.0)
    assert proxy.stored == [e.ts for e in events if e.message != "bad"] and not agent.pending_events
    assert dropped_refused(agent) == 1


class OneBad:
    """The server's real app behind the agent's client; the events at ``bad`` of each events POST carry a field it
    does not know, so that its own validation answers 422 naming them (``errors[].loc``)."""

    def __init__(self, server: Any, bad: set[float], old_server: bool = False) -> None:
        self.server = server
        self.bad = bad
        self.posts = 0
        self.old_server = old_server  # answer as a server before invalid_indices: errors[] lists at most 20

    def post(self, url: str, **kwargs: Any) -> httpx.Response:
        if url.endswith("/events"):
            self.posts += 1
            kwargs["json"] = [{**e, "trace_parent": "00-ab"} if e["ts"] in self.bad else e for e in kwargs["json"]]
        answer = self.server.post(url, **kwargs)
        content = answer.content
        if self.old_server and answer.status_code == 422:
            old = answer.json()
            assert "invalid_indices" in old and len(old["errors"]) <= 20
            del old["invalid_indices"]
            content = json.dumps(old).encode()
        return httpx.Response(answer.status_code, headers={"Content-Type": "application/json"}, content=content,
                              request=httpx.Request("POST", url))


@pytest.mark.parametrize("bad", [{2.0}, {float(i) for i in range(5, 35)}])
def test_the_real_server_naming_bad_events_in_a_422_costs_only_those(tmp_path: Path, bad: set[float]) -> None:
    """The real events route refuses events with a field it does not know (422, errors[].loc = ["body", index,
    field]): only those are dropped and counted, the others of the batch are stored - also when more are bad than
    its errors list describes (at most 20): its invalid_indices name them all, and one more POST takes the rest
    (a server listing only 20 errors: 3 POSTs for 30 bad events)."""
    server, store = server_app(tmp_path)
    events = [xid(float(i)) for i in range(40)]
    client = OneBad(server, bad)
    agent = agent_with_client(client)
    push_round(agent, 100.0, events)
    assert [e.ts for e in store.events(kind="xid", limit=100)] == [e.ts for e in events if e.ts not in bad]
    assert dropped_refused(agent) == len(bad) and not agent.pending_events
    assert client.posts == 2


@pytest.mark.parametrize(("old_server", "share", "posts"), [
    (False, 1.0, 1), (False, 0.6, 2),  # every refused event named at once: one POST more at most
    (True, 1.0, 50), (True, 0.6, 31),  # a server listing 20 errors a 422 (before invalid_indices): 20 a POST
])
def test_schema_drift_in_a_full_batch_costs_one_post_more_against_a_server_naming_every_refused_event(
    tmp_path: Path, old_server: bool, share: float, posts: int,
) -> None:
    """A full default batch (1,000 events) of which all, or 600 spread through it, carry a field the real server
    does not know (a newer agent in a rolling upgrade): the server's 422 names every refused index
    (``invalid_indices``) and the agent drops them all in one step - 1 POST for the batch, 2 with valid events
    left (before: 50 and 31, its 422 naming 20 a time). Against a server that lists only 20 errors the agent still
    drops exactly the refused ones, 20 a POST, and stores the rest."""
    server, store = server_app(tmp_path)
    events = [xid(float(i)) for i in range(1000)]
    bad = {float(i) for i in range(1000) if share == 1.0 or i % 5 < 3}
    assert len(bad) == int(1000 * share)
    client = OneBad(server, bad, old_server=old_server)
    agent = agent_with_client(client)
    push_round(agent, 100.0, events)
    stored = [e.ts for e in store.events(kind="xid", limit=2000)]
    assert stored == [e.ts for e in events if e.ts not in bad]
    assert dropped_refused(agent) == len(bad) and not agent.pending_events
    assert client.posts == posts


def test_the_servers_422_names_every_refused_item_of_a_list_body_in_bounded_size(tmp_path: Path) -> None:
    """The real events route refusing 10,000 events (its most a POST), each with two unknown fields: the 422
    describes the first 20 errors and names each of the 10,000 refused indices once, in order, in well under a
    megabyte."""
    server, _store = server_app(tmp_path)
    body = [{**xid(float(i)).model_dump(mode="json"), "trace_parent": "00-ab", "span": 1} for i in range(10_000)]
    answer = server.post("/api/v1/events", json=body)
    assert answer.status_code == 422
    refusal = answer.json()
    assert refusal["invalid_indices"] == list(range(10_000)) and len(refusal["errors"]) == 20
    assert len(answer.content) < 100_000


@pytest.mark.parametrize("status", [404, 421])
def test_events_and_samples_answered_404_or_421_are_misrouted_kept_and_warned_once_an_episode(
    status: int, caplog: pytest.LogCaptureFixture,
) -> None:
    """An ingress mid-rollout answering 404 (or 421) on Vigil's own routes: nothing is dropped - the events stay
    queued, the samples push in the backlog - and one warning says so for the episode; once the routes answer,
    everything goes, and the next episode warns again (before: the events dropped as refused, the push too)."""
    caplog.set_level(logging.WARNING, logger="vigil.agent")
    misrouted = True

    def server(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status if misrouted else 201, json={"detail": "Not Found"} if misrouted else {})

    agent = agent_with_client(httpx.Client(transport=httpx.MockTransport(server)))
    pusher = agent._pusher
    assert pusher is not None
    events: list[Event] = [xid(1.0), xid(2.0)]
    push_round(agent, 1.0, events)
    push_round(agent, 2.0)
    assert agent.pending_events == events and len(pusher.backlog) == 2
    assert dropped_refused(agent) == 0 and pusher.samples_pushes_refused == 0
    assert len(warnings_with(caplog, "wrong place")) == 1
    misrouted = False
    push_round(agent, 3.0)
    assert not agent.pending_events and not pusher.backlog and pusher.sent == 2
    misrouted = True
    push_round(agent, 4.0, [xid(4.0)])
    assert len(warnings_with(caplog, "wrong place")) == 2


def test_a_jobs_rank_log_lines_too_large_for_the_proxy_are_split_not_dropped() -> None:
    """6,000 queued rank-log lines of one job (1.6 MB as one push) behind nginx's 1 MiB limit: with the default
    limits they go in bounded pushes, none refused; with limits above the proxy's the 413 is split in halves and
    every line is stored (before: the whole push dropped as push_refused)."""
    from vigil.model import FaultLevel

    lines = [Event(ts=1.0 + i / 1000, entity="job/llm/rank/1", kind="rank_log", source="rank",
                   level=FaultLevel.DEGRADED, message=f"ValueError: bad batch {i} " + "x" * 100) for i in range(6000)]
    for limits in ({}, {"events_batch_bytes": 4 * 2**20, "events_batch_max": 10_000}):
        answers: list[int] = []
        stored: list[float] = []

        def server(request: httpx.Request, answers: list[int] = answers, stored: list[float] = stored,
                   ) -> httpx.Response:
            if not request.url.path.endswith("/rank-logs"):
                return httpx.Response(201, json={"stored": 1, "duplicates": 0})
            status = 413 if len(request.content) > NGINX_BODY_LIMIT else 200
            answers.append(status)
            if status == 200:
                stored.extend(e["ts"] for e in json.loads(request.content)["events"])
            return httpx.Response(status, json={"stored": 1} if status == 200 else {"detail": "too large"})

        agent = agent_with_client(httpx.Client(transport=httpx.MockTransport(server)))
        pusher = agent._pusher
        assert pusher is not None
        if limits:
            settings = AgentSettings(**limits)
            pusher.events_batch_limits = (settings.events_batch_bytes, settings.events_batch_max)
        push_round(agent, 10.0, lines)
        assert stored == [e.ts for e in lines] and not agent.pending_events
        assert agent.events_refused_by_reason == {} and pusher.sent == 6000
        assert (413 in answers) == bool(limits)


class Answering:
    """An events route that stores the events of a POST it takes and answers every POST with ``answer`` (a
    status and a JSON body, or raw bytes) while ``answer`` is set: a buggy or hostile server's 422."""

    def __init__(self, answer: tuple[int, Any] | None) -> None:
        self.answer = answer
        self.stored: list[float] = []
        self.posts = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if not request.url.path.endswith("/events"):
            return httpx.Response(201, json={"stored": 1, "duplicates": 0})
        self.posts += 1
        body = json.loads(request.content)
        if self.answer is not None and self.posts == 1:
            status, content = self.answer
            if isinstance(content, bytes):
                return httpx.Response(status, content=content, headers={"Content-Type": "application/json"})
            return httpx.Response(status, json=content)
        bad = [e["ts"] for e in body if e["message"] == "bad"]
        if bad:  # refused alone or in a batch: named as the real server names them
            indices = [i for i, e in enumerate(body) if e["message"] == "bad"]
            return httpx.Response(422, json={"errors": [{"loc": ["body", i, "x"]} for i in indices[:20]],
                                             "invalid_indices": indices})
        self.stored += [e["ts"] for e in body]
        return httpx.Response(201, json={"stored": len(body), "duplicates": 0})


def _ten_with_one_bad() -> list[Event]:
    events = [xid(float(i)) for i in range(10)]
    events[3] = events[3].model_copy(update={"message": "bad"})
    return events


@pytest.mark.parametrize("listed", [
    list(range(10)),  # every event named, the errors naming one: a list for another batch
    [3, 4],  # one more than the errors describe, though they describe all
    [3, 3, 4, 4, 5],  # duplicates
    [3, -1, 4],  # a negative index
    [3, 4, 10],  # out of range
    [3, "4", 4.0, True],  # no integers
    [3, *range(11)],  # longer than the batch
])
def test_a_422_whose_invalid_indices_disagree_with_its_errors_costs_only_the_events_the_errors_name(
    listed: list[Any],
) -> None:
    """A buggy or hostile server's 422 for a batch of 10 whose event 3 is bad: its errors name event 3, its
    invalid_indices name more - all of the batch, an index twice, indices out of range or no integers. The agent
    does not take such a list, drops only event 3 and stores the other 9 (before: every in-range index listed was
    dropped as refused, good events with it)."""
    server = Answering((422, {"errors": [{"loc": ["body", 3, "x"], "msg": "no", "type": "extra_forbidden"}],
                              "invalid_indices": listed}))
    agent = agent_with_client(httpx.Client(transport=httpx.MockTransport(server)))
    events = _ten_with_one_bad()
    push_round(agent, 100.0, events)
    assert server.stored == [e.ts for e in events if e.message != "bad"]
    assert dropped_refused(agent) == 1 and not agent.pending_events


def test_a_422_listing_every_refused_index_beside_20_errors_is_still_taken_whole() -> None:
    """The check does not cost the real server's answer its use: 30 bad events of 40, 20 described, all 30 listed
    in invalid_indices - dropped in one step, 2 POSTs."""
    events = [xid(float(i)) if i % 4 == 0 else xid(float(i)).model_copy(update={"message": "bad"}) for i in range(40)]
    bad = [i for i, e in enumerate(events) if e.message == "bad"]
    server = Answering((422, {"errors": [{"loc": ["body", i, "x"]} for i in bad[:20]], "invalid_indices": bad}))
    agent = agent_with_client(httpx.Client(transport=httpx.MockTransport(server)))
    push_round(agent, 100.0, events)
    assert server.stored == [e.ts for e in events if e.message != "bad"] and server.posts == 2
    assert dropped_refused(agent) == 30


def test_an_answer_nested_too_deep_to_parse_neither_kills_the_push_round_nor_loses_its_events() -> None:
    """A 422 whose JSON is nested deeper than Python's parser goes (json raises RecursionError, not ValueError):
    read as naming nothing - the batch split until the bad event is refused alone - and the round ends normally
    with the 9 good events stored (before: the RecursionError ended the push thread, its batch neither sent again
    nor off the queue's books)."""
    server = Answering((422, b'{"invalid_indices": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"))
    agent = agent_with_client(httpx.Client(transport=httpx.MockTransport(server)))
    events = _ten_with_one_bad()
    push_round(agent, 100.0, events)
    assert server.stored == [e.ts for e in events if e.message != "bad"]
    assert dropped_refused(agent) == 1 and not agent.pending_events


def test_a_push_round_failing_unexpectedly_queues_its_events_again_in_order(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Anything a push round did not foresee (here the HTTP client raising an error of no httpx kind) ends it with
    its events queued again ahead of newer ones, logged once an episode, and the next round sends them (before:
    the exception ended the push thread and the round's events were gone from the queue)."""
    calls = {"n": 0}

    def server(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/events"):
            calls["n"] += 1
            if calls["n"] <= 2:
                raise RuntimeError("a bug")
            stored.extend(e["ts"] for e in json.loads(request.content))
        return httpx.Response(201, json={"stored": 1, "duplicates": 0})

    stored: list[float] = []
    agent = agent_with_client(httpx.Client(transport=httpx.MockTransport(server)))
    push_round(agent, 100.0, [xid(1.0), xid(2.0)])
    assert [e.ts for e in agent.pending_events] == [1.0, 2.0]
    push_round(agent, 101.0, [xid(3.0)])
    assert [e.ts for e in agent.pending_events] == [1.0, 2.0, 3.0]
    assert len([r for r in caplog.records if "failed unexpectedly" in r.getMessage()]) == 1
    push_round(agent, 102.0)
    assert stored == [1.0, 2.0, 3.0] and not agent.pending_events
