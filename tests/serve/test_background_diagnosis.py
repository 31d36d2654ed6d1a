"""Incidents stored without a diagnosis are diagnosed by the server's background threads, never inside a request:
the page and the API answer while the diagnosis is held up, say it is pending, show a failure with its error and
rerun it with *Diagnose again*; a server started over incidents still lacking one (one of them claimed by a server
that died) diagnoses them all, on SQLite and the suite's PostgreSQL."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from fastapi.testclient import TestClient
from mcp import Client

from tests.serve.conftest import TOKEN, BigCluster, SimCluster, held_diagnosis
from tests.store.conftest import db_url as db_url
from tests.store.conftest import opened
from vigil.config import Settings
from vigil.faces.api.app import create_app
from vigil.faces.api.mcp_server import build_mcp_server
from vigil.model import Diagnosis, Incident, VigilInputError
from vigil.store.sql import Store

AUTH = {"Authorization": f"Bearer {TOKEN}"}
DEADLINE_S = 120.0

pytestmark = pytest.mark.timeout(600)


def wait_until(what: str, ready: Callable[[], bool], within_s: float = DEADLINE_S) -> None:
    """Poll an observable state until it holds, failing past the deadline."""
    deadline = time.monotonic() + within_s
    while not ready():
        assert time.monotonic() < deadline, f"{what}: not within {within_s:g} s"
        time.sleep(0.05)


def background_on(home: Path, url: str) -> Settings:
    """A server's settings with background diagnosis on, its production default (off in the tests' servers)."""
    return Settings(home=home, db_url=url, api_token=TOKEN, serve_diagnosis_threads=1)


def copy_of(incident: Incident, n: int) -> Incident:
    return incident.model_copy(update={"id": f"{incident.id}-copy{n}"})


def fresh_store(cluster: SimCluster, url: str, count: int = 4) -> tuple[Store, list[Incident]]:
    """A store on ``url`` with the small cluster's topology and copies of ``count`` of its incidents, none
    diagnosed."""
    store = Store(url)
    topology = cluster.store.topology()
    assert topology is not None
    store.save_topology(topology)
    incidents = [copy_of(i, 0) for i in cluster.result.incidents[:count]]
    for incident in incidents:
        store.create_incident(incident)
    return store, incidents


def status_of(client: TestClient, incident_id: str) -> dict[str, Any]:
    response = client.get(f"/api/v1/incidents/{incident_id}/diagnosis/status", headers=AUTH)
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def mcp_incident(app: Any, incident_id: str) -> dict[str, Any]:
    async def read() -> dict[str, Any]:
        async with Client(build_mcp_server(app.state.ctx)) as client:
            result = await client.call_tool("get_incident", {"incident_id": incident_id})
            assert not result.is_error, result.content
            return json.loads(result.content[0].text)  # type: ignore[union-attr, no-any-return]

    return anyio.run(read)


def test_the_page_and_the_api_answer_while_the_diagnosis_runs(cluster: SimCluster, tmp_path: Path) -> None:
    store, incidents = fresh_store(cluster, f"sqlite:///{tmp_path / 'v.db'}", count=1)
    incident = incidents[0]
    app = create_app(store, settings=background_on(tmp_path, store.url))
    with held_diagnosis(app) as (release, begun), TestClient(app) as client:
        page = client.get(f"/incidents/{incident.id}", headers=AUTH)
        assert page.status_code == 200
        assert 'id="diagnosis-pending"' in page.text and "Diagnosis in progress" in page.text
        assert begun.wait(DEADLINE_S)  # the background thread has it, held: the reads below cannot wait for it
        state = status_of(client, incident.id)
        assert (state["state"], state["pending"]) == ("running", True)
        assert client.get(f"/api/v1/incidents/{incident.id}/diagnosis", headers=AUTH).status_code == 404
        detail = mcp_incident(app, incident.id)
        assert detail["diagnosis"] is None and detail["diagnosis_pending"] is True
        assert detail["diagnosis_state"] == "running"
        # Diagnose again beside the running one is refused, not run twice
        assert client.post(f"/api/v1/incidents/{incident.id}/diagnose", headers=AUTH).status_code == 409
        assert store.diagnosis(incident.id) is None
        release.set()
        wait_until("the diagnosis stored", lambda: status_of(client, incident.id)["state"] == "done")
        stored = store.diagnosis(incident.id)
        assert stored is not None
        page = client.get(f"/incidents/{incident.id}", headers=AUTH)
        assert stored.summary in page.text and 'id="diagnosis-pending"' not in page.text
        detail = mcp_incident(app, incident.id)
        assert detail["diagnosis_pending"] is False and detail["diagnosis"]["summary"] == stored.summary
    store.close()


def test_a_failed_diagnosis_is_shown_with_its_error_and_diagnose_again_reruns_it(
    cluster: SimCluster, tmp_path: Path
) -> None:
    store, incidents = fresh_store(cluster, f"sqlite:///{tmp_path / 'v.db'}", count=1)
    incident = incidents[0]
    app = create_app(store, settings=background_on(tmp_path, store.url).model_copy(
        update={"serve_diagnosis_retries": 0}))
    ctx = app.state.ctx
    compute = ctx.diagnoser.compute

    def broken(incident_id: str) -> Diagnosis:
        raise VigilInputError("the knowledge graph is out to lunch")

    ctx.diagnoser.compute = broken
    with TestClient(app) as client:
        wait_until("the failure stored", lambda: status_of(client, incident.id)["state"] == "failed")
        assert status_of(client, incident.id)["error"] == "the knowledge graph is out to lunch"
        page = client.get(f"/incidents/{incident.id}", headers=AUTH)
        assert "Diagnosis failed: the knowledge graph is out to lunch" in page.text
        assert 'class="diagnose"' in page.text
        assert mcp_incident(app, incident.id)["diagnosis_error"] == "the knowledge graph is out to lunch"
        ctx.diagnoser.compute = compute
        again = client.post(f"/api/v1/incidents/{incident.id}/diagnose", headers=AUTH)
        assert again.status_code == 202, again.text
        wait_until("the rerun stored", lambda: status_of(client, incident.id)["state"] == "done")
        stored = store.diagnosis(incident.id)
        assert stored is not None and stored.summary in client.get(f"/incidents/{incident.id}", headers=AUTH).text
        assert client.post("/api/v1/incidents/inc-nope/diagnose", headers=AUTH).status_code == 404
    store.close()


def test_an_incident_posted_to_the_api_is_diagnosed_without_a_view(cluster: SimCluster, tmp_path: Path) -> None:
    store, incidents = fresh_store(cluster, f"sqlite:///{tmp_path / 'v.db'}")
    app = create_app(store, settings=background_on(tmp_path, store.url))
    with TestClient(app) as client:
        wait_until("the stored ones diagnosed", lambda: all(store.diagnosis(i.id) for i in incidents))
        posted = copy_of(incidents[0], 1)
        response = client.post("/api/v1/incidents", headers=AUTH, json=posted.model_dump(mode="json"))
        assert response.status_code == 201, response.text
        wait_until("the posted one diagnosed", lambda: store.diagnosis(posted.id) is not None)
    store.close()


def test_a_restarted_server_diagnoses_the_incidents_left_undiagnosed(
    cluster: SimCluster, db_url: str, tmp_path: Path
) -> None:
    store, incidents = fresh_store(cluster, db_url)
    # the server before the restart took one and died with it: its claim's lease lapses
    assert store.claim_diagnosis(incidents[0].id, "server-that-died", -1.0)
    store.close()
    with opened(db_url) as restarted:
        app = create_app(restarted, settings=background_on(tmp_path, db_url))
        with TestClient(app):
            wait_until("every incident diagnosed", lambda: all(restarted.diagnosis(i.id) for i in incidents))
        for incident in incidents:
            claim = restarted.diagnosis_claim(incident.id)
            assert claim is not None and claim.state == "done"
            assert claim.owner == app.state.ctx.diagnoser.owner
        claim = restarted.diagnosis_claim(incidents[0].id)
        assert claim is not None and claim.attempts == 2


def test_background_diagnosis_is_on_by_default_and_off_in_the_tests_servers(cluster: SimCluster) -> None:
    # production: on (one thread); the suite's servers: off through the environment, unless a test turns it on
    assert Settings.model_fields["serve_diagnosis_threads"].default == 1
    assert Settings(_env_file=None, home=cluster.home).serve_diagnosis_threads == 0  # type: ignore[call-arg]
    assert create_app(cluster.store, cluster.metrics, cluster.settings()).state.ctx.diagnoser.enabled is False
    assert create_app(cluster.store, cluster.metrics,
                      cluster.settings(serve_diagnosis_threads=1)).state.ctx.diagnoser.enabled is True


def test_a_diagnosis_reading_only_its_footprint_equals_one_reading_the_whole_window(
    cluster: SimCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # compute_diagnosis reads only the events and log lines of the incident's footprint, selected in the database
    # (record_entities); the ranking kept no other, so the diagnosis is the one made from every record of the window
    ctx = create_app(cluster.store, cluster.metrics, cluster.settings()).state.ctx
    read: dict[str, int] = {}
    events, logs = Store.events, Store.logs

    def every_event(self: Store, *args: Any, entities: Any = None, **kwargs: Any) -> Any:
        found = events(self, *args, **kwargs)
        read["all"] = len(found)
        read["kept"] = len([e for e in found if entities is None or e.entity in entities])
        return found

    def every_log(self: Store, *args: Any, entities: Any = None, **kwargs: Any) -> Any:
        return logs(self, *args, **kwargs)

    for incident in cluster.result.incidents[:6]:
        footprint_only = normalised(ctx.compute_diagnosis(incident.id))
        with monkeypatch.context() as patched:
            patched.setattr(Store, "events", every_event)
            patched.setattr(Store, "logs", every_log)
            whole_window = normalised(ctx.compute_diagnosis(incident.id))
        assert read["all"] > read["kept"] > 0  # the window holds records of other entities, the footprint some
        assert whole_window["causes"] and footprint_only == whole_window


def test_the_footprint_named_is_the_footprint_a_record_is_judged_by(cluster: SimCluster) -> None:
    # record_entities (read in SQL) names exactly the entities record_scope (select_records) accepts: every entity
    # of the topology and every entity with a stored record, for every incident of the simulated hour
    from vigil.diagnose.kg import KnowledgeGraph
    from vigil.diagnose.rca import record_entities, record_scope

    topology = cluster.store.topology()
    assert topology is not None
    kg = KnowledgeGraph.build(topology)
    recorded = {e.entity for e in cluster.store.events(limit=1_000_000)} | {
        r.entity for r in cluster.store.logs(limit=1_000_000)}
    candidates = set(kg.graph.nodes) | recorded
    anomalies = {a.id: a for a in cluster.store.anomalies(limit=1_000_000)}
    sizes = []
    for incident in cluster.result.incidents:
        own = [anomalies[a] for a in incident.anomalies if a in anomalies]
        belongs = record_scope(kg, incident, own)
        named = record_entities(kg, incident, own)
        assert {e for e in candidates if belongs(e)} == named & candidates
        assert all(belongs(e) for e in named)
        sizes.append(len(named))
    assert min(sizes) > 0 and max(sizes) < len(candidates)  # a part of the cluster, never nothing


def normalised(found: Diagnosis) -> Any:
    """The diagnosis with each event's evidence ref (a fresh random id per run) written alike."""
    return json.loads(re.sub(r"ev-[0-9a-f]{12}", "ev-*", found.model_dump_json()))


