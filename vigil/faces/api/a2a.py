"""A2A (Agent2Agent protocol 1.0, JSON-RPC binding): other agents discover Vigil by its agent card at
``/.well-known/agent-card.json`` and ask it questions at ``POST /a2a`` with ``SendMessage`` (the 0.3 name
``message/send`` is accepted too). Each question is answered as ``vigil ask`` answers it - the planner's
flows, or the configured LLM endpoint over the same read tools - and comes back as a completed task whose
artifact holds the answer text and, as a data part, every cited fact and tool step. The endpoint is a read:
it needs what the rest of the API's reads need (a bearer token once users or a token are configured), and
nothing it does proposes, stores or executes an action.

Wire shapes follow the 1.0 specification's ProtoJSON (camelCase names, ``TASK_STATE_*`` / ``ROLE_*`` enums,
``SendMessageResponse`` as ``{"task": ...}``)."""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from datetime import UTC, datetime
from typing import Any, Literal

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from vigil import __version__
from vigil.diagnose.llm import LlmClient
from vigil.faces.api.ask.agent import answer_question
from vigil.faces.api.ask.planner import Answer, flows
from vigil.faces.api.ask.tools import Toolbox
from vigil.faces.api.auth import check_read
from vigil.faces.api.context import ServeContext
from vigil.model import VigilInputError, describe_validation_error

PROTOCOL_VERSION = "1.0"
CARD_PATH = "/.well-known/agent-card.json"
RPC_PATH = "/a2a"
MAX_TASKS = 200  # finished tasks kept for GetTask, oldest forgotten first
# JSON-RPC 2.0 error codes, and A2A's own
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS = -32700, -32600, -32601, -32602
TASK_NOT_FOUND, UNSUPPORTED_OPERATION = -32001, -32004


