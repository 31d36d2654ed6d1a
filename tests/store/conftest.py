"""What the push-key tests share: an empty database of each kind the store runs on, the store opened on it, and the
server's app over a store with the shared token."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.serve.conftest import TOKEN, fresh_database
from tests.serve.conftest import postgres_url as postgres_url
from vigil.config import Settings
from vigil.faces.api.app import create_app
from vigil.store.sql import Store


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database: a SQLite file, or a fresh database on the session's PostgreSQL named after the test."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'v.db'}"
    name = re.sub(r"\W+", "_", request.node.name).lower()
    digest = hashlib.sha1(name.encode()).hexdigest()[:8]
    return fresh_database(request.getfixturevalue("postgres_url"), f"{name[:50]}_{digest}")


def on_postgresql(url: str) -> bool:
    return url.startswith("postgresql")


@contextmanager
def opened(url: str) -> Iterator[Store]:
    """The store on ``url`` (upgraded to the head at opening), closed after."""
    store = Store(url)
    try:
        yield store
    finally:
        store.close()


def api_client(store: Store, home: Path, json_body: bool = False) -> TestClient:
    """The server's app over ``store``, every request with the shared token (and a JSON content type for bodies
    sent as ``content=``); use it as a context manager."""
    settings = Settings(home=home, db_url=store.url, api_token=TOKEN)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    if json_body:
        headers["Content-Type"] = "application/json"
    return TestClient(create_app(store, settings=settings), headers=headers)
