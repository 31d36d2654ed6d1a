"""The models are the contract: every REST route and every MCP tool answers with a named pydantic model."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import pkgutil
from collections import Counter
from pathlib import Path

from pydantic import BaseModel

import vigil.faces.api
from vigil.config import Settings
from vigil.faces.api.app import create_app
from vigil.faces.api.context import ServeContext
from vigil.faces.api.mcp_server import build_mcp_server
from vigil.store.sql import Store


def _typed(schema: dict[str, object]) -> bool:
    """A reference to a named model, or a list / map of them."""
    if "$ref" in schema:
        return True
    items = schema.get("items") or schema.get("additionalProperties")
    return isinstance(items, dict) and "$ref" in items


def test_every_api_route_has_a_response_model(tmp_path: Path) -> None:
    app = create_app(Store(f"sqlite:///{tmp_path / 'vigil.db'}"), settings=Settings(home=tmp_path))
    untyped = []
    for path, methods in app.openapi()["paths"].items():
        if not path.startswith("/api/v1"):
            continue
        for method, operation in methods.items():
            ok = next(code for code in operation["responses"] if code.startswith("2"))
            content = operation["responses"][ok].get("content", {})
            if "text/event-stream" in content:
                continue  # a server-sent event stream; its events are models of their own
            if not _typed(content.get("application/json", {}).get("schema", {})):
                untyped.append(f"{method.upper()} {path}")
    assert untyped == []


def test_every_mcp_tool_has_an_output_schema(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'vigil.db'}")
    server = build_mcp_server(ServeContext(store=store, settings=Settings(home=tmp_path)), allow_writes=True)
    tools = asyncio.run(server.list_tools())
    assert len(tools) >= 9
    assert [t.name for t in tools if not (t.output_schema or {}).get("properties")] == []


def test_no_two_models_of_the_faces_share_a_name() -> None:
    """Two models of one name are one OpenAPI schema or two that only their module tells apart; each answer has its
    own name, and an answer the same as another is the same model."""
    defined: list[str] = []
    for module_info in pkgutil.walk_packages(vigil.faces.api.__path__, "vigil.faces.api."):
        module = importlib.import_module(module_info.name)
        defined += [name for name, cls in inspect.getmembers(module, inspect.isclass)
                    if issubclass(cls, BaseModel) and cls.__module__ == module.__name__]
    assert [name for name, count in Counter(defined).items() if count > 1] == []