def test_diagnose_again_answers_at_once_and_the_page_waits_for_the_rerun(
    cluster: SimCluster, db_url: str, tmp_path: Path
) -> None:
    store, incidents = fresh_store(cluster, db_url, count=1)
    incident = incidents[0]
    store.save_diagnosis(Diagnosis(incident_id=incident.id, summary="the diagnosis before", root_cause=None,
                                   confidence=0.1))
    # the tests' servers run no background threads: the rerun runs on its own thread all the same
    app = create_app(store, settings=Settings(home=tmp_path, db_url=db_url, api_token=TOKEN))
    assert not app.state.ctx.diagnoser.enabled
    with held_diagnosis(app) as (release, begun), TestClient(app) as client:
        response = client.post(f"/api/v1/incidents/{incident.id}/diagnose", headers=AUTH)
        # answered while the rerun is held inside its computation: the request did not run it
        assert response.status_code == 202, response.text
        assert begun.wait(DEADLINE_S)
        started = response.json()
        assert (started["state"], started["pending"], started["attempts"]) == ("running", True, 1)
        assert started["status_url"] == f"/api/v1/incidents/{incident.id}/diagnosis/status"
        assert status_of(client, incident.id)["state"] == "running"
        page = client.get(f"/incidents/{incident.id}", headers=AUTH)
        assert "the diagnosis before" in page.text and 'data-state="running"' in page.text
        assert "Diagnosis in progress: diagnosing again" in page.text
        # a second one beside it is refused, not run twice
        assert client.post(f"/api/v1/incidents/{incident.id}/diagnose", headers=AUTH).status_code == 409
        release.set()
        wait_until("the rerun stored", lambda: status_of(client, incident.id)["state"] == "done")
        stored = store.diagnosis(incident.id)
        assert stored is not None and stored.summary != "the diagnosis before" and stored.causes
        page = client.get(f"/incidents/{incident.id}", headers=AUTH)
        assert stored.summary in page.text and 'id="diagnosis-pending"' not in page.text
        assert client.post("/api/v1/incidents/inc-nope/diagnose", headers=AUTH).status_code == 404
    store.close()


