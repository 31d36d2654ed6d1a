"""A metric push's key outlives its push: the engine prunes the pushes it has read after about five minutes, and a
launch report or agent push sent again after that is still a duplicate within push_key_window_s; after the window
it is stored once more, and the keys kept stay bounded by it."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.serve.conftest import fresh_database
from tests.serve.conftest import postgres_url as postgres_url
from tests.store.conftest import api_client, opened
from tests.store.revisions import assert_at_head_with_the_events_kept, upgrade_to
from vigil.faces.api.push_keys import launch_steps_key
from vigil.model import Event, LaunchReport, Sample, StepTelemetry
from vigil.store.sql import Store

LOOK = 1767226200.5


def _report(ts: float, steps: int) -> str:
    return LaunchReport(job="llm", ts=ts, world_size=1, steps=[StepTelemetry(ts=ts, steps=steps)]).model_dump_json()


def test_a_report_sent_again_after_its_push_was_pruned_is_a_duplicate(db_url: str, tmp_path: Path) -> None:
    """The launcher's report whose answer was lost, its push read and pruned by the engine (a newer look came
    400 s later), sent again: still a duplicate."""
    with opened(db_url) as store, api_client(store, tmp_path, json_body=True) as client:
        first = client.post("/api/v1/launches", content=_report(LOOK, 50)).json()
        assert client.post("/api/v1/launches", content=_report(LOOK + 400.0, 90)).json()["duplicate_samples"] == 0
        pushes = store.pushes_after(0)
        store.prune_pushes(pushes[0].id)  # what the engine does with a push five minutes older than the newest
        again = client.post("/api/v1/launches", content=_report(LOOK, 50)).json()
        kept = [p.ts for p in store.pushes_after(0)]
    assert first["samples"] > 0 and first["duplicate_samples"] == 0
    assert again["duplicate_samples"] == again["samples"] == first["samples"]
    assert kept == [LOOK + 400.0]


def test_a_key_is_kept_for_the_window_then_forgotten_and_the_keys_stay_bounded(tmp_path: Path) -> None:
    """With a 60 s window: a push sent again 50 s later, its push pruned, is a duplicate; 80 s later, once a newer
    push has come, it is stored again. A push a second for 300 s leaves at most the last 1.1 windows of keys."""
    now = [1000.0]
    store = Store(f"sqlite:///{tmp_path / 'v.db'}", push_key_window_s=60.0, clock=lambda: now[0])
    samples = [Sample(ts=10.0, entity="node/n01", metric="vigil_node_load1", value=1.5)]

    def push(key: str, at: float) -> int:
        now[0] = at
        written = store.add_samples("n01", samples, key)
        store.prune_pushes(2**31 - 1)  # the engine has read and pruned it
        return written

    assert [push("a", 1000.0), push("a", 1050.0), push("b", 1070.0), push("a", 1080.0)] == [1, 0, 1, 1]
    for second in range(300):
        push(f"k{second}", 2000.0 + second)
    with store.engine.connect() as conn:
        kept = conn.execute(sa.text("SELECT min(stored_at), count(*) FROM metric_push_keys")).one()
    assert kept[0] >= 2299.0 - 66.0 and kept[1] <= 67
    store.close()


def _keyed_push_at_revision_0008(url: str) -> None:
    """A launch report's push as the keyed launch route stored it before revision 0009."""
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        upgrade_to(conn, "0008")
        conn.execute(sa.text("INSERT INTO metric_pushes (ts, node, points, push_key) VALUES (:ts, 'launch:llm', "
                             "'[[\"vigil_job_steps_total\", \"job/llm\", 50.0]]', :key)"),
                     {"ts": LOOK, "key": launch_steps_key("llm", [StepTelemetry(ts=LOOK, steps=50)])})
        conn.commit()
    engine.dispose()


def test_the_keys_the_pushes_held_are_kept_after_the_upgrade(db_url: str, tmp_path: Path) -> None:
    _keyed_push_at_revision_0008(db_url)
    with opened(db_url) as store:
        assert_at_head_with_the_events_kept(store, 0)
        store.prune_pushes(store.pushes_after(0)[-1].id)
        with api_client(store, tmp_path, json_body=True) as client:
            again = client.post("/api/v1/launches", content=_report(LOOK, 50)).json()
        assert again["duplicate_samples"] == again["samples"] > 0 and store.pushes_after(0) == []


def test_a_failed_prune_of_old_keys_costs_no_stored_push_on_postgresql(postgres_url: str, tmp_path: Path,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    """Dropping old keys runs after the push committed; when it fails (here another session holds an old key's row
    and the database's lock_timeout ends the wait, as a deadlock or a busy database would), the launch report it
    follows is answered 201 with its log lines stored too, and the failure is logged (before: the report was
    answered 500 and its log lines never written, so the launcher sent it again). The next keyed push prunes."""
    url = fresh_database(postgres_url, "push_key_prune_fails")
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text("ALTER DATABASE push_key_prune_fails SET lock_timeout = '300ms'"))
    admin.dispose()
    now = [1000.0]
    store = Store(url, push_key_window_s=60.0, clock=lambda: now[0])
    step = [Sample(ts=LOOK, entity="node/n01", metric="vigil_node_load1", value=1.0)]
    assert store.add_samples("n01", step, "old") == 1
    line = Event(ts=LOOK, entity="job/llm/rank/0", kind="rank_log", source="launch", message="CUDA error",
                 attrs={"log_file": "rank0.log", "log_offset": 0})
    report = LaunchReport(job="llm", ts=LOOK, world_size=1, steps=[StepTelemetry(ts=LOOK, steps=50)], logs=[line])
    holder = sa.create_engine(url)
    locker = holder.connect()
    locker.execute(sa.text("SELECT push_key FROM metric_push_keys FOR UPDATE"))  # the old key's row, held
    now[0] = 1100.0
    with caplog.at_level(logging.WARNING, logger="vigil.store"), api_client(store, tmp_path, json_body=True) as client:
        answer = client.post("/api/v1/launches", content=report.model_dump_json())
    locker.rollback()
    locker.close()
    holder.dispose()
    assert answer.status_code == 201, answer.text
    assert answer.json()["events"] == 1 and len(store.events(kind="rank_log")) == 1
    assert len([p for p in store.pushes_after(0) if p.node == "launch:llm"]) == 1
    assert any("the next keyed push tries again" in r.getMessage() for r in caplog.records)
    now[0] = 1101.0
    assert store.add_samples("n01", step, "new") == 1
    with store.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM metric_push_keys WHERE stored_at < 1040")).scalar_one() == 0
    store.close()
