"""`vigil mcp` acts through the same remedy back end as `vigil serve`: --actuator, else the setting remedy_backend;
a dry run by default, execution opt-in (execute_actions); the two-person rule and the blast-radius guard as before.
The back end is Slurm against the recording scontrol of tests/remedy/conftest.py."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.server.mcpserver import MCPServer
from typer.testing import CliRunner

from tests.remedy.conftest import calls
from vigil.config import settings
from vigil.faces.api.auth import Identity, Role, mcp_caller
from vigil.model import Node, Topology


def _mcp_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
                args: list[str]) -> tuple[MCPServer, str]:
    """Run `vigil mcp --allow-writes ARGS` up to the point it would serve stdio: (its MCP server, its stderr)."""
    from vigil.faces.cli.main import app
    from vigil.store.sql import open_store

    for key in [k for k in os.environ if k.startswith("VIGIL_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("VIGIL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("VIGIL_DB_URL", f"sqlite:///{tmp_path / 'vigil.db'}")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings.cache_clear()
    open_store().save_topology(Topology(nodes=[Node(name=f"n{i}", switch=f"s{i % 2}") for i in range(20)]))
    caught: dict[str, Any] = {}
    monkeypatch.setattr(MCPServer, "run", lambda self, *_a, **_k: caught.setdefault("server", self))
    done = CliRunner().invoke(app, ["mcp", "--allow-writes", *args])
    settings.cache_clear()
    assert done.exit_code == 0, (done.output, done.exception)
    return caught["server"], done.stderr


async def _call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    return json.loads(result.content[0].text)  # type: ignore[union-attr, no-any-return]


async def _error(client: Client, tool: str, **arguments: Any) -> str:
    result = await client.call_tool(tool, arguments)
    assert result.is_error
    return str(result.content[0].text)  # type: ignore[union-attr]


def _propose_approve_execute(server: MCPServer, *, dry_run: bool = True) -> dict[str, Any]:
    """An agent (the local MCP user) proposes a cordon; it cannot approve it itself; another approver does; the
    agent executes it (``dry_run``), and tries again."""
    out: dict[str, Any] = {}

    async def session() -> None:
        async with Client(server) as agent:
            proposed = await _call(agent, "propose_action", kind="cordon", target="node/n3", reason="xid 79 on n3")
            assert proposed["status"] == "proposed"
            out["own_approval"] = await _error(agent, "approve_action", action_id=proposed["id"])
            token = mcp_caller.set(Identity("alice", Role.APPROVER))
            try:
                async with Client(server) as approver:
                    approved = await _call(approver, "approve_action", action_id=proposed["id"])
                    assert approved["status"] == "approved" and approved["params"]["approved_by"] == "alice"
            finally:
                mcp_caller.reset(token)
            out["executed"] = await _call(agent, "execute_action", action_id=proposed["id"], dry_run=dry_run)
            again = _call if dry_run else _error  # a dry run leaves the action approved; a real run spends it
            out["again"] = await again(agent, "execute_action", action_id=proposed["id"], dry_run=dry_run)

    anyio.run(session)
    return out


def test_an_mcp_proposal_stays_a_proposal_while_execution_is_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_slurm: Path
) -> None:
    from vigil.remedy.audit import AuditLog

    server, stderr = _mcp_server(tmp_path, monkeypatch, {"VIGIL_REMEDY_BACKEND": "slurm"}, [])
    assert "remedy backend slurm: dry-run" in stderr
    out = _propose_approve_execute(server)
    assert "two-person rule: mcp proposed this cordon" in out["own_approval"]
    done = out["executed"]
    assert done["status"] == "approved" and done["dry_run"] is True  # as the approval left it
    assert done["result"].startswith("dry-run: would run scontrol update nodename=n3 state=drain")
    assert done["params"]["dry_run_status"] == "proposed" and done["params"]["dry_run_by"] == "mcp"
    assert out["again"]["status"] == "approved" and out["again"]["result"] == done["result"]
    assert calls(fake_slurm) == []  # the back end was never called
    audit = AuditLog(f"sqlite:///{tmp_path / 'vigil.db'}")
    records = [(a.kind.value, a.status.value, a.params["actuator"]) for a in audit.actions()]
    assert records == [("cordon", "proposed", "slurm")] * 2


def test_an_mcp_action_reaches_the_chosen_backend_when_execution_is_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_slurm: Path
) -> None:
    # --actuator wins over the setting, as for vigil serve
    server, stderr = _mcp_server(tmp_path, monkeypatch, {"VIGIL_REMEDY_BACKEND": "none",
                                                         "VIGIL_EXECUTE_ACTIONS": "true"}, ["--actuator", "slurm"])
    assert "remedy backend slurm: execute_actions on" in stderr
    out = _propose_approve_execute(server, dry_run=False)
    assert "two-person rule" in out["own_approval"]
    done = out["executed"]
    assert done["status"] == "executed" and done["dry_run"] is False, done
    assert done["params"]["actuator"] == "slurm"
    assert [c[:3] for c in calls(fake_slurm) if c[0] == "update"] == [["update", "nodename=n3", "state=drain"]]
    assert "is executed; approve it before executing" in out["again"]


def test_mcp_without_a_backend_executes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               fake_slurm: Path) -> None:
    server, stderr = _mcp_server(tmp_path, monkeypatch, {"VIGIL_REMEDY_BACKEND": "slurm",
                                                         "VIGIL_EXECUTE_ACTIONS": "true"}, ["--actuator", "none"])
    assert "remedy backend" not in stderr

    async def session() -> None:
        async with Client(server) as agent:
            proposed = await _call(agent, "propose_action", kind="collect_logs", target="node/n3", reason="look")
            await _call(agent, "approve_action", action_id=proposed["id"])  # not destructive: no second person
            refused = await _error(agent, "execute_action", action_id=proposed["id"])
            assert refused.endswith("no remedy back end on this server (--actuator none, or the setting remedy_backend "
                               "none): nothing can run the action")

    anyio.run(session)
    assert calls(fake_slurm) == []


def test_an_mcp_dry_run_can_be_tried_again_and_then_executed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_slurm: Path
) -> None:
    """A dry run leaves the action approved: a second dry run and, once execution is on, the real run each get
    their own audit record (the audit log holds one record per id; before, the second record of the
    action's id failed - after the back end had run it)."""
    from vigil.remedy.audit import AuditLog

    async def approve_and_execute(server: MCPServer, action_id: str, *, dry_run: bool = True) -> dict[str, Any]:
        token = mcp_caller.set(Identity("alice", Role.APPROVER))
        try:
            async with Client(server) as approver:
                await _call(approver, "approve_action", action_id=action_id)
        finally:
            mcp_caller.reset(token)
        async with Client(server) as agent:
            return await _call(agent, "execute_action", action_id=action_id, dry_run=dry_run)

    dry, _ = _mcp_server(tmp_path, monkeypatch, {"VIGIL_REMEDY_BACKEND": "slurm"}, [])
    out: dict[str, Any] = {}

    async def dry_runs() -> None:
        async with Client(dry) as agent:
            proposed = await _call(agent, "propose_action", kind="cordon", target="node/n3", reason="xid 79 on n3")
        out["id"] = proposed["id"]
        out["first"] = await approve_and_execute(dry, proposed["id"])
        out["second"] = await approve_and_execute(dry, proposed["id"])

    anyio.run(dry_runs)
    assert out["first"]["status"] == out["second"]["status"] == "approved"
    assert out["first"]["params"]["dry_run_status"] == out["second"]["params"]["dry_run_status"] == "proposed"
    assert out["second"]["id"] == out["id"] and calls(fake_slurm) == []

    wet, _ = _mcp_server(tmp_path, monkeypatch, {"VIGIL_REMEDY_BACKEND": "slurm", "VIGIL_EXECUTE_ACTIONS": "true"},
                         [])

    async def real_run() -> None:
        out["real"] = await approve_and_execute(wet, out["id"], dry_run=False)

    anyio.run(real_run)
    assert out["real"]["status"] == "executed" and out["real"]["dry_run"] is False, out["real"]
    assert [c[:3] for c in calls(fake_slurm) if c[0] == "update"] == [["update", "nodename=n3", "state=drain"]]
    audit = AuditLog(f"sqlite:///{tmp_path / 'vigil.db'}")
    records = [(a.status.value, a.dry_run) for a in audit.actions(target="node/n3")]
    assert records == [("proposed", True), ("proposed", True), ("executed", False)]
    assert [a.id for a in audit.actions(target="node/n3")][-1] == out["id"]
    assert all(a.params.get("dry_run_of") == out["id"] for a in audit.actions(target="node/n3")[:2])
