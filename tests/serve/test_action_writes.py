"""Approving and executing an action from two servers on one database (`vigil serve` beside `vigil engine`, two
replicas): each server's action lock is its own, so what one writes must not undo what the other wrote meanwhile."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.serve.conftest import fresh_database
from tests.serve.conftest import postgres_url as postgres_url
from vigil.config import Settings
from vigil.faces.api.actions import approve, execute
from vigil.faces.api.auth import Identity, Role
from vigil.faces.api.context import ServeContext
from vigil.model import Action, ActionKind, ActionStatus
from vigil.remedy.actuators.base import Actuator
from vigil.remedy.audit import AuditLog
from vigil.remedy.remediator import Remediator
from vigil.store.sql import Store

OPERATOR = Identity("otto", Role.OPERATOR)
APPROVER = Identity("alan", Role.APPROVER)


class Cordon(Actuator):
    """A cordon back end; ``during`` runs inside the first dry run's or run's call, while the action is decided."""

    name = "cordon"
    kinds = frozenset({ActionKind.CORDON})
    target_kinds = frozenset({"node"})

    def __init__(self, during: Callable[[], None] | None = None) -> None:
        self.during = during

    def _meanwhile(self) -> None:
        if self.during is not None:
            during, self.during = self.during, None
            during()

    def describe(self, action: Action) -> str:
        self._meanwhile()
        return f"cordon {action.target}"

    def is_satisfied(self, action: Action) -> bool:
        return False

    def execute(self, action: Action) -> str:
        self._meanwhile()
        return f"cordoned {action.target}"


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'vigil.db'}"
    name = re.sub(r"\W+", "_", request.node.name).lower()
    digest = hashlib.sha1(name.encode()).hexdigest()[:8]
    return fresh_database(request.getfixturevalue("postgres_url"), f"writes_{name[:40]}_{digest}")


def server(database: str, home: Path, remediator: Remediator | None = None) -> ServeContext:
    """One server's context on the shared database: its own store handle (engine) and its own action lock."""
    return ServeContext(store=Store(database), settings=Settings(home=home, db_url=database), remediator=remediator,
                        backend="cordon" if remediator else "none")


def test_a_dry_run_keeps_an_approval_another_server_wrote_meanwhile(database: str, tmp_path: Path) -> None:
    """Server A dry-runs a proposed cordon; while its back end is asked what it would run, server B approves the
    action. Before, A then wrote back the action as it had read it, with the dry run's answer: the approval was
    gone, the action proposed again, and dry_run_status / dry_run_record stayed on it."""
    approving = server(database, tmp_path / "b")
    actuator = Cordon(during=lambda: approve(approving, "act-cordon-n1", APPROVER))
    trying = server(database, tmp_path / "a", Remediator([actuator], AuditLog(database), hold_dry_runs=False))
    trying.store.add_action(Action(id="act-cordon-n1", ts=1_000.0, kind=ActionKind.CORDON, target="node/n1",
                                   reason="Xid 79", requested_by="ada"))

    answer = execute(trying, "act-cordon-n1", OPERATOR, dry_run=True)

    assert actuator.during is None  # the approval was written during the dry run
    assert answer.status is ActionStatus.PROPOSED and answer.result == "dry-run: would cordon node/n1"
    assert answer.params["dry_run_status"] == "proposed" and answer.params["dry_run_by"] == "otto"
    for ctx in (trying, approving):
        stored = ctx.store.action("act-cordon-n1")
        assert stored is not None and stored.status is ActionStatus.APPROVED, stored
        assert stored.params["approved_by"] == "alan" and stored.result == ""
        assert not {k for k in stored.params if k.startswith("dry_run")}, stored.params
    # the dry run is in the audit log, under its own id, naming the action
    (record,) = AuditLog(database).actions(target="node/n1")
    assert record.id == answer.params["dry_run_record"] and record.params["dry_run_of"] == "act-cordon-n1"
    assert (record.status, record.dry_run, record.result) == (ActionStatus.PROPOSED, True, answer.result)
    for ctx in (trying, approving):
        ctx.store.close()
