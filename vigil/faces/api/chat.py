"""The dashboard's chat, spoken in AG-UI (the Agent-User Interaction protocol; events from the official
``ag-ui-protocol`` package): ``POST /api/v1/agent/run`` takes a ``RunAgentInput`` (the thread's messages, the
newest user message being the question) and streams server-sent events while `vigil ask`'s answer is built:
``RUN_STARTED``; for each tool step as it finishes ``TOOL_CALL_START`` / ``TOOL_CALL_ARGS`` /
``TOOL_CALL_END`` / ``TOOL_CALL_RESULT``; the answer as ``TEXT_MESSAGE_START``, one ``TEXT_MESSAGE_CONTENT``
per cited sentence, ``TEXT_MESSAGE_END``; then ``RUN_FINISHED`` with the whole answer as its result, or
``RUN_ERROR`` when nothing can answer. A read, like the rest of the API's reads; it never acts."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import uuid
from collections.abc import AsyncIterator
from typing import Any

from ag_ui.core import (
    AssistantMessage,
    BaseEvent,
    RunAgentInput,
    RunErrorEvent,
    RunFinishedEvent,
    RunStartedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
    UserMessage,
)
from ag_ui.encoder import EventEncoder
from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from vigil.diagnose.llm import LlmClient
from vigil.faces.api.ask.agent import Turn, answer_question
from vigil.faces.api.ask.planner import Answer, StepRecord
from vigil.faces.api.ask.tools import Toolbox
from vigil.faces.api.auth import check_read
from vigil.faces.api.context import ServeContext
from vigil.model import VigilInputError

log = logging.getLogger(__name__)
MAX_RESULT_CHARS = 4000  # a tool result shown in the chat, cut (the answer's facts are checked on the whole)
MAX_HISTORY = 20  # earlier messages of the thread carried as conversation turns

router = APIRouter(prefix="/api/v1", tags=["agent"], dependencies=[Depends(check_read)])


def _text(message: Any) -> str:
    content = getattr(message, "content", None)
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(getattr(part, "text", "")) for part in content)
    return ""


def question_and_history(run: RunAgentInput) -> tuple[str, list[Turn]]:
    """The newest user message is the question; the user and assistant messages before it are the turns."""
    spoken = [m for m in run.messages if isinstance(m, UserMessage | AssistantMessage)]
    if not spoken or not isinstance(spoken[-1], UserMessage) or not _text(spoken[-1]).strip():
        raise VigilInputError("the run's last message must be a user message with the question")
    turns = [Turn(role="user" if isinstance(m, UserMessage) else "assistant", content=_text(m)[:8000])
             for m in spoken[:-1] if _text(m).strip()]
    return _text(spoken[-1]).strip()[:2000], turns[-MAX_HISTORY:]


def step_events(step: StepRecord, run_id: str) -> list[BaseEvent]:
    """One tool step as AG-UI's tool-call events (its arguments whole, its result as JSON, cut to fit)."""
    call_id = f"{run_id}-{step.id}"
    outcome = {"skipped": step.skipped} if step.skipped else {"id": step.id, "result": step.result}
    content = json.dumps(outcome)
    if len(content) > MAX_RESULT_CHARS:
        content = content[:MAX_RESULT_CHARS] + " ... (cut)"
    return [
        ToolCallStartEvent(tool_call_id=call_id, tool_call_name=step.tool),
        ToolCallArgsEvent(tool_call_id=call_id, delta=json.dumps(step.args)),
        ToolCallEndEvent(tool_call_id=call_id),
        ToolCallResultEvent(message_id=f"{call_id}-result", tool_call_id=call_id, content=content, role="tool"),
    ]


def answer_events(answer: Answer, thread_id: str, run_id: str) -> list[BaseEvent]:
    message_id = f"{run_id}-answer"
    events: list[BaseEvent] = [TextMessageStartEvent(message_id=message_id, role="assistant")]
    for line in answer.answer:
        cites = ", ".join(f.cite for f in line.facts)
        events.append(TextMessageContentEvent(message_id=message_id, delta=f"{line.text} [{cites}]\n"))
    if not answer.answer:
        events.append(TextMessageContentEvent(message_id=message_id, delta="No answer.\n"))
    events.append(TextMessageEndEvent(message_id=message_id))
    events.append(RunFinishedEvent(thread_id=thread_id, run_id=run_id, result=answer.model_dump(mode="json")))
    return events


def run_events(ctx: ServeContext, run: RunAgentInput, emit: Any) -> None:
    """Answer the run's question, handing each event to ``emit`` as it happens (called in a worker thread)."""
    emit(RunStartedEvent(thread_id=run.thread_id, run_id=run.run_id))

    def on_step(step: StepRecord) -> None:
        for event in step_events(step, run.run_id):
            emit(event)

    try:
        question, history = question_and_history(run)
        answer, _ = answer_question(Toolbox(ctx), question, LlmClient.from_settings(ctx.settings), history=history,
                                    on_step=on_step)
    except VigilInputError as err:
        emit(RunErrorEvent(message=str(err), code="no_answer"))
        return
    for event in answer_events(answer, run.thread_id, run.run_id):
        emit(event)


@router.post("/agent/run", responses={200: {"content": {"text/event-stream": {}},
                                            "description": "AG-UI events as server-sent events"}})
async def agent_run(request: Request, run: RunAgentInput) -> StreamingResponse:
    """Ask Vigil (the dashboard's chat; any AG-UI client's HttpAgent): the answer streams as AG-UI events."""
    ctx: ServeContext = request.app.state.ctx
    encoder = EventEncoder(accept=request.headers.get("accept", ""))
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[BaseEvent | None] = asyncio.Queue()

    def work() -> None:
        try:
            run_events(ctx, run, lambda event: loop.call_soon_threadsafe(queue.put_nowait, event))
        except Exception as err:  # the stream must end with an error event, not hang the browser
            log.exception("agent run %s failed", run.run_id)
            loop.call_soon_threadsafe(queue.put_nowait, RunErrorEvent(message=f"internal error: {type(err).__name__}",
                                                                      code="internal"))
        finally:
            loop.call_soon_threadsafe(queue.put_nowait, None)

    # the tools run the MCP server's coroutines with asyncio.run: in a thread of their own, off this loop
    threading.Thread(target=work, name=f"agent-run-{uuid.uuid4().hex[:6]}", daemon=True).start()

    async def stream() -> AsyncIterator[str]:
        while (event := await queue.get()) is not None:
            yield encoder.encode(event)

    return StreamingResponse(stream(), media_type=encoder.get_content_type(),
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
