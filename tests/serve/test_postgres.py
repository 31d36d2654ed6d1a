"""The server over a real PostgreSQL store (Debian's server, started for the test session)."""

from __future__ import annotations

from contextlib import closing
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.serve.alertmanager_payload import PAYLOAD
from tests.serve.conftest import APPROVER_AUTH, TOKEN, build_cluster, fresh_database, reader_cookies
from vigil.faces.api.app import create_app
from vigil.remedy.actuators.base import OutboxActuator
from vigil.remedy.audit import AuditLog
from vigil.remedy.remediator import Remediator

pytestmark = pytest.mark.slow
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_api_on_postgresql(postgres_url: str, tmp_path: Path) -> None:
    cluster = build_cluster(fresh_database(postgres_url, "api"), tmp_path)
    with closing(cluster.store):
        assert cluster.store.engine.dialect.name == "postgresql"
        # execution on, through the outbox back end: the action, its journal and its audit record on PostgreSQL
        remediator = Remediator([OutboxActuator(tmp_path / "outbox.jsonl")], AuditLog(cluster.store.url), dry_run=False)
        app = create_app(cluster.store, cluster.metrics, cluster.settings(execute_actions=True), remediator=remediator)
        with TestClient(app, cookies=reader_cookies()) as client:
            listed = client.get("/api/v1/incidents", params={"limit": 1000}).json()
            assert {i["id"] for i in listed} == {i.id for i in cluster.result.incidents}
            nodes = client.get("/api/v1/nodes").json()
            health = cluster.store.node_health()
            assert all(g["level"] == health[g["id"]].label for n in nodes for g in n["gpus"])
            diagnosis = client.get(f"/api/v1/incidents/{cluster.incident.id}/diagnosis").json()
            assert diagnosis["summary"] == cluster.diagnosis.summary
            action = client.post(
                "/api/v1/actions",
                headers=AUTH,
                json={"kind": "vendor_ticket", "target": "node/n003", "incident_id": cluster.incident.id},
            ).json()
            client.post(f"/api/v1/actions/{action['id']}/approve", headers=APPROVER_AUTH)
            done = client.post(f"/api/v1/actions/{action['id']}/execute", params={"dry_run": False},
                               headers=AUTH).json()
            assert done["status"] == "executed" and done["params"]["actuator"] == "outbox"
            assert client.post("/api/v1/alertmanager", headers=AUTH, json=PAYLOAD).json()["stored"] == 2
            assert "vigil_gpu_fault_level" in client.get("/metrics").text
            assert client.get("/").status_code == 200
        stored = cluster.store.action(action["id"])
        assert stored is not None and stored.status.value == "executed"
        assert cluster.store.events(kind="alert_firing")[-1].entity == "gpu/n003/5"


def test_a_rank_log_push_sent_again_is_stored_once_on_postgresql(postgres_url: str, tmp_path: Path) -> None:
    """The rank-log route's exactly-once storage on PostgreSQL (its own ON CONFLICT): the same push twice."""
    from vigil.config import Settings
    from vigil.store.sql import Store

    with closing(Store(fresh_database(postgres_url, "rank_logs"))) as store:
        settings = Settings(home=tmp_path, db_url=store.url, api_token=TOKEN)
        push = {"node": "n01", "events": [
            {"ts": 100.0, "entity": "job/llm/rank/1", "kind": "rank_log", "source": "rank", "level": 2,
             "message": "ValueError: bad batch at step 15",
             "attrs": {"signature": "python.exception", "log_file": "/logs/llm/rank-1.log", "log_offset": offset}}
            for offset in (17, 50)]}
        with TestClient(create_app(store, settings=settings)) as client:
            answers = [client.post("/api/v1/rank-logs", headers=AUTH, json=push).json() for _ in range(2)]
        assert [(a["accepted"], a["duplicates"]) for a in answers] == [(2, 0), (2, 2)]
        assert len(store.events(kind="rank_log")) == 2


def test_a_racing_push_of_the_same_lines_is_counted_once_on_postgresql(postgres_url: str) -> None:
    from tests.store.keyed_events import assert_a_racing_write_of_the_same_keys_is_counted_once

    assert_a_racing_write_of_the_same_keys_is_counted_once(fresh_database(postgres_url, "rank_logs_race"))


def test_a_batch_counts_the_events_it_wrote_on_postgresql(postgres_url: str) -> None:
    from tests.store.keyed_events import assert_a_batch_counts_the_events_it_wrote

    assert_a_batch_counts_the_events_it_wrote(fresh_database(postgres_url, "events_written"))


def test_an_events_push_and_a_launch_report_sent_again_are_stored_once_on_postgresql(
    postgres_url: str, tmp_path: Path
) -> None:
    """The events and launch routes' exactly-once storage on PostgreSQL: each push twice; the same line at
    another time, and two equal lines of one look at two offsets, are kept; the report's step telemetry is one
    push."""
    from vigil.config import Settings
    from vigil.model import Event, LaunchReport, StepTelemetry
    from vigil.store.sql import Store

    with closing(Store(fresh_database(postgres_url, "event_pushes"))) as store:
        settings = Settings(home=tmp_path, db_url=store.url, api_token=TOKEN)
        xid = "NVRM: Xid (PCI:0000:18:00): 79, pid=0, name=, GPU has fallen off the bus."
        push = [{"ts": ts, "entity": "gpu/n01/0", "kind": "xid", "source": "kernel", "level": 4, "message": xid,
                 "attrs": {"xid": 79}} for ts in (100.0, 160.0)]
        line = "RuntimeError: CUDA error: an illegal memory access was encountered"
        report = LaunchReport(job="llm", ts=100.0, world_size=2, logs=[
            Event(ts=100.0, entity="job/llm/rank/0", kind="rank_log", source="rank", message=line,
                  attrs={"log_file": "/runs/llm/rank0.log", "log_offset": offset}) for offset in (16, 83)],
            steps=[StepTelemetry(ts=ts, steps=steps, step_time_s=0.5) for ts, steps in ((95.0, 40), (100.0, 50))])
        with TestClient(create_app(store, settings=settings)) as client:
            pushed = [client.post("/api/v1/events", headers=AUTH, json=push).json() for _ in range(2)]
            reported = [client.post("/api/v1/launches", headers={**AUTH, "Content-Type": "application/json"},
                                    content=report.model_dump_json()).json() for _ in range(2)]
        assert [(a["stored"], a["duplicates"]) for a in pushed] == [(2, 0), (2, 2)]
        assert [(a["events"], a["duplicates"], a["samples"], a["duplicate_samples"]) for a in reported] == [
            (2, 0, 6, 0), (2, 2, 6, 6)]
        assert len(store.events(kind="xid")) == 2 and len(store.events(kind="rank_log")) == 2
        assert [p.node for p in store.pushes_after(0)] == ["launch:llm"]
