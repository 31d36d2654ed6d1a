"""A scripted OpenAI-compatible /chat/completions server for the model path of `vigil ask`: canned replies in
order, served by vigil_eval's ``serve_model``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from vigil.diagnose.llm import LlmClient
from vigil_eval.ask import serve_model


@dataclass
class ScriptedEndpoint:
    """Replies with canned messages in order (the last one again once they run out); records every request."""

    replies: list[dict[str, Any]]
    requests: list[dict[str, Any]] = field(default_factory=list)

    def reply(self, body: dict[str, Any]) -> dict[str, Any]:
        self.requests.append(body)
        return self.replies[min(len(self.requests), len(self.replies)) - 1]


def tool_call(call_id: str, name: str, **args: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


@pytest.fixture
def endpoint() -> Iterator[tuple[ScriptedEndpoint, str]]:
    script = ScriptedEndpoint(replies=[])
    with serve_model(script.reply) as url:
        yield script, url


def client_for(url: str) -> LlmClient:
    return LlmClient(base_url=url, model="scripted", retries=0)