def test_a_failed_diagnosis_is_tried_again_later_and_the_status_says_so(
    cluster: SimCluster, db_url: str, tmp_path: Path
) -> None:
    from tests.store.diagnosis_leases import set_lease

    store, incidents = fresh_store(cluster, db_url, count=1)
    incident = incidents[0]
    settings = background_on(tmp_path, db_url).model_copy(update={"serve_diagnosis_retries": 2,
                                                                    "serve_diagnosis_retry_s": 3600.0})
    app = create_app(store, settings=settings)
    ctx = app.state.ctx
    compute = ctx.diagnoser.compute
    runs: list[str] = []

    def failing_twice(incident_id: str) -> Diagnosis:
        runs.append(incident_id)
        if len(runs) <= 2:
            raise VigilInputError(f"the knowledge graph is out to lunch ({len(runs)})")
        return compute(incident_id)  # type: ignore[no-any-return]

    ctx.diagnoser.compute = failing_twice
    with TestClient(app) as client:
        for failures in (1, 2):
            wait_until(f"failure {failures} stored", lambda n=failures: status_of(client, incident.id)["failures"] == n)
            state = status_of(client, incident.id)
            assert (state["state"], state["pending"], state["attempts"], state["retries"]) == (
                "retrying", True, failures, 2)
            assert state["error"] == f"the knowledge graph is out to lunch ({failures})"
            # an hour after the first failure, two after the second
            assert state["retry_at"] - time.time() > 3600.0 * 2 ** (failures - 1) - 60
            page = client.get(f"/incidents/{incident.id}", headers=AUTH)
            assert f"Diagnosis failed ({failures} of 3 tries)" in page.text and 'data-state="retrying"' in page.text
            assert len(runs) == failures  # not tried again before it is due
            set_lease(store, incident.id, time.time() - 1)  # the hour passed
        wait_until("the third try stored", lambda: status_of(client, incident.id)["state"] == "done")
        state = status_of(client, incident.id)
        assert (state["attempts"], state["failures"], state["error"]) == (3, 2, "")
        assert store.diagnosis(incident.id) is not None and len(runs) == 3
    store.close()