class Wire(BaseModel):
    """ProtoJSON field names: camelCase on the wire, snake_case in Python."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class AgentInterface(Wire):
    url: str
    protocol_binding: str = "JSONRPC"
    protocol_version: str = PROTOCOL_VERSION


class AgentProvider(Wire):
    organization: str
    url: str


class AgentCapabilities(Wire):
    streaming: bool = False
    push_notifications: bool = False
    extended_agent_card: bool = False


class HttpAuthSecurityScheme(Wire):
    scheme: str = "Bearer"
    description: str = ""


class SecurityScheme(Wire):
    http_auth_security_scheme: HttpAuthSecurityScheme


class StringList(Wire):
    scopes: list[str] = Field(default_factory=list, alias="list")


class SecurityRequirement(Wire):
    schemes: dict[str, StringList]


class AgentSkill(Wire):
    id: str
    name: str
    description: str
    tags: list[str]
    examples: list[str] = Field(default_factory=list)


class AgentCard(Wire):
    name: str
    description: str
    supported_interfaces: list[AgentInterface]
    provider: AgentProvider
    version: str
    documentation_url: str
    capabilities: AgentCapabilities
    security_schemes: dict[str, SecurityScheme]
    security_requirements: list[SecurityRequirement]
    default_input_modes: list[str]
    default_output_modes: list[str]
    skills: list[AgentSkill]


class Part(Wire):
    text: str | None = None
    data: Any = None
    media_type: str = ""


class Message(Wire):
    message_id: str = Field(min_length=1, max_length=200)
    context_id: str = ""
    task_id: str = ""
    role: Literal["ROLE_USER", "ROLE_AGENT", "user", "agent"]
    parts: list[Part] = Field(min_length=1, max_length=20)


class SendMessageParams(Wire):
    message: Message


class TaskStatus(Wire):
    state: str
    message: Message | None = None
    timestamp: str


class Artifact(Wire):
    artifact_id: str
    name: str
    parts: list[Part]


class Task(Wire):
    id: str
    context_id: str
    status: TaskStatus
    artifacts: list[Artifact] = Field(default_factory=list)
    history: list[Message] = Field(default_factory=list)


class GetTaskParams(Wire):
    id: str


class RpcError(BaseModel):
    code: int
    message: str


class RpcResponse(BaseModel):
    """A JSON-RPC 2.0 response: ``result`` (``{"task": Task}`` for SendMessage, a Task for GetTask) or
    ``error``."""

    jsonrpc: Literal["2.0"] = "2.0"
    id: str | int | None
    result: dict[str, Any] | None = None
    error: RpcError | None = None


def agent_card(base_url: str) -> AgentCard:
    """Vigil's card: one skill per planner flow (with the flow's example questions) and a general one."""
    skills = [AgentSkill(id=f.name, name=f.name.replace("_", " "), description=f.description,
                         tags=["aiops", "gpu-cluster", f.name], examples=f.examples) for f in flows()]
    skills.append(AgentSkill(
        id="ask", name="ask", tags=["aiops", "gpu-cluster"],
        description="any question about the cluster's incidents, nodes, jobs, metrics and logs, answered from "
                    "Vigil's read tools with every fact cited (needs an LLM endpoint in Vigil's settings for "
                    "questions no flow answers)",
        examples=["which GPUs are at drain level or worse?"]))
    return AgentCard(
        name="Vigil",
        description="Vigil watches an AI training cluster: incidents, node and GPU health, jobs, metrics, logs, "
                    "diagnoses and the memory of past incidents. Ask it a question in plain text; the answer cites "
                    "the tool result behind every fact. It reads only: actions it mentions are proposals for a "
                    "person to approve through Vigil's own API.",
        supported_interfaces=[AgentInterface(url=base_url.rstrip("/") + RPC_PATH)],
        provider=AgentProvider(organization="Vigil", url=base_url.rstrip("/") + "/"),
        version=__version__,
        documentation_url=base_url.rstrip("/") + "/docs",
        capabilities=AgentCapabilities(),
        security_schemes={"bearer": SecurityScheme(http_auth_security_scheme=HttpAuthSecurityScheme(
            description="the same bearer token as Vigil's REST API (a viewer's token is enough)"))},
        security_requirements=[SecurityRequirement(schemes={"bearer": StringList()})],
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain", "application/json"],
        skills=skills,
    )


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _answer_text(answer: Answer) -> str:
    lines = [f"{line.text} [{', '.join(f.cite for f in line.facts)}]" for line in answer.answer]
    lines += [f"proposed action (needs a person's approval): {p.action} {p.target}" for p in answer.proposals
              if p.accepted]
    if answer.note:
        lines.append(f"note: {answer.note}")
    return "\n".join(lines)


class TaskBook:
    """The finished tasks GetTask can return, bounded."""

    def __init__(self, size: int = MAX_TASKS) -> None:
        self.size = size
        self._tasks: OrderedDict[str, Task] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, task: Task) -> None:
        with self._lock:
            self._tasks[task.id] = task
            while len(self._tasks) > self.size:
                self._tasks.popitem(last=False)

    def get(self, task_id: str) -> Task | None:
        with self._lock:
            return self._tasks.get(task_id)


def run_task(ctx: ServeContext, message: Message) -> Task:
    """Answer the message's text as a completed task (or a rejected one when nothing can answer it)."""
    question = " ".join(p.text for p in message.parts if p.text).strip()[:2000]
    context_id = message.context_id or str(uuid.uuid4())
    task_id = str(uuid.uuid4())
    incoming = message.model_copy(update={"context_id": context_id, "task_id": task_id, "role": "ROLE_USER"})

    def reply(text: str) -> Message:
        return Message(message_id=str(uuid.uuid4()), context_id=context_id, task_id=task_id, role="ROLE_AGENT",
                       parts=[Part(text=text, media_type="text/plain")])

    if not question:
        return Task(id=task_id, context_id=context_id, history=[incoming], status=TaskStatus(
            state="TASK_STATE_REJECTED", message=reply("the message holds no text question"), timestamp=_now()))
    try:
        answer, _ = answer_question(Toolbox(ctx), question, LlmClient.from_settings(ctx.settings))
    except VigilInputError as err:
        return Task(id=task_id, context_id=context_id, history=[incoming], status=TaskStatus(
            state="TASK_STATE_REJECTED", message=reply(str(err)), timestamp=_now()))
    text = _answer_text(answer)
    artifact = Artifact(artifact_id=str(uuid.uuid4()), name="answer", parts=[
        Part(text=text, media_type="text/plain"),
        Part(data=answer.model_dump(mode="json"), media_type="application/json")])
    return Task(id=task_id, context_id=context_id, history=[incoming], artifacts=[artifact],
                status=TaskStatus(state="TASK_STATE_COMPLETED", message=reply(text), timestamp=_now()))


