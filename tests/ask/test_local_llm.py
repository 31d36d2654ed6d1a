"""The local model server's text side (vigil_eval/local_llm.py): tool definitions rendered for a chat template
with no tool support, a tool-calling conversation turned into plain turns, and tool calls read back from what
a small model writes. The model itself runs only in bench/ask.py --smollm2 (`make eval-llm`)."""

from __future__ import annotations

import json

import pytest

from vigil.model import VigilInputError
from vigil_eval.local_llm import chat_messages, packaged_gguf, parse_reply, tool_prompt

SPECS = [
    {"type": "function", "function": {
        "name": "job_events", "description": "A job's recorded events, oldest first. More text here.",
        "parameters": {"type": "object", "required": ["job_id"], "properties": {"job_id": {"type": "string"}}}}},
    {"type": "function", "function": {
        "name": "list_incidents", "description": "Incidents, newest first.",
        "parameters": {"type": "object", "properties": {
            "status": {"anyOf": [{"type": "string"}, {"type": "null"}]}, "limit": {"type": "integer"}}}}},
]


def test_tools_are_rendered_one_line_each_with_required_and_optional_arguments() -> None:
    text = tool_prompt(SPECS)
    assert "- job_events(job_id: string): A job's recorded events, oldest first" in text
    assert "More text here" not in text  # first sentence only
    assert "- list_incidents(status?: string, limit?: integer)" in text
    assert "<tool_call>" in text


def test_a_tool_calling_conversation_becomes_plain_turns() -> None:
    messages = [
        {"role": "system", "content": "Answer from the tools."},
        {"role": "user", "content": "why did job j00 stop?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "job_events", "arguments": '{"job_id": "j00"}'}}]},
        {"role": "tool", "tool_call_id": "a", "content": json.dumps({"call_id": "c1", "untrusted_data": {}})},
    ]
    turns = chat_messages(messages, SPECS)
    assert [t["role"] for t in turns] == ["system", "user", "assistant", "user"]
    assert turns[0]["content"].startswith("Answer from the tools.") and "job_events(" in turns[0]["content"]
    assert json.loads(turns[2]["content"].removeprefix("<tool_call>").removesuffix("</tool_call>")) == {
        "name": "job_events", "arguments": {"job_id": "j00"}}
    assert turns[3]["content"].startswith("<tool_response>") and '"call_id": "c1"' in turns[3]["content"]
    # with no system message the tools make one
    assert chat_messages(messages[1:2], SPECS)[0]["role"] == "system"


@pytest.mark.parametrize("text, calls", [
    ('<tool_call>{"name": "job_events", "arguments": {"job_id": "j00"}}</tool_call>',
     [("job_events", {"job_id": "j00"})]),
    ('Let me look. <tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool_call>{"name": "b", "arguments": '
     '{"k": 1}}</tool_call>', [("a", {}), ("b", {"k": 1})]),
    ('{"name": "list_incidents", "arguments": {"limit": 1}}', [("list_incidents", {"limit": 1})]),
    # no end tag
    ('<tool_call>{"name": "job_events", "arguments": {"job_id": "j00"}}', [("job_events", {"job_id": "j00"})]),
])
def test_tool_calls_are_read_from_what_a_small_model_writes(text: str, calls: list[tuple[str, dict]]) -> None:
    message = parse_reply(text)
    assert message["content"] is None
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]] == calls


@pytest.mark.parametrize("text", [
    '{"answer": [{"text": "Job j00 stopped.", "cites": ["c1.job"]}], "name": "x", "arguments": {}}',
    "The GPU was malfunctioning. The GPU was malfunctioning.",
    "<tool_call>not json</tool_call>",
    '<tool_call>{"arguments": {}}</tool_call>',
    '<tool_call>{"name": "job_events", "arguments": {"job_id": "j00"}',  # cut off mid-call: no call
])
def test_anything_else_is_the_reply_text(text: str) -> None:
    assert parse_reply(text) == {"role": "assistant", "content": text}


def test_a_package_that_is_not_installed_is_one_clear_error() -> None:
    with pytest.raises(VigilInputError, match="not installed"):
        packaged_gguf("no_such_model_package_here")
    with pytest.raises(VigilInputError, match="ships no .gguf"):
        packaged_gguf("vigil")