@pytest.mark.slow
def test_at_10000_gpus_the_footprint_read_in_sql_diagnoses_as_the_window_read(
    cluster_10k: BigCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the demo cluster's store (1,250 nodes, ~99,000 events and as many log lines in an incident's window): a
    # diagnosis reading its footprint's records in SQL is the one made from every record of the window
    ctx = create_app(cluster_10k.store, cluster_10k.metrics, cluster_10k.settings()).state.ctx
    events, logs = Store.events, Store.logs
    read: dict[str, int] = {}

    def window_events(self: Store, *args: Any, entities: Any = None, **kwargs: Any) -> Any:
        found = events(self, *args, **kwargs)
        read["window"] = len(found)
        return [e for e in found if e.entity in entities]

    def window_logs(self: Store, *args: Any, entities: Any = None, **kwargs: Any) -> Any:
        return [r for r in logs(self, *args, **kwargs) if r.entity in entities]

    picked = sorted((i for i in cluster_10k.store.incidents(limit=100_000) if i.scope.startswith("gpu/")),
                    key=lambda i: (-int(i.level), -len(i.evidence), i.id))[:2]
    assert len(picked) == 2
    for incident in picked:
        in_sql = normalised(ctx.compute_diagnosis(incident.id))
        with monkeypatch.context() as patched:
            patched.setattr(Store, "events", window_events)
            patched.setattr(Store, "logs", window_logs)
            whole_window = normalised(ctx.compute_diagnosis(incident.id))
        assert read["window"] > 50_000 and whole_window["causes"] and in_sql == whole_window