def _error(request_id: Any, code: int, message: str) -> JSONResponse:
    body = RpcResponse(id=_echo(request_id), error=RpcError(code=code, message=message))
    return JSONResponse(body.model_dump(mode="json", exclude_none=True) | {"id": _echo(request_id)})


def _result(request_id: Any, result: dict[str, Any]) -> JSONResponse:
    return JSONResponse(RpcResponse(id=_echo(request_id), result=result).model_dump(mode="json", exclude_none=True)
                        | {"id": _echo(request_id)})


def _echo(request_id: Any) -> str | int | None:
    """The request's id as JSON-RPC allows it back (a string, a number or null)."""
    return request_id if isinstance(request_id, str | int) and not isinstance(request_id, bool) else None


card_router = APIRouter(tags=["a2a"])
router = APIRouter(tags=["a2a"], dependencies=[Depends(check_read)])


@card_router.get(CARD_PATH, responses={200: {"model": AgentCard}})
def card(request: Request) -> JSONResponse:
    """The agent card: public, as discovery needs; it says which token the endpoint wants."""
    body = agent_card(str(request.base_url)).model_dump(mode="json", by_alias=True)
    return JSONResponse(body, headers={"Cache-Control": "max-age=300"})


@router.post(RPC_PATH, responses={200: {"model": RpcResponse}})
async def rpc(request: Request) -> JSONResponse:
    """JSON-RPC 2.0: ``SendMessage`` (or ``message/send``) answers a question; ``GetTask`` returns a finished
    task again. Protocol errors come back as JSON-RPC error objects with HTTP 200."""
    from starlette.concurrency import run_in_threadpool

    try:
        body = await request.json()
    except ValueError:
        return _error(None, PARSE_ERROR, "the body is not JSON")
    if not isinstance(body, dict) or body.get("jsonrpc") != "2.0" or not isinstance(body.get("method"), str):
        return _error(body.get("id") if isinstance(body, dict) else None, INVALID_REQUEST,
                      "expected a JSON-RPC 2.0 request object with a method")
    request_id, method, params = body.get("id"), body["method"], body.get("params") or {}
    ctx: ServeContext = request.app.state.ctx
    book: TaskBook = request.app.state.a2a_tasks
    try:
        if method in ("SendMessage", "message/send"):
            sent = SendMessageParams.model_validate(params)
            started = time.monotonic()
            # the tools run the MCP server's coroutines with asyncio.run: off the event loop's thread
            task = await run_in_threadpool(run_task, ctx, sent.message)
            book.add(task)
            result = task.model_dump(mode="json", by_alias=True, exclude_none=True)
            result.setdefault("metadata", {})["seconds"] = round(time.monotonic() - started, 3)
            return _result(request_id, {"task": result})
        if method in ("GetTask", "tasks/get"):
            wanted = GetTaskParams.model_validate(params)
            found = book.get(wanted.id)
            if found is None:
                return _error(request_id, TASK_NOT_FOUND, f"no task {wanted.id!r} (finished tasks are kept "
                                                          f"for the last {book.size})")
            return _result(request_id, found.model_dump(mode="json", by_alias=True, exclude_none=True))
        if method in ("SendStreamingMessage", "message/stream", "CancelTask", "tasks/cancel"):
            return _error(request_id, UNSUPPORTED_OPERATION, f"{method} is not supported: tasks finish within "
                                                             "the request (capabilities.streaming is false)")
    except ValidationError as err:
        return _error(request_id, INVALID_PARAMS, f"invalid params: {describe_validation_error(err)}")
    return _error(request_id, METHOD_NOT_FOUND, f"no method {method!r}; this agent serves SendMessage and GetTask")
