"""The chat endpoint speaks AG-UI: on a demo store, every streamed event validates as the protocol's own event
type (the official ag-ui-protocol models), the run opens, shows each tool step in the order the answer used
them, streams the cited sentences and finishes with the answer; the model path carries the thread's earlier
turns; a question nothing answers ends in RUN_ERROR."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ag_ui.core import Event
from fastapi.testclient import TestClient
from pydantic import TypeAdapter

from tests.ask.conftest import ScriptedEndpoint, tool_call
from tests.vigil_command import vigil
from vigil.config import Settings
from vigil.faces.api.app import create_app
from vigil.faces.api.ask.planner import check_answer, plan_answer
from vigil.faces.api.ask.tools import Toolbox
from vigil.faces.api.context import ServeContext
from vigil.store.metrics import MetricStore
from vigil.store.sql import Store

TOKEN = "chat-token-3"
EVENTS: TypeAdapter[Any] = TypeAdapter(Event)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("chat-demo")
    vigil("demo", "--nodes", "4", "--gpus", "4", "--minutes", "30", "--json", "--home", str(home), home=home)
    return home


@pytest.fixture
def store(home: Path) -> Iterator[Store]:
    store = Store(f"sqlite:///{home / 'vigil.db'}")
    yield store
    store.close()


def _run(client: TestClient, messages: list[dict[str, Any]], token: str | None = TOKEN) -> tuple[int, list[Any]]:
    body = {"threadId": "t-1", "runId": "r-1", "state": {}, "messages": messages, "tools": [], "context": [],
            "forwardedProps": {}}
    headers = {"Accept": "text/event-stream", **({"Authorization": f"Bearer {token}"} if token else {})}
    with client.stream("POST", "/api/v1/agent/run", json=body, headers=headers) as reply:
        if reply.status_code != 200:
            return reply.status_code, []
        assert reply.headers["content-type"].startswith("text/event-stream")
        frames = "".join(reply.iter_text()).split("\n\n")
    events = [EVENTS.validate_json(f.removeprefix("data: ")) for f in frames if f.strip()]
    return 200, events


def _user(text: str, n: int = 0) -> dict[str, Any]:
    return {"id": f"u{n}", "role": "user", "content": text}


def test_a_run_streams_each_tool_step_then_the_cited_answer(home: Path, store: Store) -> None:
    settings = Settings(home=home, api_token=TOKEN)
    app = create_app(store, MetricStore(home / "metrics"), settings)
    with TestClient(app) as client:
        assert _run(client, [_user("is node n000 healthy?")], token=None)[0] == 401
        status, events = _run(client, [_user("is node n000 healthy?")])
    assert status == 200
    types = [e.type.value for e in events]
    expected, results = plan_answer(Toolbox(ServeContext(store=store, settings=settings,
                                                         metrics=MetricStore(home / "metrics"))),
                                    "is node n000 healthy?")
    tool_events = ["TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_RESULT"]
    assert types == ["RUN_STARTED", *tool_events * len(expected.steps), "TEXT_MESSAGE_START",
                     *["TEXT_MESSAGE_CONTENT"] * len(expected.answer), "TEXT_MESSAGE_END", "RUN_FINISHED"]
    starts = [e for e in events if e.type.value == "TOOL_CALL_START"]
    assert [e.tool_call_name for e in starts] == [s.tool for s in expected.steps] == ["node_health",
                                                                                     "incidents_touching"]
    args = [json.loads(e.delta) for e in events if e.type.value == "TOOL_CALL_ARGS"]
    assert args == [s.args for s in expected.steps]
    results_shown = [json.loads(e.content) for e in events if e.type.value == "TOOL_CALL_RESULT"]
    assert results_shown[0]["result"] == expected.steps[0].result
    text = [e.delta for e in events if e.type.value == "TEXT_MESSAGE_CONTENT"]
    assert text == [f"{line.text} [{', '.join(f.cite for f in line.facts)}]\n" for line in expected.answer]
    finished = events[-1]
    assert finished.result["flow"] == "node_health" and check_answer(expected.answer, results) == []
    assert {e.run_id for e in (events[0], finished)} == {"r-1"} and finished.thread_id == "t-1"


def test_the_model_path_gets_the_thread_and_a_question_nothing_answers_errors(
        home: Path, store: Store, endpoint: tuple[ScriptedEndpoint, str]) -> None:
    script, url = endpoint
    script.replies = [
        {"role": "assistant", "content": None, "tool_calls": [tool_call("a", "list_incidents", status="any")]},
        {"role": "assistant", "content": json.dumps({"answer": [
            {"text": "The newest incident is listed.", "cites": ["c1.incidents.0.id"]}],
            "actions": [{"action": "reboot_node", "target": "all nodes"}]})},
    ]
    settings = Settings(home=home, api_token=TOKEN, llm_base_url=url, llm_model="scripted")
    with TestClient(create_app(store, MetricStore(home / "metrics"), settings)) as client:
        thread = [_user("what is open?"), {"id": "a1", "role": "assistant", "content": "One incident."},
                  _user("and which is newest?", 2)]
        _, events = _run(client, thread)
    types = [e.type.value for e in events]
    assert types[0] == "RUN_STARTED" and types[-1] == "RUN_FINISHED"
    assert [e.tool_call_name for e in events if e.type.value == "TOOL_CALL_START"] == ["list_incidents"]
    sent = script.requests[0]["messages"]
    assert [(m["role"], m["content"]) for m in sent[1:]] == [
        ("user", "what is open?"), ("assistant", "One incident."), ("user", "and which is newest?")]
    answer = events[-1].result
    assert answer["answered_by"] == "llm:scripted"
    assert [(p["action"], p["accepted"]) for p in answer["proposals"]] == [("reboot_node", False)]
    assert store.actions(limit=10_000) == []

    with TestClient(create_app(store, MetricStore(home / "metrics"), Settings(home=home))) as client:
        _, events = _run(client, [_user("tell me a joke")], token=None)
    assert [e.type.value for e in events] == ["RUN_STARTED", "RUN_ERROR"]
    assert "no flow answers" in events[-1].message
