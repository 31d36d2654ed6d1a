"""`vigil serve` / `vigil mcp`: a user mistake is one line on stderr and exit status 2, before anything starts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import free_port
from tests.serve.conftest import REPO


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["serve", "--launch-dir", "{tmp}/missing"], "--launch-dir"),
        (["serve", "--metrics-dir", "{tmp}/missing"], "--metrics-dir"),
        (["serve", "--actuator", "ansible"], "--actuator 'ansible': expected none, kubernetes or slurm"),
        (["mcp", "--transport", "sse"], "--transport 'sse'"),
    ],
)
def test_bad_options_are_one_line_errors(tmp_path: Path, args: list[str], message: str) -> None:
    env = {
        **os.environ,
        "VIGIL_HOME": str(tmp_path),
        "VIGIL_DB_URL": f"sqlite:///{tmp_path / 'vigil.db'}",
        "PYTHONPATH": str(REPO),
    }
    done = subprocess.run(
        [sys.executable, "-m", "vigil", *[a.format(tmp=tmp_path) for a in args]],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in done.stderr


def test_a_bad_configured_remedy_backend_is_one_line(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "VIGIL_HOME": str(tmp_path),
        "VIGIL_DB_URL": f"sqlite:///{tmp_path / 'vigil.db'}",
        "VIGIL_REMEDY_BACKEND": "ansible",
        "PYTHONPATH": str(REPO),
    }
    done = subprocess.run([sys.executable, "-m", "vigil", "serve", "--port", str(free_port())], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "remedy_backend" in lines[0] and "Traceback" not in done.stderr


def _serve_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    """The process's settings for an in-process `vigil serve`: VIGIL_* from ``env`` alone, home and store in
    ``tmp_path``."""
    from vigil.config import settings

    for key in [k for k in os.environ if k.startswith("VIGIL_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("VIGIL_HOME", str(tmp_path))
    monkeypatch.setenv("VIGIL_DB_URL", f"sqlite:///{tmp_path / 'vigil.db'}")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings.cache_clear()


def _serve_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
                  args: list[str]) -> tuple[Any, Any, str]:
    """Start `vigil serve` with the server and the engine thread caught before they run: (engine, app, stderr)."""
    import uvicorn
    from typer.testing import CliRunner

    from vigil.config import settings
    from vigil.faces.cli.main import app

    _serve_settings(tmp_path, monkeypatch, env)
    caught: dict[str, Any] = {}

    def caught_engine(engine: Any) -> threading.Thread:  # a loop that ended at once, for the shutdown to join
        caught["engine"] = engine
        loop = threading.Thread(target=lambda: None)
        loop.start()
        return loop

    monkeypatch.setattr("vigil.run.engine.start_in_thread", caught_engine)
    def caught_server(server: uvicorn.Server, sockets: Any = None) -> None:  # started, and stopped at once
        caught.setdefault("app", server.config.app)
        server.started = True

    monkeypatch.setattr(uvicorn.Server, "run", caught_server)
    monkeypatch.setattr("vigil.faces.cli.serve._freeze_heap", lambda: None)
    done = CliRunner().invoke(app, ["serve", "--port", str(free_port()), "--engine", *args])
    settings.cache_clear()
    assert done.exit_code == 0, (done.output, done.exception)
    return caught["engine"], caught["app"], done.stderr


def test_serve_acts_through_the_configured_backend_dry_run_unless_execute_actions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vigil.remedy.actuators.slurm import SlurmActuator

    engine, served, stderr = _serve_engine(tmp_path, monkeypatch, {"VIGIL_REMEDY_BACKEND": "slurm"}, [])
    assert engine.remediator is not None and engine.remediator.dry_run
    assert any(isinstance(a, SlurmActuator) for a in engine.remediator.actuators)
    assert engine.remediator.guard is not None  # the blast-radius guard stands in front of it
    assert served.state.ctx.remediator is engine.remediator  # nothing is executed: approvals run as dry-runs only
    assert "remedy backend slurm: dry-run" in stderr

    engine, served, stderr = _serve_engine(tmp_path, monkeypatch, {"VIGIL_REMEDY_BACKEND": "slurm",
                                                                   "VIGIL_EXECUTE_ACTIONS": "true"}, [])
    assert engine.remediator is not None and not engine.remediator.dry_run
    assert any(isinstance(a, SlurmActuator) for a in engine.remediator.actuators)
    assert served.state.ctx.remediator is engine.remediator and "execute_actions on" in stderr

    # an explicit --actuator wins over the setting
    engine, served, _ = _serve_engine(tmp_path, monkeypatch, {"VIGIL_REMEDY_BACKEND": "slurm",
                                                              "VIGIL_EXECUTE_ACTIONS": "true"}, ["--actuator", "none"])
    assert engine.remediator is None and served.state.ctx.remediator is None


def test_the_engine_of_serve_does_not_run_again_an_action_the_server_is_executing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server resumes interrupted actions before it serves; its engine thread, starting at its first tick while
    the API may already be executing an approved action, must not take that action for one a crash left."""
    from vigil.model import Action, ActionKind, ActionStatus
    from vigil.remedy.audit import AuditLog

    engine, served, _ = _serve_engine(tmp_path, monkeypatch, {"VIGIL_REMEDY_BACKEND": "slurm",
                                                              "VIGIL_EXECUTE_ACTIONS": "true"}, [])
    assert served.state.ctx.remediator is not None and not served.state.ctx.remediator.dry_run
    in_flight = Action(ts=1_764_576_000.0, kind=ActionKind.DRAIN, target="node/n1", reason="xid 79",
                       status=ActionStatus.APPROVED)
    audit = AuditLog(f"sqlite:///{tmp_path / 'vigil.db'}")
    remediator = served.state.ctx.remediator
    now = time.time()
    assert audit.begin(in_flight.id, in_flight, owner=remediator.owner, now=now,
                       lease_expires=now + remediator.lease_s) is None  # the API began executing it
    engine.start()
    assert engine.resumed_actions == 0
    assert [a.id for a in audit.unfinished()] == [in_flight.id]  # still the API's to finish


