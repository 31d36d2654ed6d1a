"""Shared test fixtures and the one rule for a missing real part: skip locally, fail under CI=true."""

from __future__ import annotations

import os
import shutil
import socket
import time
from pathlib import Path
from typing import NoReturn

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
# Background diagnosis (`vigil serve`'s threads diagnosing every incident stored without a diagnosis, 10-18 s each
# on the 10,000-GPU store) is off in the servers the tests start - in process and as subprocesses, which inherit
# the environment - and on (serve_diagnosis_threads=1, its production default) only where a test is about it.
BACKGROUND_DIAGNOSIS_OFF = {"VIGIL_SERVE_DIAGNOSIS_THREADS": "0"}


def pytest_configure(config: pytest.Config) -> None:
    for name, value in BACKGROUND_DIAGNOSIS_OFF.items():
        os.environ.setdefault(name, value)


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
