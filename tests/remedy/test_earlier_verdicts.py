"""A stored action retried again and again keeps the newest replaced verdicts only (params.earlier_verdicts), the
others counted, on a real store (SQLite, PostgreSQL)."""

from __future__ import annotations

from contextlib import closing

from tests.remedy.claims import database as database
from tests.serve.conftest import postgres_url as postgres_url
from vigil.model import Action, ActionKind, ActionStatus
from vigil.store.sql import EARLIER_VERDICTS_KEPT, OPEN_ACTION_STATUSES, RETRIED_STATUSES, Store, settle_action


def test_a_retried_action_keeps_the_newest_earlier_verdicts_and_counts_the_rest(database: str) -> None:
    """30 retries of one action, each failed: the action reads the last failure, keeps the 20 verdicts before it
    (newest last) and counts the 9 dropped. Before, every replaced verdict was kept, its body growing without end."""
    with closing(Store(database)) as store:
        store.add_action(Action(id="act-drain-n1", ts=0.0, kind=ActionKind.DRAIN, target="node/n1", reason="Xid 79",
                                status=ActionStatus.APPROVED))
        for attempt in range(30):
            with store.engine.begin() as conn:
                won, _ = settle_action(conn, "act-drain-n1", OPEN_ACTION_STATUSES | RETRIED_STATUSES,
                                       ActionStatus.FAILED, result=f"attempt {attempt}",
                                       params={"retry_of": "act-drain-n1"})
            assert won
        stored = store.action("act-drain-n1")
    assert stored is not None and stored.status is ActionStatus.FAILED and stored.result == "attempt 29"
    kept = stored.params["earlier_verdicts"]
    assert len(kept) == EARLIER_VERDICTS_KEPT == 20
    assert [v["result"] for v in kept] == [f"attempt {i}" for i in range(9, 29)]
    assert stored.params["earlier_verdicts_dropped"] == 9
