"""Memory of past incidents on a 4-hour demo store (16 resolved incidents, 2 open): every resolved incident is
summarized and stored once, the past incidents most like an open one are found with what was done about
them, and they reach `vigil ask`, the MCP tools and the stored diagnosis; the model path's working context
stays within its token budget."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.ask.conftest import ScriptedEndpoint, client_for, tool_call
from tests.vigil_command import vigil
from vigil.config import Settings
from vigil.diagnose.llm import LlmClient, estimate_tokens
from vigil.diagnose.memory import MemoryIndex, recall, remember_resolved, summarize
from vigil.diagnose.rca import RcaResult
from vigil.diagnose.report import render_markdown
from vigil.faces.api.app import create_app
from vigil.faces.api.ask.agent import Turn, fit_context, model_answer
from vigil.faces.api.ask.planner import check_answer, plan_answer
from vigil.faces.api.ask.tools import Toolbox
from vigil.faces.api.context import ServeContext
from vigil.model import Action, ActionKind, ActionStatus, Incident, IncidentStatus, VigilInputError
from vigil.store.metrics import MetricStore
from vigil.store.sql import Store

TOKEN = "memory-token-1"


@dataclass
class LongDemo:
    home: Path
    store: Store
    ctx: ServeContext
    toolbox: Toolbox


@pytest.fixture(scope="module")
def long_demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LongDemo]:
    home = tmp_path_factory.mktemp("memory-demo")
    # 8 x 4 GPUs for 4 simulated hours, seed 0: 19 injected faults, 16 incidents resolved before the last 2.
    out = json.loads(vigil("demo", "--nodes", "8", "--gpus", "4", "--minutes", "240", "--json", "--home",
                           str(home), home=home).stdout)
    assert sum(i["status"] == "resolved" for i in out["incidents"]) >= 10
    store = Store(f"sqlite:///{home / 'vigil.db'}")
    ctx = ServeContext(store=store, settings=Settings(home=home, api_token=TOKEN),
                       metrics=MetricStore(home / "metrics"))
    yield LongDemo(home=home, store=store, ctx=ctx, toolbox=Toolbox(ctx))
    store.close()


def _open(demo: LongDemo) -> list[Incident]:
    return demo.store.incidents(status=IncidentStatus.OPEN)


def test_every_resolved_incident_is_remembered_once(long_demo: LongDemo) -> None:
    resolved = long_demo.store.incidents(status=IncidentStatus.RESOLVED)
    remember_resolved(long_demo.store)
    assert long_demo.store.remembered_ids() == {i.id for i in resolved}
    assert remember_resolved(long_demo.store) == 0  # nothing twice
    memories = {m.incident_id: m for m in long_demo.store.memories()}
    for incident in resolved:
        memory = memories[incident.id]
        assert memory.resolved_after_s == pytest.approx(incident.end - incident.start)
        assert memory.root_cause_fault in incident.fault_types and memory.root_cause_entity
        assert memory.outcome.startswith("resolved after")


def test_open_incidents_are_not_remembered_and_actions_shape_the_outcome(long_demo: LongDemo) -> None:
    open_incident = _open(long_demo)[0]
    with pytest.raises(VigilInputError, match="only resolved incidents"):
        summarize(open_incident, None, [])
    resolved = long_demo.store.incidents(status=IncidentStatus.RESOLVED)[0]
    taken = Action(ts=resolved.end, kind=ActionKind.RESET_GPU, target="gpu/n003/0", incident_id=resolved.id,
                   status=ActionStatus.EXECUTED, result="nvidia-smi -r: ok", dry_run=False)
    proposed = Action(ts=resolved.end, kind=ActionKind.DRAIN, target="node/n003", incident_id=resolved.id)
    memory = summarize(resolved, None, [taken, proposed])
    assert memory.actions == ["reset_gpu gpu/n003/0 (executed: nvidia-smi -r: ok)", "drain node/n003 (proposed)"]
    assert "1 action(s) taken: reset_gpu gpu/n003/0" in memory.outcome
    assert "none taken" in summarize(resolved, None, [proposed]).outcome


def test_similar_past_incidents_share_the_fault_and_come_from_the_past(long_demo: LongDemo) -> None:
    memories = {m.incident_id: m for m in long_demo.store.memories()}
    checked = 0
    for incident in _open(long_demo):
        similar = recall(long_demo.store, incident)
        same_fault = [m for m in memories.values() if m.root_cause_fault == incident.fault_types[0]
                      and m.end <= incident.start]
        assert all(memories[s.incident_id].end <= incident.start for s in similar)
        assert incident.id not in {s.incident_id for s in similar}
        assert [s.score for s in similar] == sorted((s.score for s in similar), reverse=True)
        if same_fault:
            assert similar[0].root_cause_fault == incident.fault_types[0]
            checked += 1
    assert checked >= 1


def test_the_index_ranks_by_shared_terms() -> None:
    def resolved(fault: str, scope: str, title: str) -> Incident:
        return Incident(title=title, scope=scope, entities=[scope], start=0.0, end=600.0, level=3,
                        fault_types=[fault], status=IncidentStatus.RESOLVED)
    memories = [summarize(resolved("gpu_dbe", "gpu/n001/2", "gpu dbe on gpu/n001/2"), None, []),
                summarize(resolved("link_down", "nic/n004/mlx5_1", "link down on nic/n004/mlx5_1"), None, []),
                summarize(resolved("fan_failure", "node/n002", "fan failure on node/n002"), None, [])]
    index = MemoryIndex(memories)
    found = index.similar("link_down job_hang nic mlx5_1", k=3)
    assert found[0].root_cause_fault == "link_down" and len(found) == 1  # no shared term, no match
    assert index.similar("completely unrelated words", k=3) == []
    assert MemoryIndex([]).similar("gpu_dbe") == []


def test_seen_before_flow_cites_the_similar_incidents(long_demo: LongDemo) -> None:
    incident = _open(long_demo)[0]
    answer, results = plan_answer(long_demo.toolbox, f"has {incident.id} happened before?")
    assert answer.flow == "seen_before" and check_answer(answer.answer, results) == []
    cited = {f.cite: f.value for line in answer.answer for f in line.facts}
    expected = recall(long_demo.store, incident)
    assert expected, "the open incident should resemble a resolved one"
    assert [cited[f"past.similar.{i}.incident_id"] for i in range(len(expected))] == [
        s.incident_id for s in expected]
    assert cited["past.similar.0.outcome"] == expected[0].outcome
    text = " ".join(line.text for line in answer.answer)
    assert expected[0].incident_id in text and expected[0].root_cause_fault in text


def test_what_now_and_the_stored_diagnosis_show_what_fixed_it_last_time(long_demo: LongDemo) -> None:
    incident = _open(long_demo)[0]
    diagnosis = long_demo.ctx.diagnose(incident.id)
    assert diagnosis.similar and diagnosis.similar == recall(long_demo.store, incident, diagnosis)
    assert long_demo.store.diagnosis(incident.id).similar == diagnosis.similar  # type: ignore[union-attr]
    answer, results = plan_answer(long_demo.toolbox, f"what should I do now about {incident.id}?")
    assert answer.flow == "what_now" and check_answer(answer.answer, results) == []
    assert any(line.text.startswith("Similar past incident " + diagnosis.similar[0].incident_id)
               for line in answer.answer)
    report = render_markdown(incident, diagnosis, RcaResult(incident_id=incident.id, causes=[], observations=[],
                                                            evidence=[], seconds=0.0))
    assert "## Similar past incidents" in report and diagnosis.similar[0].incident_id in report


def test_search_memory_tool_and_resolving_through_the_api_remembers(long_demo: LongDemo) -> None:
    found = long_demo.toolbox.call("m", "search_memory", {"text": "gpu_dbe job_crash", "k": 3}).result
    assert found.matches and found.matches[0].root_cause_fault == "gpu_dbe"  # type: ignore[attr-defined]
    incident = _open(long_demo)[-1]
    assert incident.id not in long_demo.store.remembered_ids()
    app = create_app(long_demo.store, long_demo.ctx.metrics, long_demo.ctx.settings)
    with TestClient(app) as client:
        denied = client.post(f"/api/v1/incidents/{incident.id}/status", json={"status": "resolved"})
        assert denied.status_code == 401 and incident.id not in long_demo.store.remembered_ids()
        done = client.post(f"/api/v1/incidents/{incident.id}/status", json={"status": "resolved"},
                           headers={"Authorization": f"Bearer {TOKEN}"})
        assert done.status_code == 200
    assert incident.id in long_demo.store.remembered_ids()


def test_working_context_keeps_the_question_and_newest_result_within_budget() -> None:
    big = json.dumps({"call_id": "c1", "untrusted_data": {"rows": ["x" * 400] * 40}})
    messages = [{"role": "system", "content": "rules"},
                {"role": "user", "content": "old question " * 200},
                {"role": "assistant", "content": "old answer " * 200},
                {"role": "user", "content": "why did job j00 stop?", "current": True},
                {"role": "assistant", "content": "", "tool_calls": [{"id": "a"}, {"id": "b"}]},
                {"role": "tool", "tool_call_id": "a", "content": big},
                {"role": "tool", "tool_call_id": "b", "content": big.replace("c1", "c2")}]
    fitted = fit_context(messages, budget=6000)
    assert sum(len(json.dumps(m)) // 4 + 1 for m in fitted) <= 6000
    tools = [m for m in fitted if m["role"] == "tool"]
    assert "elided" in json.loads(tools[0]["content"])["note"] and json.loads(tools[0]["content"])["call_id"] == "c1"
    assert tools[1]["content"] == messages[6]["content"]  # the newest result whole
    assert fitted[0]["content"] == "rules" and {"role": "user", "content": "why did job j00 stop?"} in fitted
    assert all("current" not in m for m in fitted) and "current" in messages[3]  # the caller's list unchanged
    roomy = fit_context(messages, budget=100_000)
    assert [m["content"] for m in roomy] == [m["content"] for m in messages]
    tight = fit_context(messages, budget=4300)
    assert "old question" not in json.dumps(tight)  # earlier turns go before the current question does
    with pytest.raises(Exception, match="over the budget"):
        fit_context(messages, budget=50)


def test_a_configured_tokenizer_counts_the_working_context(tmp_path: Path) -> None:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    tokenizer = Tokenizer(WordLevel({"[UNK]": 0, "x": 1}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()  # type: ignore[assignment]
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    client = LlmClient(base_url="http://127.0.0.1:9/v1", model="m", tokenizer=str(tmp_path / "tokenizer.json"))
    result = json.dumps({"call_id": "c1", "untrusted_data": {"text": "x " * 1000}})
    messages = [{"role": "system", "content": "rules"}, {"role": "user", "content": "why?", "current": True},
                {"role": "assistant", "content": "", "tool_calls": [{"id": "a"}, {"id": "b"}]},
                {"role": "tool", "tool_call_id": "a", "content": result},
                {"role": "tool", "tool_call_id": "b", "content": result.replace("c1", "c2")}]
    # one token a word here, where four characters a token counts "x " as half a token
    assert client.count_tokens(result) > 1000 > 2 * estimate_tokens(result) - 100
    assert fit_context(messages, budget=1500) == [{k: v for k, v in m.items() if k != "current"} for m in messages]
    counted = fit_context(messages, budget=1500, count=client.count_tokens)
    assert "elided" in counted[3]["content"] and counted[4]["content"] == messages[4]["content"]
    assert LlmClient(base_url="http://127.0.0.1:9/v1", model="m").count_tokens(result) == estimate_tokens(result)
    with pytest.raises(VigilInputError, match="is not a file"):
        LlmClient(base_url="x", model="m", tokenizer=str(tmp_path / "none.json")).count_tokens("a")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(VigilInputError, match="is not a tokenizer.json"):
        LlmClient(base_url="x", model="m", tokenizer=str(tmp_path / "bad.json")).count_tokens("a")


def test_conversation_history_travels_within_the_budget(
        long_demo: LongDemo, endpoint: tuple[ScriptedEndpoint, str]) -> None:
    script, url = endpoint
    incident = _open(long_demo)[0]
    script.replies = [
        {"role": "assistant", "content": None,
         "tool_calls": [tool_call("a", "similar_incidents", incident_id=incident.id, k=2)]},
        {"role": "assistant", "content": json.dumps({"answer": [
            {"text": "It looks like an earlier incident.", "cites": ["c1.similar.0.incident_id"]}]})},
    ]
    history = [Turn(role="user", content="what is open?"), Turn(role="assistant", content=f"{incident.id}.")]
    answer, results = model_answer(long_demo.toolbox, client_for(url), "has it happened before?",
                                   history=history, context_tokens=4000)
    assert answer.answered_by == "llm:scripted" and check_answer(answer.answer, results) == []
    first = script.requests[0]["messages"]
    assert [m["role"] for m in first] == ["system", "user", "assistant", "user"]
    assert first[2]["content"] == f"{incident.id}." and first[3]["content"] == "has it happened before?"
    assert all(sum(len(json.dumps(m)) // 4 + 1 for m in r["messages"]) <= 4000 for r in script.requests)