def test_a_second_ctrl_c_during_uvicorn_s_shutdown_skips_the_engine_s_wait(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C twice while uvicorn itself shuts down (its force exit): `vigil serve` does not wait for its engine's
    tick, still running, and ends at once - exit 130, one line. Before, the second Ctrl-C was uvicorn's alone and the
    server waited for the engine all the same, a lease (2 s here) and a warning."""
    import uvicorn
    from typer.testing import CliRunner

    from tests.serve.stop_lines import AT_ONCE
    from vigil.config import settings
    from vigil.faces.cli.main import app

    _serve_settings(tmp_path, monkeypatch, {"VIGIL_REMEDY_LEASE_S": "2", "VIGIL_REMEDY_LEASE_RENEW_S": "0.5"})
    ticking = threading.Event()
    loops: list[threading.Thread] = []

    def held_tick(engine: Any) -> threading.Thread:  # a tick that runs until the test lets it end
        loop = threading.Thread(target=ticking.wait, args=(60,), daemon=True)
        loop.start()
        loops.append(loop)
        return loop

    def forced(server: uvicorn.Server, sockets: Any = None) -> None:  # served, then Ctrl-C twice
        server.started = True
        server.handle_exit(signal.SIGINT, None)
        server.handle_exit(signal.SIGINT, None)
        assert server.should_exit and server.force_exit

    monkeypatch.setattr("vigil.run.engine.start_in_thread", held_tick)
    monkeypatch.setattr(uvicorn.Server, "run", forced)
    monkeypatch.setattr("vigil.faces.cli.serve._freeze_heap", lambda: None)
    try:
        done = CliRunner().invoke(app, ["serve", "--port", str(free_port()), "--engine"])
        assert done.exit_code == 130, (done.output, done.exception)
        (loop,) = loops
        assert loop.is_alive()  # not waited for
        assert [line for line in done.stderr.splitlines() if line.startswith("vigil serve: stop")] == [AT_ONCE]
    finally:
        ticking.set()
        settings.cache_clear()
