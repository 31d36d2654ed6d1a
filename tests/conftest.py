"""Shared test fixtures and the one rule for a missing real part: skip locally, fail under CI=true."""

from __future__ import annotations

import os
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from tests import pg_connections

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
# Background diagnosis (`vigil serve`'s threads diagnosing every incident stored without a diagnosis, 10-18 s each
# on the 10,000-GPU store) is off in the servers the tests start - in process and as subprocesses, which inherit
# the environment - and on (serve_diagnosis_threads=1, its production default) only where a test is about it.
BACKGROUND_DIAGNOSIS_OFF = {"VIGIL_SERVE_DIAGNOSIS_THREADS": "0"}


def pytest_configure(config: pytest.Config) -> None:
    for name, value in BACKGROUND_DIAGNOSIS_OFF.items():
        os.environ.setdefault(name, value)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--pg-connections", action="store_true",
                     help="list the tests that leave client connections on the suite's PostgreSQL servers")


# The suite's PostgreSQL servers (tests.serve.conftest.postgres_url) are watched: client connections counted after
# each test's call and teardown (tests.pg_connections); the peak is printed at the end.
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    pg_connections.MONITOR.before = pg_connections.MONITOR.count(item.nodeid)
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    yield
    pg_connections.MONITOR.count(item.nodeid)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    yield
    left = pg_connections.MONITOR.left_after(item.nodeid)
    if left > 0:
        pg_connections.MONITOR.leaks[item.nodeid] = left


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    peak, test, servers = pg_connections.MONITOR.peak()
    if not servers:
        return
    terminalreporter.write_line(f"PostgreSQL client connections: peak {peak} on one of {servers} server(s) "
                                f"(at {test}); {len(pg_connections.MONITOR.leaks)} test(s) left "
                                f"{sum(pg_connections.MONITOR.leaks.values())} connection(s) after their teardown")
    if config.getoption("--pg-connections"):
        for nodeid, left in sorted(pg_connections.MONITOR.leaks.items(), key=lambda kv: -kv[1]):
            terminalreporter.write_line(f"  +{left} {nodeid}")
        for server in pg_connections.MONITOR.seen():
            left = ", ".join(f"{n} to {database}" for database, n in server.left)
            terminalreporter.write_line(f"  server {server.url}: peak {server.peak}, at its stop {left or 'none'}")


@pytest.fixture(autouse=True)
def _closed_audit_connections() -> Iterator[None]:
    """The journal's engines (one per database URL for the process, vigil.remedy.audit.engine_for) close their pooled
    connections after each test: each test's own PostgreSQL database kept 2 open for the rest of the session."""
    yield
    from vigil.remedy.audit import close_engines

    close_engines()


@pytest.fixture(autouse=True)
def _agent_state_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's node agents (and the agent processes it starts) keep their events spool in a directory of its
    own, never in the default /var/lib/vigil-agent of the machine running the tests."""
    monkeypatch.setenv("VIGIL_AGENT_STATE_DIR", str(tmp_path_factory.mktemp("agent-state")))


def in_ci() -> bool:
    """True under CI=true (or 1 / yes), where every real part and data set must be present."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def missing(what: str) -> NoReturn:
    """A real part (binary, data set, device) the test needs is absent: the test fails in CI, where a silent
    skip would leave a green run without real coverage, and skips on a developer's machine."""
    if in_ci():
        pytest.fail(f"{what} (CI=true: real parts must be present, see .ci/run)", pytrace=False)
    pytest.skip(what)


def require_binary(path_or_name: str) -> str:
    """The binary's path, found on PATH or as a file; see :func:`missing` for when it is not there."""
    found = shutil.which(path_or_name) or (path_or_name if Path(path_or_name).is_file() else None)
    if found is None:
        missing(f"{path_or_name} is not installed (apt-get install it; .ci/run does)")
    return found


def free_port() -> int:
    """A loopback TCP port nobody listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(condition: object, timeout_s: float, what: str, interval_s: float = 0.1) -> None:
    """Poll ``condition`` until it is true; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if callable(condition) and condition():
            return
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The read-only public data sets beside the checkout (../shared/data)."""
    if not SHARED_DATA.is_dir():
        missing(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA
