"""The lease renewal of a running action outlives a database that is briefly away: a failed renewal is logged and
tried again at the next interval, so the owner keeps its claim; if the renewals fail past the lease and another
process takes the run over, the run's close finds it lost and records the back end's answer as a late one. On
SQLite and on PostgreSQL."""

from __future__ import annotations

import logging

import pytest
from sqlalchemy.exc import OperationalError

from tests.remedy.claims import CountingActuator, FakeClock
from tests.remedy.claims import database as database
from tests.serve.conftest import postgres_url as postgres_url
from vigil.model import Action, ActionKind, ActionStatus
from vigil.remedy.audit import AuditLog
from vigil.remedy.remediator import Remediator


class AwayAudit(AuditLog):
    """An audit log whose database refuses the first ``failures`` lease renewals, as one restarting would."""

    def __init__(self, url: str, failures: int) -> None:
        super().__init__(url)
        self.failures = failures

    def renew(self, key: str, owner: str, lease_expires: float) -> bool:
        if self.failures > 0:
            self.failures -= 1
            raise OperationalError("UPDATE remedy_intents ...", {}, ConnectionError("server closed the connection"))
        return super().renew(key, owner, lease_expires)


def drain() -> Action:
    return Action(id="act-drain-n1", ts=1_000.0, kind=ActionKind.DRAIN, target="node/n1", status=ActionStatus.APPROVED)


def test_a_failed_renewal_is_retried_and_the_claim_kept(database: str, caplog: pytest.LogCaptureFixture) -> None:
    """A 35 s drain under a 30 s lease, whose renewal at 1010 fails: the one at 1020 renews it, and at 1035 an
    engine looking for dead owners' runs leaves it alone. Before, the failed renewal ended the renewal thread, and
    the lease lapsed at 1030 with its owner alive."""
    clock = FakeClock(1_000.0)
    runs: list[str] = []
    contender = Remediator([CountingActuator(runs)], AuditLog(database), dry_run=False, requested_by="vigil-engine",
                           clock=clock, wait=clock.wait, lease_s=30.0)
    taken: list[Action] = []
    leases: list[float | None] = []

    def long_drain() -> None:
        clock.advance(10.0)  # 1010: the renewal fails
        leases.append(AuditLog(database).unfinished_runs()[0].lease_expires)
        clock.advance(10.0)  # 1020: renewed until 1050
        leases.append(AuditLog(database).unfinished_runs()[0].lease_expires)
        clock.advance(15.0)  # 1035: past the first lease; renewed at 1030 until 1060 (the clock reads 1035 then)
        taken.extend(contender.recover())

    owner_actuator = CountingActuator(runs, during=long_drain)
    owner_actuator.name = "owner"
    owner = Remediator([owner_actuator], AwayAudit(database, failures=1), dry_run=False, requested_by="vigil-api",
                       clock=clock, wait=clock.wait, lease_s=30.0)
    with caplog.at_level(logging.WARNING, logger="vigil.remedy.lease"):
        done = owner.execute(drain())
    assert leases == [1_030.0, 1_050.0]
    assert done.status is ActionStatus.EXECUTED and taken == [] and runs == ["owner:act-drain-n1"]
    (failed,) = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert failed.startswith("renewing the lease on run act-drain-n1 failed, trying again in 10 s: ")
    assert "server closed the connection" in failed


def test_renewals_failing_past_the_lease_lose_the_run(database: str) -> None:
    """The database refuses every renewal until the lease lapses (1010, 1020, 1030); at 1031 an engine takes the
    run over and completes it. The owner's drain then returns: its run's close finds the run the engine's, and the
    answer is recorded as a late completion beside the resumed run."""
    clock = FakeClock(1_000.0)
    runs: list[str] = []
    engine = Remediator([CountingActuator(runs)], AuditLog(database), dry_run=False, requested_by="vigil-engine",
                        clock=clock, wait=clock.wait, lease_s=30.0)
    resumed: list[Action] = []

    def long_drain() -> None:
        for _ in range(3):
            clock.advance(10.0)
        clock.advance(1.0)
        resumed.extend(engine.recover())

    owner_actuator = CountingActuator(runs, during=long_drain)
    owner_actuator.name = "owner"
    owner = Remediator([owner_actuator], AwayAudit(database, failures=3), dry_run=False, requested_by="vigil-api",
                       clock=clock, wait=clock.wait, lease_s=30.0)
    late = owner.execute(drain())
    (taken,) = resumed
    assert taken.status is ActionStatus.EXECUTED and taken.params["taken_over_from"] == owner.owner
    assert runs == ["owner:act-drain-n1", "counting:act-drain-n1"]
    assert late.status is ActionStatus.EXECUTED and late.params["claim_lost_to"] == engine.owner
    assert AuditLog(database).unfinished() == []
