"""A scripted OpenAI-compatible /chat/completions server for the model path of `vigil ask`."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from vigil.diagnose.llm import LlmClient


@dataclass
class ScriptedEndpoint:
    """An OpenAI-compatible /chat/completions that replies with canned messages in order."""

    replies: list[dict[str, Any]]
    requests: list[dict[str, Any]] = field(default_factory=list)


def tool_call(call_id: str, name: str, **args: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


@pytest.fixture
def endpoint() -> Iterator[tuple[ScriptedEndpoint, str]]:
    script = ScriptedEndpoint(replies=[])

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            script.requests.append(body)
            message = script.replies[min(len(script.requests), len(script.replies)) - 1]
            payload = json.dumps({"choices": [{"message": message}],
                                  "usage": {"total_tokens": 400}}).encode()
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
    yield script, f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    thread.join()
    server.server_close()


def client_for(url: str) -> LlmClient:
    return LlmClient(base_url=url, model="scripted", retries=0)
