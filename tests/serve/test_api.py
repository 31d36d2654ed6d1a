"""REST API over a store filled by the simulator and the pipeline: reads and writes behind tokens."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.serve.alertmanager_payload import PAYLOAD
from tests.serve.conftest import APPROVER, APPROVER_AUTH, STRAGGLER_RANK, TOKEN, SimCluster, reader_cookies
from vigil.faces.api.app import create_app
from vigil.model import Action, ActionKind, ActionStatus, Event, FaultLevel, IncidentStatus
from vigil.remedy.actuators.base import OutboxActuator
from vigil.remedy.audit import AuditLog
from vigil.remedy.remediator import Remediator

AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def client(cluster: SimCluster) -> Iterator[TestClient]:
    app = create_app(cluster.store, cluster.metrics, cluster.settings())
    with TestClient(app, cookies=reader_cookies()) as test_client:
        yield test_client


def test_reads_and_pages_need_a_token_when_one_is_configured(cluster: SimCluster) -> None:
    app = create_app(cluster.store, cluster.metrics, cluster.settings())
    with TestClient(app) as anonymous:
        for path in ("/api/v1/incidents", "/api/v1/nodes", "/api/v1/cluster/map", "/api/v1/runs",
                     "/api/v1/events"):
            assert anonymous.get(path).status_code == 401, path
        page = anonymous.get("/")
        assert page.status_code == 401 and 'id="sign-in-form"' in page.text and "bearer token" in page.text
        assert anonymous.get(f"/incidents/{cluster.incident.id}").status_code == 401
        assert cluster.incident.title not in anonymous.get(f"/incidents/{cluster.incident.id}").text
        assert anonymous.get("/api/v1/health").status_code == 200  # probes poll it without a token
        assert anonymous.get("/static/vigil.js").status_code == 200  # the sign-in page needs it
    with TestClient(app, cookies={"vigil_token": "forged"}) as forged:
        assert forged.get("/").status_code == 401 and forged.get("/api/v1/nodes").status_code == 401
    with TestClient(app, cookies=reader_cookies()) as signed_in:
        assert signed_in.get("/").status_code == 200
        assert signed_in.get("/api/v1/cluster/map").status_code == 200
        # The cookie opens reads only: a write needs the Authorization header, so another site cannot
        # make a signed-in browser write.
        refused = signed_in.post("/api/v1/actions", json={"kind": "cordon", "target": "node/n001"})
        assert refused.status_code == 401
    with TestClient(app) as header_only:
        assert header_only.get("/api/v1/nodes", headers=AUTH).status_code == 200
        assert header_only.get("/", headers=APPROVER_AUTH).status_code == 200
    # No users and no token: reads stay open, as on a laptop.
    with TestClient(create_app(cluster.store, cluster.metrics, cluster.settings(api_token="", users_file=None))) as o:
        assert o.get("/api/v1/nodes").status_code == 200 and o.get("/").status_code == 200


def test_nodes_and_gpus_carry_the_stores_fault_levels(client: TestClient, cluster: SimCluster) -> None:
    health = cluster.store.node_health()
    nodes = client.get("/api/v1/nodes").json()
    assert len(nodes) == 8 and all(len(n["gpus"]) == 8 for n in nodes)
    for node in nodes:
        for gpu in node["gpus"]:
            assert gpu["level"] == health[gpu["id"]].label
    bad = client.get("/api/v1/gpus", params={"min_level": "drain"}).json()
    expected = {e for e, level in health.items() if e.startswith("gpu/") and level >= FaultLevel.DRAIN}
    assert {g["id"] for g in bad} == expected and expected
    # The integer form is still read (old scripts), and answered with labels.
    assert client.get("/api/v1/gpus", params={"min_level": int(FaultLevel.DRAIN)}).json() == bad
    assert client.get("/api/v1/gpus", params={"min_level": 9}).status_code == 422
    assert client.get("/api/v1/gpus", params={"min_level": "loud"}).status_code == 422


def test_fault_levels_are_labels_in_every_json_answer(client: TestClient, cluster: SimCluster) -> None:
    labels = ["healthy", "observe", "degraded", "drain", "isolate"]
    incidents = client.get("/api/v1/incidents", params={"limit": 500}).json()
    assert incidents and {i["level"] for i in incidents} <= set(labels)
    assert {i["level"] for i in incidents} == {i.level.label for i in cluster.result.incidents}
    rows = client.get("/api/v1/nodes").json()
    assert {r["level"] for r in rows} | {r["node_level"] for r in rows} <= set(labels)
    detail = client.get(f"/api/v1/nodes/{rows[0]['name']}").json()
    assert detail["level"] in labels and all(e["level"] in labels for e in detail["events"])
    cluster_map = client.get("/api/v1/cluster/map").json()
    assert cluster_map["level_names"] == labels
    assert all(i["level"] in labels for i in cluster_map["incidents"])
    schema = client.get("/openapi.json").json()["components"]["schemas"]
    assert schema["NodeRow"]["properties"]["level"]["enum"] == labels


def test_incident_detail_and_diagnosis(client: TestClient, cluster: SimCluster) -> None:
    listed = client.get("/api/v1/incidents", params={"limit": 500}).json()
    assert {i["id"] for i in listed} == {i.id for i in cluster.result.incidents}
    detail = client.get(f"/api/v1/incidents/{cluster.incident.id}").json()
    assert detail["scope"] == cluster.incident.scope and len(detail["evidence"]) == len(cluster.incident.evidence)
    diagnosis = client.get(f"/api/v1/incidents/{cluster.incident.id}/diagnosis").json()
    assert diagnosis["root_cause"]["fault_type"] == cluster.incident.fault_types[0]
    missing = client.get("/api/v1/incidents/inc-nope")
    assert missing.status_code == 404 and "inc-nope" in missing.json()["detail"]


def test_job_step_times_per_rank_and_metric_series(client: TestClient, cluster: SimCluster) -> None:
    job = cluster.run.topology.jobs[0]
    data = client.get(f"/api/v1/jobs/{job.id}").json()
    assert len(data["ranks"]) == job.world_size
    medians = {
        int(r): sorted(v for v in s["values"] if v is not None)[len(s["values"]) // 2] for r, s in data["ranks"].items()
    }
    assert max(medians, key=lambda r: medians[r]) == STRAGGLER_RANK
    gpu = cluster.run.topology.nodes[0].gpus[0].id
    series = client.get("/api/v1/metrics/series", params={"entity": gpu, "metric": "DCGM_FI_DEV_GPU_TEMP"}).json()
    assert len(series["ts"]) == cluster.run.n_ticks and series["ts"] == sorted(series["ts"])
    bad = client.get("/api/v1/metrics/series", params={"entity": "gpu/n000", "metric": "DCGM_FI_DEV_GPU_TEMP"})
    assert bad.status_code == 400 and "bad entity id" in bad.json()["detail"]
    assert client.get("/api/v1/jobs/nope").status_code == 404


def test_writes_need_the_bearer_token(cluster: SimCluster) -> None:
    body = {"kind": "cordon", "target": "node/n001", "reason": "test"}
    settings = cluster.settings(api_token="", users_file=None)
    with TestClient(create_app(cluster.store, cluster.metrics, settings)) as no_token:
        refused = no_token.post("/api/v1/actions", json=body)
        assert refused.status_code == 403 and "VIGIL_API_TOKEN" in refused.json()["detail"]
        assert no_token.get("/api/v1/actions").status_code == 200
    with TestClient(create_app(cluster.store, cluster.metrics, cluster.settings())) as client:
        assert client.post("/api/v1/actions", json=body).status_code == 401
        wrong = client.post("/api/v1/actions", json=body, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert client.post("/api/v1/actions", json=body, headers=AUTH).status_code == 201


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"kind": "format_disk", "target": "node/n001"}, "kind"),
        ({"kind": "cordon", "target": "n001"}, "target"),
        ({"kind": "cordon", "target": "node/n001", "surprise": 1}, "surprise"),
    ],
)
def test_validation_errors_are_clear_4xx(client: TestClient, body: dict[str, object], field: str) -> None:
    response = client.post("/api/v1/actions", json=body, headers=AUTH)
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert detail.startswith("invalid request:") and field in detail and "\n" not in detail


def test_action_flow_propose_approve_execute_dry_run(client: TestClient, cluster: SimCluster) -> None:
    incident = cluster.incident
    created = client.post(
        "/api/v1/actions",
        headers=AUTH,
        json={"kind": "reset_gpu", "target": "gpu/n001/3", "incident_id": incident.id, "reason": "Xid 119"},
    ).json()
    action_id = created["id"]
    early = client.post(f"/api/v1/actions/{action_id}/execute", params={"dry_run": "false"}, headers=AUTH)
    assert early.status_code == 409 and "approve" in early.json()["detail"]
    # The shared token is one identity under the two-person rule: it cannot approve what it proposed.
    own = client.post(f"/api/v1/actions/{action_id}/approve", headers=AUTH)
    assert own.status_code == 403 and "two-person rule" in own.json()["detail"]
    approved = client.post(f"/api/v1/actions/{action_id}/approve", headers=APPROVER_AUTH).json()
    assert approved["status"] == "approved" and approved["params"]["approved_by"] == APPROVER
    # This server has no remedy back end: nothing can run the action, nor say what would run it.
    for dry_run in ("false", "true"):
        refused = client.post(f"/api/v1/actions/{action_id}/execute", params={"dry_run": dry_run}, headers=AUTH)
        assert refused.status_code == 409 and "no remedy back end" in refused.json()["detail"]
    stored = cluster.store.action(action_id)
    assert stored is not None and stored.status is ActionStatus.APPROVED
    again = client.post(f"/api/v1/actions/{action_id}/approve", headers=APPROVER_AUTH)
    assert again.status_code == 200 and again.json()["status"] == "approved"
    unknown = client.post(
        "/api/v1/actions", headers=AUTH, json={"kind": "cordon", "target": "node/n001", "incident_id": "inc-missing"}
    )
    assert unknown.status_code == 404


def test_real_execution_goes_through_the_remediator(cluster: SimCluster, tmp_path: Path) -> None:
    outbox = tmp_path / "outbox.jsonl"
    remediator = Remediator([OutboxActuator(outbox)], AuditLog(cluster.store.url), dry_run=False)
    settings = cluster.settings(execute_actions=True)
    with TestClient(create_app(cluster.store, cluster.metrics, settings, remediator=remediator)) as client:
        ids = [
            client.post("/api/v1/actions", headers=AUTH, json={"kind": kind, "target": "node/n002"}).json()["id"]
            for kind in ("vendor_ticket", "cordon")
        ]
        done = []
        for action_id in ids:
            client.post(f"/api/v1/actions/{action_id}/approve", headers=APPROVER_AUTH)
            response = client.post(f"/api/v1/actions/{action_id}/execute", params={"dry_run": False}, headers=AUTH)
            done.append(response.json())
    ticket, cordon = done
    assert ticket["status"] == "executed" and not ticket["dry_run"] and ticket["params"]["actuator"] == "outbox"
    (written,) = [json.loads(line) for line in outbox.read_text().splitlines()]
    assert written["target"] == "node/n002" and written["kind"] == "vendor_ticket"
    # No actuator for cordon here: the remediator refuses and the action records why.
    assert cordon["status"] == "refused" and "no actuator" in cordon["result"]


def test_incident_status_and_create(client: TestClient, cluster: SimCluster) -> None:
    new = cluster.incident.model_copy(update={"id": "inc-api-created", "title": "from api"})
    created = client.post("/api/v1/incidents", headers=AUTH, json=new.model_dump(mode="json"))
    assert created.status_code == 201
    acked = client.post("/api/v1/incidents/inc-api-created/status", headers=AUTH, json={"status": "acknowledged"})
    assert acked.json()["status"] == "acknowledged"
    stored = cluster.store.incident("inc-api-created")
    assert stored is not None and stored.status.value == "acknowledged"
    bad = client.post("/api/v1/incidents/inc-api-created/status", headers=AUTH, json={"status": "gone"})
    assert bad.status_code == 422


def test_alertmanager_webhook_stores_events_and_counts(client: TestClient, cluster: SimCluster) -> None:
    def ours() -> list[Event]:  # other tests store alerts too; these are the payload's (by fingerprint)
        return [e for e in cluster.store.events(kind="alert_firing", limit=10000) if e.attrs["fingerprint"] == "a1b2c3"]

    before = len(ours())
    response = client.post("/api/v1/alertmanager", headers=AUTH, json=PAYLOAD)
    assert response.status_code == 200 and response.json()["stored"] == 2
    assert len(ours()) == before + 1 and ours()[-1].entity == "gpu/n003/5"
    assert 'vigil_alertmanager_alerts_total{status="firing"}' in client.get("/metrics").text
    wrong = client.post("/api/v1/alertmanager", headers=AUTH, json={**PAYLOAD, "version": "2"})
    assert wrong.status_code == 400 and "version 4" in wrong.json()["detail"]
    assert client.post("/api/v1/alertmanager", json=PAYLOAD).status_code == 401


def test_events_filter_and_ingest(client: TestClient, cluster: SimCluster) -> None:
    event = {
        "ts": 1767230000.0,
        "entity": "node/n004",
        "kind": "kernel_panic",
        "source": "test",
        "message": "Kernel panic - not syncing",
        "level": 4,
    }
    assert client.post("/api/v1/events", headers=AUTH, json=[event]).status_code == 201
    found = client.get("/api/v1/events", params={"entity": "node/n004", "kind": "kernel_panic"}).json()
    assert found and found[-1]["message"] == "Kernel panic - not syncing"
    bad = client.post("/api/v1/events", headers=AUTH, json=[{**event, "entity": "node/"}])
    assert bad.status_code == 422 and "entity" in bad.json()["detail"]


def test_promql_query_needs_a_configured_prometheus(client: TestClient) -> None:
    response = client.get("/api/v1/metrics/query", params={"query": "up"})
    assert response.status_code == 400 and "VIGIL_METRICS_URL" in response.json()["detail"]


def test_openapi_documents_the_model_records(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    assert {"Incident", "Diagnosis", "Action", "Event", "Topology"} <= set(schema["components"]["schemas"])


def test_hostile_strings_are_escaped_in_the_dashboard(client: TestClient, cluster: SimCluster) -> None:
    hostile = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    incident = cluster.incident.model_copy(
        update={"id": "inc-hostile", "title": hostile, "fault_types": [hostile], "status": IncidentStatus.RESOLVED}
    )
    assert client.post("/api/v1/incidents", headers=AUTH, json=incident.model_dump(mode="json")).status_code == 201
    for page in ("/incidents/inc-hostile", "/incidents"):
        html = client.get(page).text
        assert "<script>alert" not in html and "<img src=x" not in html
        assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in html


def test_diagnose_runs_the_rca_and_stores_its_diagnosis(client: TestClient, cluster: SimCluster) -> None:
    incident = next(i for i in cluster.result.incidents if i.id != cluster.incident.id)
    assert client.post(f"/api/v1/incidents/{incident.id}/diagnose").status_code == 401
    response = client.post(f"/api/v1/incidents/{incident.id}/diagnose", headers=AUTH)
    assert response.status_code == 202, response.text  # claimed and run on a server thread, answered at once
    started = response.json()
    status_url = f"/api/v1/incidents/{incident.id}/diagnosis/status"
    assert started["status_url"] == status_url and response.headers["location"] == status_url
    assert started["state"] in ("running", "done") and started["attempts"] >= 1
    deadline = time.monotonic() + 120
    while (state := client.get(status_url, headers=AUTH).json())["state"] == "running":
        assert time.monotonic() < deadline, "the rerun did not end within 120 s"
        time.sleep(0.05)
    assert state["state"] == "done" and state["attempts"] == started["attempts"], state
    diagnosis = client.get(f"/api/v1/incidents/{incident.id}/diagnosis", headers=AUTH).json()
    assert diagnosis["incident_id"] == incident.id and diagnosis["root_cause"] is not None
    assert diagnosis["root_cause"]["entity"] == incident.scope
    assert diagnosis["root_cause"]["fault_type"] == incident.fault_types[0]
    assert diagnosis["plan"] and all(step["action"] in {k.value for k in ActionKind} for step in diagnosis["plan"])
    stored = cluster.store.diagnosis(incident.id)
    assert stored is not None and stored.model_dump(mode="json") == diagnosis
    assert client.post("/api/v1/incidents/inc-nope/diagnose", headers=AUTH).status_code == 404


def test_job_page_falls_back_to_the_jobs_own_step_time(client: TestClient, cluster: SimCluster) -> None:
    other = cluster.run.topology.jobs[1]  # only job j00 has per-rank reports in the fixture
    assert client.get(f"/api/v1/jobs/{other.id}").json()["ranks"] == {}
    html = client.get(f"/jobs/{other.id}").text
    assert 'id="job-level"' in html and html.count('class="rank"') == 1 and "slowest" not in html
    straggling = client.get(f"/jobs/{cluster.run.topology.jobs[0].id}").text
    assert 'id="job-level"' not in straggling and 'class="rank slowest"' in straggling


def test_incident_page_says_a_retry_replaced_an_earlier_failure(client: TestClient, cluster: SimCluster) -> None:
    """The dashboard's actions table shows the stored action's replaced verdicts (params.earlier_verdicts), not only
    the retry's result."""
    cluster.store.add_action(Action(
        ts=1.0, kind=ActionKind.DRAIN, target="node/n001", incident_id=cluster.incident.id, reason="xid 79",
        status=ActionStatus.EXECUTED, result="drained n1",
        params={"earlier_verdicts": [{"status": "failed", "result": "slurm: node busy"},
                                     {"status": "failed", "result": "slurm: timed out"}]}))
    page = client.get(f"/incidents/{cluster.incident.id}")
    assert page.status_code == 200
    assert ("succeeded on retry 2 (earlier: failed: slurm: node busy; failed: slurm: timed out): drained n1"
            in page.text)
