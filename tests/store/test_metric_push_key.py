"""Revision 0007 on a database whose metric pushes hold launch reports stored twice (a report sent again after its
answer was lost, before the pushes had a key): the repeats go, the first of each stays and is keyed as the launch
route keys it, so the report sent once more is a duplicate; agents' pushes are left as they are."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from tests.store.conftest import api_client, on_postgresql, opened
from tests.store.revisions import assert_at_head_with_the_events_kept, statements, upgrade_to
from vigil.model import LaunchReport, Sample, StepTelemetry
from vigil.store.sql import Store

# Two looks of job llm, one of job eval, as a launcher of before 0007 reported them.
LOOKS = [("llm", 1767226195.25, 40), ("llm", 1767226200.5, 50), ("eval", 1767226200.5, 7)]
pushes = sa.table("metric_pushes", sa.column("ts", sa.Float), sa.column("node", sa.String),
                  sa.column("points", sa.JSON))


def pushes_at_revision_0006(url: str) -> None:
    """The store at revision 0006: each launch report's push stored twice, the first look's three times, and one
    agent's push stored twice (agents do not send a push again; two such rows stay)."""
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        upgrade_to(conn, "0006")
        rows = [{"ts": ts, "node": f"launch:{job}", "points": [["vigil_job_steps_total", f"job/{job}", steps]]}
                for job, ts, steps in LOOKS for _ in range(2)]
        rows.append(rows[0])
        rows += [{"ts": 1767226200.0, "node": "n01", "points": [["DCGM_FI_DEV_GPU_TEMP", "gpu/n01/0", 61.0]]}] * 2
        conn.execute(sa.insert(pushes), rows)
        conn.commit()
    engine.dispose()


def assert_each_report_stored_once_and_keyed(store: Store, tmp_path: Path) -> None:
    assert_at_head_with_the_events_kept(store, 0)
    stored = [(p.node, p.ts) for p in store.pushes_after(0)]
    assert sorted(stored) == sorted([(f"launch:{job}", ts) for job, ts, _ in LOOKS] + [("n01", 1767226200.0)] * 2)
    with api_client(store, tmp_path, json_body=True) as client:
        answers = [client.post("/api/v1/launches", content=LaunchReport(
            job="llm", ts=ts, world_size=1, steps=[StepTelemetry(ts=ts, steps=steps)]).model_dump_json()).json()
            for ts, steps in ((1767226200.5, 50), (1767226205.75, 60))]
    assert [(a["samples"], a["duplicate_samples"]) for a in answers] == [(2, 2), (2, 0)]
    assert len(store.pushes_after(0)) == len(stored) + 1


def test_launch_pushes_stored_twice_are_stored_once_and_keyed(db_url: str, tmp_path: Path) -> None:
    pushes_at_revision_0006(db_url)
    with statements() as sent, opened(db_url) as store:
        # PostgreSQL builds the index without holding writes off the table
        concurrently = " CONCURRENTLY" if on_postgresql(db_url) else ""
        assert f"CREATE UNIQUE INDEX{concurrently} ux_metric_pushes_push_key ON metric_pushes (push_key)" in sent
        assert_each_report_stored_once_and_keyed(store, tmp_path)
        if on_postgresql(db_url):
            with store.engine.connect() as conn:
                valid = conn.execute(sa.text("SELECT indisvalid FROM pg_index "
                                             "WHERE indexrelid = 'ux_metric_pushes_push_key'::regclass")).scalar_one()
            assert valid


def test_a_keyed_push_is_written_once(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'v.db'}")
    samples = [Sample(ts=10.0, entity="job/llm", metric="vigil_job_steps_total", value=5.0)]
    written = [store.add_samples("launch:llm", samples, key) for key in ("k", "k", None, None)]
    assert written == [1, 0, 1, 1] and len(store.pushes_after(0)) == 3
    store.close()
