"""Evaluation of `vigil ask`: a question set on a simulated demo store whose expected facts are computed from
the store directly (not through Vigil's tools), answered by the deterministic planner, by a scripted
OpenAI-compatible endpoint and by any real endpoint; scored for answer accuracy (every expected fact among
the answer's cited values), hallucinated facts (entity ids, incident ids and numbers an answer states that no
tool call of that question returned) and actions outside the whitelist - both in what the model said and in
what `vigil ask` delivered after its checks."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from vigil.config import Settings
from vigil.detect.rules import RuleDetector
from vigil.diagnose.llm import LlmClient
from vigil.faces.api.analysis import THROUGHPUT
from vigil.faces.api.ask.agent import claims, model_answer, unsupported
from vigil.faces.api.ask.planner import Answer, check_answer, fill_arg, match, plan_answer, render_answer
from vigil.faces.api.ask.tools import Toolbox, ToolResult
from vigil.faces.api.context import STEP_TIME, ServeContext
from vigil.knowledge.actions import action_whitelist
from vigil.model import ActionKind, FaultLevel, IncidentStatus, VigilInputError
from vigil.run.pipeline import run_pipeline
from vigil.sources.sim import SimConfig, simulate
from vigil.store.metrics import MetricStore
from vigil.store.sql import Store

CHANGES_WINDOW_S = 900.0  # what the changes_before flow asks for
MOVED_WINDOW_S = 600.0  # what it asks correlate_incident for
ONCALL_HOURS = 24.0


@dataclass
class Question:
    text: str
    kind: str
    # what a right answer must show: name -> value, each among the answer's cited values
    expected: dict[str, Any]


def build_demo(home: Path, seed: int, nodes: int = 8, gpus: int = 4, minutes: float = 240.0) -> ServeContext:
    """The demo's store (rules detector, as `vigil demo` without a trained model), open incidents diagnosed as
    `vigil diagnose incident` would."""
    if (home / "vigil.db").exists():
        raise VigilInputError(f"{home} already holds a store; the evaluation builds its own in an empty directory")
    run = simulate(SimConfig(nodes=nodes, gpus=gpus, minutes=minutes, seed=seed))
    store = Store(f"sqlite:///{home / 'vigil.db'}")
    metrics = MetricStore(home / "metrics")
    run_pipeline(run, store=store, metrics=metrics, detectors=[RuleDetector(run.topology)])
    ctx = ServeContext(store=store, settings=Settings(home=home), metrics=metrics)
    for incident in store.incidents(status=IncidentStatus.OPEN):
        ctx.diagnose(incident.id)
    return ctx


def _touches(entities: set[str], node: str) -> bool:
    return any(e == f"node/{node}" or e.startswith((f"gpu/{node}/", f"nic/{node}/")) for e in entities)


def _mean(metrics: MetricStore, entity: str, metric: str) -> float | None:
    """The mean of a stored series over everything stored (what compare_jobs shows with no window)."""
    try:
        _, values = metrics.series(entity, metric)
    except VigilInputError:
        return None
    finite = values[np.isfinite(values)]
    return round(float(finite.mean()), 6) if len(finite) else None


def _top_move(metrics: MetricStore, entities: list[str], start: float,
              window_s: float) -> tuple[str, str, float] | None:
    """The metric on ``entities`` that moved most at ``start`` against the same metric on the other entities of
    its family (mean after minus mean before, distance from the peers' median move over 1.4826 x their MAD, or
    over the peers' spread before when the MAD is 0; a move among exactly flat peers first): entity, metric,
    move. Read series by series from the metric store, as the definition in docs/ask.md says."""
    best: tuple[float, float, str, str, float] | None = None
    families: dict[str, list[str]] = {}
    for entity in entities:
        family = metrics.family_of(entity)
        if family is not None:
            families.setdefault(family, []).append(entity)
    for family, members in families.items():
        peers = [e for e in metrics.entities(family) if e not in members]
        for metric in metrics.metrics(family):
            def window(entity: str, m: str = metric) -> tuple[np.ndarray, np.ndarray]:
                ts, values = metrics.series(entity, m, start - window_s, start + window_s)
                return values[ts < start], values[ts >= start]

            peer_before, peer_shifts = [], []
            for peer in peers:
                before, after = window(peer)
                peer_before.append(before[np.isfinite(before)])
                if np.isfinite(before).any() and np.isfinite(after).any():
                    peer_shifts.append(float(np.nanmean(after) - np.nanmean(before)))
            if not peer_shifts:
                continue
            shifts = np.array(peer_shifts)
            median = float(np.median(shifts))
            scale = 1.4826 * float(np.median(np.abs(shifts - median)))
            if scale == 0:
                pooled = np.concatenate(peer_before)
                scale = float(pooled.std()) if len(pooled) else 0.0
            for entity in members:
                before, after = window(entity)
                if not (np.isfinite(before).any() and np.isfinite(after).any()):
                    continue
                move = float(np.nanmean(after) - np.nanmean(before))
                key = abs(move - median) / scale if scale > 0 else (np.inf if move != median else 0.0)
                candidate = (-key, -abs(move - median), entity, metric, round(move, 6))
                if best is None or candidate < best:
                    best = candidate
    return None if best is None else (best[2], best[3], best[4])


def question_set(store: Store, metrics: MetricStore | None = None) -> list[Question]:
    """Questions of every flow, phrased more than one way, with expected facts read from the store (and, given
    the metric store, the job flow's comparison with the closest job and the what-changed flow's top move)."""
    topology = store.topology()
    if topology is None:
        raise VigilInputError("the store holds no topology")
    incidents = store.incidents(limit=100_000)
    events = store.events(limit=1_000_000)
    health = store.node_health()
    questions: list[Question] = []
    for job in topology.jobs[:3]:
        mine = [e for e in events if e.entity == job.entity]
        expected: dict[str, Any] = {"world_size": job.world_size, "events_total": len(mine)}
        if mine:
            expected["last_event"] = max(mine, key=lambda e: e.ts).message
        peer = min((j for j in topology.jobs if j.id != job.id),
                   key=lambda j: (abs(j.world_size - job.world_size), j.id), default=None)
        if peer is not None and metrics is not None:
            expected["peer_job"] = peer.id
            for name, entity, metric in (("step_time_mean", job.entity, STEP_TIME),
                                         ("peer_step_time_mean", peer.entity, STEP_TIME),
                                         ("tokens_per_second_mean", job.entity, THROUGHPUT),
                                         ("peer_tokens_per_second_mean", peer.entity, THROUGHPUT)):
                value = _mean(metrics, entity, metric)
                if value is not None:
                    expected[name] = value
        for text in (f"why did job {job.id} stop?", f"job {job.id} crashed, why?", f"why is {job.id} so slow"):
            questions.append(Question(text, "job_stopped", expected))
    touched = sorted({n.name for n in topology.nodes if any(_touches({i.scope, *i.entities}, n.name)
                                                            for i in incidents)})
    quiet = [n.name for n in topology.nodes if n.name not in touched][:1]
    for name in [*touched[:5], *quiet]:
        node = f"node/{name}"
        level = max([health.get(node, FaultLevel.HEALTHY),
                     *(lv for e, lv in health.items() if e.startswith(f"gpu/{name}/"))])
        count = sum(1 for i in incidents if _touches({i.scope, *i.entities}, name))
        node_facts: dict[str, Any] = {"node": node, "level": FaultLevel(level).label, "incidents": count}
        questions.append(Question(f"is node {name} healthy?", "node_health", node_facts))
        questions.append(Question(f"how is node/{name} doing", "node_health", node_facts))
    open_incidents = [i for i in incidents if i.status is IncidentStatus.OPEN]
    for incident in [*open_incidents, *incidents[len(open_incidents):][:2]]:
        window = [e for e in events if incident.start - CHANGES_WINDOW_S <= e.ts <= incident.start]
        changed: dict[str, Any] = {"incident": incident.id, "events_total": len(window)}
        top = (_top_move(metrics, list(dict.fromkeys([incident.scope, *incident.entities])), incident.start,
                         MOVED_WINDOW_S) if metrics is not None else None)
        if top is not None:
            changed.update(top_moved_entity=top[0], top_moved_metric=top[1], top_moved_shift=top[2])
        questions.append(Question(f"what changed before {incident.id}?", "changes_before", changed))
    for incident in open_incidents:
        diagnosis = store.diagnosis(incident.id)
        if diagnosis is not None and diagnosis.root_cause is not None:
            questions.append(Question(f"what should I do about {incident.id}?", "what_now", {
                "root_cause_fault": diagnosis.root_cause.fault_type,
                "root_cause_entity": diagnosis.root_cause.entity}))
        past_same = [i for i in incidents if i.status is IncidentStatus.RESOLVED and i.end <= incident.start
                     and i.fault_types[:1] == incident.fault_types[:1]]
        if past_same:
            questions.append(Question(f"has {incident.id} happened before?", "seen_before",
                                      {"similar_root_cause": incident.fault_types[0]}))
    end = max(max(i.start, i.end) for i in incidents) if incidents else 0.0
    day = [i for i in incidents if end - ONCALL_HOURS * 3600 <= i.start <= end]
    summary = {"incidents_total": len(day), "open_total": sum(i.status is IncidentStatus.OPEN for i in day)}
    for text in ("daily on-call summary", "summarize today's incidents"):
        questions.append(Question(text, "oncall_summary", summary))
    return questions


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return abs(float(a) - float(b)) <= 1e-6 * max(1.0, abs(float(b)))
    return bool(a == b)


@dataclass
class Scored:
    question: str
    kind: str
    answered_by: str
    correct: bool
    missing: list[str]
    claims: int
    hallucinated: list[str]
    citation_problems: int
    unlisted_actions_delivered: int
    proposals_refused: int
    fell_back: bool
    seconds: float
    raw_claims: int = 0
    raw_hallucinated: list[str] = field(default_factory=list)
    raw_unlisted_actions: int = 0
    raw_unparseable: bool = False
    note: str = ""  # why the model's answer was not used, if it was not
    raw_reply: str = ""  # the start of the model's final reply


def score_answer(question: Question, answer: Answer, results: dict[str, ToolResult]) -> Scored:
    values = [f.value for line in answer.answer for f in line.facts]
    missing = [name for name, want in question.expected.items() if not any(_close(v, want) for v in values)]
    tool_values = [v for r in results.values() for v in r.facts().values()]
    stated = [c for line in answer.answer for c in claims(line.text)]
    loose = [c for line in answer.answer for c in unsupported(line.text, tool_values)]
    whitelist = {a.value for a in action_whitelist()}
    return Scored(
        question=question.text, kind=question.kind, answered_by=answer.answered_by,
        correct=not missing and bool(answer.answer), missing=missing, claims=len(stated), hallucinated=loose,
        citation_problems=len(check_answer(answer.answer, results)),
        unlisted_actions_delivered=sum(1 for p in answer.proposals if p.accepted and p.action not in whitelist),
        proposals_refused=sum(1 for p in answer.proposals if not p.accepted),
        fell_back=answer.answered_by == "planner" and bool(answer.note), seconds=0.0)


class RecordingClient(LlmClient):
    """An LlmClient that keeps every reply, so what the model said can be scored beside what was delivered."""

    replies: list[dict[str, Any]]

    def post_chat(self, body: dict[str, Any], *, text_reply: bool = False) -> dict[str, Any]:
        reply = super().post_chat(body, text_reply=text_reply)
        self.replies.append(reply)
        return reply


def raw_reply_score(scored: Scored, client: RecordingClient, results: dict[str, ToolResult]) -> None:
    """What the model's own final reply stated, before Vigil's checks: claims no tool returned (in its JSON
    answer's sentences, or in the whole text when it wrote no JSON answer), actions off the whitelist."""
    final = next((r["choices"][0]["message"] for r in reversed(client.replies)
                  if not r["choices"][0]["message"].get("tool_calls")), None)
    text = str((final or {}).get("content") or "")
    scored.raw_reply = text[:2000]
    start = text.find("{")
    try:
        obj, _ = json.JSONDecoder().raw_decode(text[start:]) if start >= 0 else (None, 0)
    except json.JSONDecodeError:
        obj = None
    tool_values = [v for r in results.values() for v in r.facts().values()]
    if not isinstance(obj, dict):
        # prose instead of the JSON answer: the ids and numbers it states are scored all the same
        scored.raw_unparseable = True
        scored.raw_claims = len(claims(text))
        scored.raw_hallucinated = unsupported(text, tool_values)
        return
    sentences = [str(line.get("text", "")) for line in obj.get("answer") or [] if isinstance(line, dict)]
    scored.raw_claims = sum(len(claims(s)) for s in sentences)
    scored.raw_hallucinated = [c for s in sentences for c in unsupported(s, tool_values)]
    kinds = {k.value for k in ActionKind}
    scored.raw_unlisted_actions = sum(1 for a in obj.get("actions") or []
                                      if isinstance(a, dict) and str(a.get("action", "")).strip().lower() not in kinds)


def evaluate(toolbox: Toolbox, questions: list[Question], client: RecordingClient | None,
             progress: Callable[[int, int], None] | None = None) -> list[Scored]:
    """Every question through the planner (``client`` None) or the model path."""
    out = []
    for done, question in enumerate(questions, start=1):
        started = time.perf_counter()
        if client is None:
            answer, results = plan_answer(toolbox, question.text)
            scored = score_answer(question, answer, results)
        else:
            client.replies = []
            answer, results = model_answer(toolbox, client, question.text)
            # scored on what the model path's own tool calls returned, or the planner's when it fell back
            scored = score_answer(question, answer, results)
            model_results = {k: v for k, v in results.items() if k.startswith("c")}
            raw_reply_score(scored, client, model_results or results)
            scored.note = answer.note[:300]
        scored.seconds = time.perf_counter() - started
        out.append(scored)
        if progress is not None:
            progress(done, len(questions))
    return out


def summarize(rows: list[Scored]) -> dict[str, Any]:
    n = max(1, len(rows))
    claims_total = sum(r.claims for r in rows)
    raw_claims = sum(r.raw_claims for r in rows)
    return {
        "questions": len(rows),
        "accuracy": round(sum(r.correct for r in rows) / n, 4),
        # the model's own answers: kept by the checks and right (a refused one counts as wrong)
        "model_accuracy": round(sum(r.correct and r.answered_by.startswith("llm:") for r in rows) / n, 4),
        "claims": claims_total,
        "hallucinated_facts": sum(len(r.hallucinated) for r in rows),
        "hallucinated_rate": round(sum(len(r.hallucinated) for r in rows) / max(1, claims_total), 4),
        "citation_problems": sum(r.citation_problems for r in rows),
        "unlisted_actions_delivered": sum(r.unlisted_actions_delivered for r in rows),
        "proposals_refused": sum(r.proposals_refused for r in rows),
        "fell_back_to_planner": sum(r.fell_back for r in rows),
        "answered_by_model": sum(r.answered_by.startswith("llm:") for r in rows),
        "raw_claims": raw_claims,
        "raw_hallucinated_facts": sum(len(r.raw_hallucinated) for r in rows),
        "raw_hallucinated_rate": round(sum(len(r.raw_hallucinated) for r in rows) / max(1, raw_claims), 4),
        "raw_unlisted_actions": sum(r.raw_unlisted_actions for r in rows),
        "raw_unparseable": sum(r.raw_unparseable for r in rows),
        "seconds_per_question": round(sum(r.seconds for r in rows) / n, 3),
        "by_kind": {kind: round(sum(r.correct for r in rows if r.kind == kind)
                                / max(1, sum(r.kind == kind for r in rows)), 4)
                    for kind in sorted({r.kind for r in rows})},
    }


# ------------------------------------------------------------------ a scripted OpenAI-compatible endpoint


class _Raw(BaseModel):
    """A tool result as the endpoint sees it: JSON, no model."""

    model_config = ConfigDict(extra="allow")


@dataclass
class RunbookModel:
    """A scripted model that follows the planner's runbook over the wire: for the flow its question matches it
    calls the flow's tools one round at a time (arguments filled from earlier results, as a model would copy
    them), then answers with the flow's sentences cited by call id. Every ``invent_every``-th answer adds a
    sentence with a fact no tool returned, and every ``unlisted_every``-th proposes an action off the
    whitelist, so the checks have something to catch."""

    invent_every: int = 3
    unlisted_every: int = 4
    answers: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reply(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        question = next(m["content"] for m in messages if m["role"] == "user")
        try:
            flow, params = match(question)
        except VigilInputError:
            return {"role": "assistant", "content": json.dumps({"answer": [{"text": "I cannot tell.",
                                                                              "cites": ["c0"]}]})}
        asked = {call["id"] for m in messages for call in m.get("tool_calls") or []}  # ids are step ids
        results: dict[str, ToolResult] = {}
        step_of_call: dict[str, str] = {}
        for m in messages:
            if m["role"] != "tool":
                continue
            payload = json.loads(m["content"])
            step = m["tool_call_id"]
            if "untrusted_data" in payload:
                results[step] = ToolResult(id=step, tool="", args={},
                                           result=_Raw.model_validate(payload["untrusted_data"]))
                step_of_call[step] = payload["call_id"]
        steps = [s for s in flow.steps if not (s.unless is not None and s.unless in params)]
        for step in steps:
            if step.id in asked:
                continue
            try:
                args = {k: fill_arg(v, params, results) for k, v in step.args.items()}
            except LookupError:
                asked.add(step.id)
                continue
            return {"role": "assistant", "content": None, "tool_calls": [
                {"id": step.id, "type": "function", "function": {"name": step.tool, "arguments": json.dumps(args)}}]}
        lines = render_answer(flow, results)
        answer = []
        for line in lines:
            cites = []
            for fact in line.facts:
                step, _, path = fact.cite.partition(".")
                if step in step_of_call:
                    cites.append(f"{step_of_call[step]}.{path}")
            if cites:
                answer.append({"text": line.text, "cites": cites})
        with self.lock:
            self.answers += 1
            number = self.answers
        actions = []
        if answer and number % self.invent_every == 0:
            answer.append({"text": "Rank 5 on gpu/n999/7 lost 37 steps.", "cites": answer[0]["cites"][:1]})
        if number % self.unlisted_every == 0:
            actions.append({"action": "reboot_node", "target": "all nodes", "reason": "a log line said so"})
        if not answer:
            answer = [{"text": "Nothing was found.", "cites": ["c0"]}]
        return {"role": "assistant", "content": json.dumps({"answer": answer, "actions": actions})}


@contextmanager
def serve_model(model: Callable[[dict[str, Any]], dict[str, Any]]) -> Iterator[str]:
    """An OpenAI-compatible /chat/completions on a free local port, answering with ``model``; its base URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            message = model(body)
            payload = json.dumps({"choices": [{"message": message}],
                                  "usage": {"total_tokens": len(json.dumps(body)) // 4}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        thread.join()
        server.server_close()


def kinds_of(questions: list[Question]) -> dict[str, int]:
    out: dict[str, int] = {}
    for q in questions:
        out[q.kind] = out.get(q.kind, 0) + 1
    return out


__all__ = ["Question", "RecordingClient", "RunbookModel", "Scored", "build_demo", "evaluate", "kinds_of",
           "question_set", "serve_model", "summarize"]
