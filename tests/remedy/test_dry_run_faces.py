"""The REST API and the MCP tools approve and execute through one function: the same request through each, by the
same people, on one server (a Slurm back end, execution off, the recording scontrol of tests/remedy/conftest.py),
gets the same answer and leaves the same records. Before, a REST dry run called no back end and marked the action
executed ("dry-run: would cordon node/n3", past the blast-radius guard), while the MCP tool asked the back end and
left it proposed. A dry run changes nothing about the action: a refusal the guard would give is an answer, and the
action stays approved (before, it was left refused for good, as a real run's refusal leaves it)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from fastapi.testclient import TestClient
from mcp import Client
from mcp.server.mcpserver import MCPServer

from tests.remedy.conftest import calls
from tests.serve.conftest import APPROVER, APPROVER_TOKEN, TOKEN, approvers_file
from vigil.config import Settings
from vigil.faces.api.app import app_for_context
from vigil.faces.api.auth import Identity, Role, mcp_caller
from vigil.faces.api.context import ServeContext
from vigil.faces.api.mcp_server import build_mcp_server
from vigil.model import Node, Topology
from vigil.remedy.acting import remediator_for
from vigil.remedy.audit import AuditLog
from vigil.remedy.lifecycle import LifecycleStore
from vigil.store.sql import Store

PROPOSER = Identity("api", Role.ADMIN)  # the shared token's identity, over REST and MCP alike
APPROVING = Identity(APPROVER, Role.APPROVER)
BY_TOKEN = {PROPOSER: TOKEN, APPROVING: APPROVER_TOKEN}
# what differs between two records of the same request: the action's id and the times it was approved / executed
VOLATILE = {"id", "ts", "approved_at", "executed_at", "dry_run_at", "dry_run_record"}


@dataclass
class Faces:
    rest: TestClient
    mcp: MCPServer
    audit: AuditLog
    store: Store

    def stored(self, *ids: str) -> list[tuple[str, bool]]:
        """(status, dry_run) of each action as the store holds it."""
        found = [self.store.action(action_id) for action_id in ids]
        return [(a.status.value, a.dry_run) for a in found if a is not None]

    def rest_call(self, user: Identity, path: str, **kwargs: Any) -> tuple[bool, Any]:
        """(answered, the action or the refusal's text) of a REST call."""
        response = self.rest.post(f"/api/v1{path}", headers={"Authorization": f"Bearer {BY_TOKEN[user]}"},
                                  **kwargs)
        body = response.json()
        return response.is_success, body if response.is_success else body["detail"]

    def mcp_call(self, user: Identity, tool: str, **arguments: Any) -> tuple[bool, Any]:
        """(answered, the action or the refusal's text) of an MCP tool call."""
        answer: dict[str, Any] = {}

        async def session() -> None:
            token = mcp_caller.set(user)
            try:
                async with Client(self.mcp) as client:
                    answer["result"] = await client.call_tool(tool, arguments)
            finally:
                mcp_caller.reset(token)

        anyio.run(session)
        text = str(answer["result"].content[0].text)
        return not answer["result"].is_error, json.loads(text) if not answer["result"].is_error else text

    def propose(self, target: str) -> tuple[str, str]:
        """The same cordon proposed over each face and approved there by the approver: (REST id, MCP id)."""
        body = {"kind": "cordon", "target": target, "reason": "xid 79"}
        ok, by_rest = self.rest_call(PROPOSER, "/actions", json=body)
        assert ok, by_rest
        ok, by_mcp = self.mcp_call(PROPOSER, "propose_action", **body)
        assert ok, by_mcp
        for answer in (self.rest_call(APPROVING, f"/actions/{by_rest['id']}/approve"),
                       self.mcp_call(APPROVING, "approve_action", action_id=by_mcp["id"])):
            assert answer[0] and answer[1]["status"] == "approved", answer
        return by_rest["id"], by_mcp["id"]

    def execute(self, rest_id: str, mcp_id: str, **dry_run: bool) -> tuple[tuple[bool, Any], tuple[bool, Any]]:
        """The same execute request over each face (``dry_run`` as given, else each face's default)."""
        query = {"params": {"dry_run": str(dry_run["dry_run"]).lower()}} if dry_run else {}
        return (self.rest_call(PROPOSER, f"/actions/{rest_id}/execute", **query),
                self.mcp_call(PROPOSER, "execute_action", action_id=mcp_id, **dry_run))


@pytest.fixture
def faces(tmp_path: Path, fake_slurm: Path) -> Iterator[Faces]:
    settings = Settings(home=tmp_path, db_url=f"sqlite:///{tmp_path / 'vigil.db'}", api_token=TOKEN,
                        users_file=approvers_file(tmp_path))
    store = Store(settings.database_url())
    store.save_topology(Topology(nodes=[Node(name=f"n{i}", switch=f"s{i % 2}") for i in range(20)]))
    lifecycle = LifecycleStore(settings.database_url())
    remediator = remediator_for("slurm", settings, store.topology() or Topology(), lifecycle, "vigil-api")
    ctx = ServeContext(store=store, settings=settings, lifecycle=lifecycle, remediator=remediator, backend="slurm")
    with closing(store), TestClient(app_for_context(ctx)) as rest:
        yield Faces(rest, build_mcp_server(ctx, allow_writes=True), AuditLog(settings.database_url()), store)


def same(action: dict[str, Any]) -> dict[str, Any]:
    """The record without what differs between two records of the same request."""
    params = {k: v for k, v in action["params"].items() if k not in VOLATILE}
    return {**{k: v for k, v in action.items() if k not in VOLATILE}, "params": params}


def test_a_dry_run_is_the_same_over_rest_and_mcp(faces: Faces, fake_slurm: Path) -> None:
    rest_id, mcp_id = faces.propose("node/n3")
    (rest_ok, by_rest), (mcp_ok, by_mcp) = faces.execute(rest_id, mcp_id)
    assert rest_ok and mcp_ok, (by_rest, by_mcp)
    assert same(by_rest) == same(by_mcp)
    # what the back end would run, as the slurm actuator says it; nothing ran, and the action is still approved
    assert by_rest["status"] == "approved" and by_rest["dry_run"] is True
    assert by_rest["result"].startswith("dry-run: would run scontrol update nodename=n3 state=drain")
    assert by_rest["params"]["dry_run_status"] == "proposed" and by_rest["params"]["dry_run_by"] == "api"
    assert "executed_by" not in by_rest["params"] and calls(fake_slurm) == []
    assert faces.stored(rest_id, mcp_id) == [("approved", True)] * 2  # as the approval left them
    # each dry run is audited under an id of its own, naming the action it tried
    records = faces.audit.actions(target="node/n3")
    assert sorted(a.params["dry_run_of"] for a in records) == sorted([rest_id, mcp_id])
    assert sorted(a.id for a in records) == sorted([by_rest["params"]["dry_run_record"],
                                                   by_mcp["params"]["dry_run_record"]])
    assert [(a.status.value, a.dry_run, a.result) for a in records] == [("proposed", True, by_rest["result"])] * 2
    # the approval is not spent: the same dry run again answers the same
    (rest_ok, again_rest), (mcp_ok, again_mcp) = faces.execute(rest_id, mcp_id)
    assert rest_ok and mcp_ok and same(again_rest) == same(by_rest) and same(again_mcp) == same(by_mcp)
    assert len(faces.audit.actions(target="node/n3")) == 4


def test_a_proposed_action_can_be_dry_run_before_it_is_approved(faces: Faces) -> None:
    body = {"kind": "cordon", "target": "node/n5", "reason": "xid 79"}
    (_, by_rest), (_, by_mcp) = (faces.rest_call(PROPOSER, "/actions", json=body),
                                 faces.mcp_call(PROPOSER, "propose_action", **body))
    (rest_ok, tried_rest), (mcp_ok, tried_mcp) = faces.execute(by_rest["id"], by_mcp["id"])
    assert rest_ok and mcp_ok and same(tried_rest) == same(tried_mcp)
    assert tried_rest["status"] == "proposed" and tried_rest["params"]["dry_run_status"] == "proposed"
    assert faces.stored(by_rest["id"], by_mcp["id"]) == [("proposed", True)] * 2
    # a real run still needs the approval
    (rest_ok, refused_rest), (mcp_ok, refused_mcp) = faces.execute(by_rest["id"], by_mcp["id"], dry_run=False)
    assert not rest_ok and not mcp_ok and "approve it before executing" in refused_rest
    assert refused_mcp.endswith(refused_rest.replace(by_rest["id"], by_mcp["id"]))


def test_the_blast_radius_guard_judges_a_rest_dry_run_as_it_does_an_mcp_one(faces: Faces) -> None:
    rest_id, mcp_id = faces.propose("node/ghost")  # not in the topology: the guard cannot judge its share
    (rest_ok, by_rest), (mcp_ok, by_mcp) = faces.execute(rest_id, mcp_id, dry_run=True)
    assert rest_ok and mcp_ok and same(by_rest) == same(by_mcp)
    # the answer says the guard would refuse and why; the action is not refused, it stays approved
    assert by_rest["status"] == "approved" and by_rest["params"]["dry_run_status"] == "refused"
    assert by_rest["result"].startswith("dry-run: the guard would refuse: ") and "ghost" in by_rest["result"]
    assert faces.stored(rest_id, mcp_id) == [("approved", True)] * 2
    records = faces.audit.actions(target="node/ghost")
    assert [(a.status.value, a.dry_run, a.result) for a in records] == [("refused", True, by_rest["result"])] * 2
    assert sorted(a.params["dry_run_of"] for a in records) == sorted([rest_id, mcp_id])
    # and a dry run again is judged again: the guard's refusal was an answer, not the action's fate
    (rest_ok, again), (mcp_ok, _) = faces.execute(rest_id, mcp_id, dry_run=True)
    assert rest_ok and mcp_ok and again["params"]["dry_run_status"] == "refused"


@pytest.mark.parametrize("case", ["real run with execution off", "no such action"])
def test_a_refusal_is_the_same_over_rest_and_mcp(faces: Faces, case: str) -> None:
    rest_id, mcp_id = faces.propose("node/n4")
    if case == "no such action":
        rest_id = mcp_id = "act-missing"
    (rest_ok, refused_rest), (mcp_ok, refused_mcp) = faces.execute(rest_id, mcp_id, dry_run=False)
    assert not rest_ok and not mcp_ok
    assert refused_mcp.endswith(refused_rest), (refused_rest, refused_mcp)
    expected = "real execution is off" if case == "real run with execution off" else "no action 'act-missing'"
    assert expected in refused_rest