@pytest.mark.parametrize("thread_name", ["vigil-rediagnose-", "vigil-diagnose-lease"])
def test_a_rerun_that_cannot_start_a_thread_is_released_and_answered_503(
    cluster: SimCluster, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, thread_name: str
) -> None:
    """No thread to run the rerun (or to renew its claim): the claim is released, not held for good, and the client
    is told (503, one line, Retry-After); the background threads of any server, or a later request, take it."""
    store, incidents = fresh_store(cluster, db_url, count=1)
    incident = incidents[0]
    app = create_app(store, settings=Settings(home=tmp_path, db_url=db_url, api_token=TOKEN))
    worker = app.state.ctx.diagnoser
    start = threading.Thread.start

    def out_of_threads(thread: threading.Thread) -> None:
        if thread.name.startswith(thread_name):
            raise RuntimeError("can't start new thread")
        start(thread)

    with TestClient(app) as client:
        monkeypatch.setattr(threading.Thread, "start", out_of_threads)
        response = client.post(f"/api/v1/incidents/{incident.id}/diagnose", headers=AUTH)
        assert response.status_code == 503, response.text
        detail = response.json()["detail"]
        assert "can't start new thread" in detail and "\n" not in detail
        assert response.headers["Retry-After"] == "30"
        assert not worker.holding(incident.id)
        assert incident.id in store.undiagnosed()  # any server's background threads take it now
        assert status_of(client, incident.id)["state"] == "off"  # not "running": nothing runs it
        worker.stop()  # joins no thread that never started
        monkeypatch.undo()
        with held_diagnosis(app) as (release, begun):
            again = client.post(f"/api/v1/incidents/{incident.id}/diagnose", headers=AUTH)
            assert again.status_code == 202, again.text
            assert again.json()["attempts"] == 1 and begun.wait(DEADLINE_S)  # the released one not counted
            release.set()
            wait_until("the rerun stored", lambda: status_of(client, incident.id)["state"] == "done")
    store.close()
