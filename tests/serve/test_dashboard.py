"""The web dashboard in headless Chromium (Debian's, driven by Playwright): every view renders from the
store, the approve flow writes through the API, and nothing is fetched from outside the server."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import ApiClient
from sqlalchemy import delete

from tests.serve.conftest import (
    APPROVER,
    APPROVER_TOKEN,
    ARTIFACTS,
    STRAGGLER_RANK,
    TOKEN,
    SimCluster,
    held_diagnosis,
    reader_cookies,
    serve_in_thread,
)
from vigil.faces.api.app import create_app
from vigil.model import ActionStatus, Diagnosis, FaultLevel, IncidentStatus
from vigil.remedy.actuators.kubernetes import KubernetesActuator
from vigil.remedy.audit import AuditLog
from vigil.remedy.lifecycle import LifecycleStore, Trigger
from vigil.remedy.remediator import Remediator
from vigil.store import schema as tables

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "serve"
LIFECYCLE_NODE = "n006"
SERVED: dict[str, Any] = {}  # the site's app, for tests that reach into its background diagnosis


@pytest.fixture(scope="module")
def site(cluster: SimCluster) -> Iterator[str]:
    lifecycle = LifecycleStore(cluster.store.url)
    node = f"node/{LIFECYCLE_NODE}"
    if lifecycle.status(node).state.value == "healthy":
        for trigger in (Trigger.CORDON, Trigger.DRAIN, Trigger.DRAINED, Trigger.REPAIRED):
            lifecycle.apply(node, trigger, f"test: {trigger.value}")
    # a Kubernetes back end with execution off: the dry runs say what it would do, no API server is called
    remediator = Remediator([KubernetesActuator(ApiClient())], AuditLog(cluster.store.url), hold_dry_runs=False)
    app = create_app(cluster.store, cluster.metrics, cluster.settings(), launch_dirs=[FIXTURES], lifecycle=lifecycle,
                     remediator=remediator)
    SERVED["app"] = app
    with serve_in_thread(app) as base_url:
        yield base_url


@pytest.fixture
def page(browser: Any, site: str) -> Iterator[Any]:
    """A signed-in browser: the token cookie opens the pages; writes still need the token saved in the form."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.add_cookies([{"name": k, "value": v, "url": site} for k, v in reader_cookies().items()])
    tab = context.new_page()
    foreign: list[str] = []
    tab.on("request", lambda request: None if request.url.startswith(site) else foreign.append(request.url))
    yield tab
    context.close()
    assert not foreign, f"the dashboard fetched from outside the server: {foreign}"


def shot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"serve-{name}.png"), full_page=True)


def test_heat_map_shows_every_gpu_by_fault_level(page: Any, site: str, cluster: SimCluster) -> None:
    page.goto(site + "/")
    page.wait_for_function("document.body.dataset.mapReady")
    health = cluster.store.node_health()
    drawn = page.evaluate("vigilMap.state.map")
    assert len(drawn["gpu_levels"]) == 8 * 8
    for level in FaultLevel:
        expected = sum(1 for e, lv in health.items() if e.startswith("gpu/") and lv == level)
        assert drawn["counts"][level.label] == expected
        assert page.locator(f'#counts button[data-level="{int(level)}"] b').inner_text() == str(expected)
    unhealthy = sorted(e for e, lv in health.items() if e.startswith("gpu/") and lv > 0)
    assert unhealthy, "the simulated hour should leave some GPU unhealthy"
    listed = page.locator("#unhealthy-list li")
    assert sorted(listed.locator("a").all_inner_texts()) == unhealthy
    for entity in unhealthy:  # level by name beside each one, not by colour alone
        assert health[entity].label in page.locator("#unhealthy-list li", has_text=entity).inner_text()
    assert page.locator("#open-incidents table tbody tr").count() >= 1
    # GPU waste per job, as /metrics and `vigil waste` compute it.
    from vigil.detect.waste import gpu_waste, window_of

    start, end = window_of(cluster.metrics)  # type: ignore[misc]
    rows = gpu_waste(cluster.metrics, cluster.run.topology, max(start, end - 900.0), end).summary("job")
    assert page.locator("#waste table tbody tr").count() == len(rows) > 0
    for row in rows:
        cell = page.locator(f'#waste tr[data-job="{row.name}"] td.rate').inner_text()
        assert cell == ("-" if row.waste_rate is None else f"{row.waste_rate * 100:.1f}%")
    shot(page, "overview")


def test_pages_need_a_token_and_sign_in_carries_it(browser: Any, site: str, cluster: SimCluster) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    try:
        first = tab.goto(site + "/")
        assert first.status == 401 and tab.locator("#sign-in-form").is_visible()
        assert tab.locator("canvas#map").count() == 0
        tab.fill("#sign-in-token", "wrong-token")
        with tab.expect_navigation():
            tab.click("#sign-in-form button")
        assert "does not match" in tab.locator("#sign-in-reason").inner_text()
        tab.fill("#sign-in-token", APPROVER_TOKEN)
        with tab.expect_navigation():
            tab.click("#sign-in-form button")
        # Signed in: the page, the map's fetch and its event stream all carry the token (the cookie).
        tab.wait_for_function("document.body.dataset.mapReady")
        assert len(tab.evaluate("vigilMap.state.map")["gpu_levels"]) == 8 * 8
        tab.wait_for_function("document.getElementById('stream-status').textContent.includes('live updates on')")
        assert tab.goto(f"{site}/incidents/{cluster.incident.id}").status == 200
        assert tab.evaluate("window.localStorage.getItem('vigil-token')") == APPROVER_TOKEN
    finally:
        context.close()


def test_incident_detail_and_approve_flow(page: Any, site: str, cluster: SimCluster) -> None:
    incident = cluster.incident
    page.goto(f"{site}/incidents/{incident.id}")
    assert page.locator("svg.timeline circle.evidence").count() == len(incident.evidence)
    causes = page.locator("ol.causes > li")
    assert causes.count() == 2 and "root" in (causes.first.get_attribute("class") or "")
    assert incident.fault_types[0] in causes.first.inner_text()
    assert page.locator("ol.plan li").count() == len(cluster.diagnosis.plan)
    page.fill("#token", TOKEN)
    page.click("#token-form button")
    with page.expect_navigation():
        page.locator("ol.plan button.propose").first.click()
    step = cluster.diagnosis.plan[0]
    row = page.locator("table.actions tr", has_text=step.target).last
    action_id = row.get_attribute("data-action")
    assert row.locator("td.status").inner_text() == "proposed"
    # Proposed with the shared token; approved by another person (the two-person rule).
    page.fill("#token", APPROVER_TOKEN)
    page.click("#token-form button")
    with page.expect_navigation():
        row.locator("button.approve").click()
    stored = cluster.store.action(action_id)
    assert stored is not None and stored.status is ActionStatus.APPROVED and stored.incident_id == incident.id
    assert stored.params["approved_by"] == APPROVER
    with page.expect_navigation():
        page.locator(f"#action-{action_id} button.execute").click()
    assert page.locator(f"#action-{action_id} td.result").inner_text().startswith("dry-run: would cordon node")
    assert page.locator(f"#action-{action_id} td.status").inner_text() == "approved"  # a dry run keeps the approval
    shot(page, "incident")


def test_approve_without_token_shows_the_error(page: Any, site: str, cluster: SimCluster) -> None:
    page.goto(f"{site}/incidents/{cluster.incident.id}")
    page.locator("ol.plan button.propose").last.click()
    message = page.locator("#action-message")
    message.wait_for(state="visible")
    page.wait_for_function("document.getElementById('action-message').textContent.length > 0")
    assert "bearer token" in message.inner_text()


def test_job_view_highlights_the_straggler_rank(page: Any, site: str, cluster: SimCluster) -> None:
    job = cluster.run.topology.jobs[0]
    page.goto(f"{site}/jobs/{job.id}")
    assert page.locator("svg.steptimes path.rank").count() == job.world_size
    assert page.locator("svg.steptimes path.rank.slowest").get_attribute("data-rank") == str(STRAGGLER_RANK)
    assert page.locator("#placement tbody tr").count() == job.world_size
    shot(page, "job")


def test_hang_view_marks_fork_point_and_culprit_link(page: Any, site: str) -> None:
    page.goto(f"{site}/hangs/hang_run")
    # The report's typed fork point is the culprit's first frame off the majority's path, under train_step.
    fork = page.locator("li.fork-point")
    assert fork.locator("> .frame-text").inner_text() == "load_batch (data.py:12)"
    assert "culprit" in (fork.get_attribute("class") or "")
    assert page.locator("li.frame", has=fork).locator("> .frame-text").last.inner_text() == "train_step (train.py:40)"
    culprit_path = page.locator("li.fork-point li.culprit > .frame-text")
    assert culprit_path.count() == 1 and culprit_path.first.inner_text() == "read (fs.py:201)"
    assert page.locator("li.frame.culprit", has_text="all_reduce").count() == 0
    assert page.locator("svg.ring line.link.culprit").get_attribute("data-link") == "5-6"
    assert page.locator("svg.ring circle.rank.culprit").get_attribute("data-rank") == "5"
    assert page.locator("#culprits").inner_text() == "5"
    shot(page, "hang")


def test_node_lifecycle_view(page: Any, site: str) -> None:
    page.goto(f"{site}/nodes/{LIFECYCLE_NODE}")
    assert page.locator("#stage").inner_text() == "self_check"
    assert page.locator("ol.stages li.current").inner_text() == "self_check"
    assert page.locator("table.transitions tbody tr").count() == 4
    assert page.locator("svg.heatmap rect.cell").count() == 9
    shot(page, "node")


def test_incident_page_opens_at_once_and_shows_the_diagnosis_when_done(page: Any, site: str, cluster: SimCluster,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """An incident stored without a diagnosis opens at once with 'Diagnosis in progress' while the server's
    background thread works (held here until the page is up), then the diagnosis, causes and plan panels fill in
    place: no reload, no button pressed."""
    ctx = SERVED["app"].state.ctx
    incident = cluster.incident.model_copy(update={"id": f"{cluster.incident.id}-page"})
    # Background diagnosis is on for this test only, as in production, over this test's incident only: the
    # session's store is shared, and a diagnosis remembers the resolved incidents of the moment (recall), so a
    # thread sweeping it for the whole module wrote memories other tests count.
    undiagnosed = cluster.store.undiagnosed
    monkeypatch.setattr(cluster.store, "undiagnosed", lambda limit=20, now=None: [
        found for found in undiagnosed(limit=100_000, now=now) if found == incident.id])
    monkeypatch.setattr(ctx.diagnoser, "threads", 1)
    ctx.diagnoser.start()
    try:
        with held_diagnosis(SERVED["app"], incident.id) as (release, begun):
            cluster.store.create_incident(incident)
            page.goto(f"{site}/incidents/{incident.id}")
            assert "Diagnosis in progress" in page.locator("#diagnosis-pending").inner_text()
            assert page.evaluate("document.body.dataset.diagnosis") in ("pending", "running")
            page.evaluate("window.vigilSamePage = true")
            assert begun.wait(120)
            release.set()
        page.locator("ol.causes > li").first.wait_for(timeout=120_000)
        assert page.evaluate("window.vigilSamePage") is True  # filled in place, not reloaded
        assert page.evaluate("document.body.dataset.diagnosis") == "done"
        assert page.locator("#diagnosis-pending").count() == 0
        assert incident.scope in page.locator("ol.causes > li.root").inner_text()
        stored = cluster.store.diagnosis(incident.id)
        assert stored is not None and stored.summary in page.locator(".diag-summary").inner_text()
        steps = page.locator("ol.plan li")
        assert steps.count() == len(stored.plan)
        for k in range(steps.count()):
            assert "guard admitted" in steps.nth(k).inner_text() or "guard refused" in steps.nth(k).inner_text()
    finally:
        ctx.diagnoser.stop()
        # the session's store is shared: leave it holding the incidents it held
        with cluster.store.engine.begin() as conn:
            conn.execute(delete(tables.diagnoses).where(tables.diagnoses.c.incident_id == incident.id))
            conn.execute(delete(tables.diagnosis_claims).where(tables.diagnosis_claims.c.incident_id == incident.id))
            conn.execute(delete(tables.incidents).where(tables.incidents.c.id == incident.id))
            # its diagnosis remembered it (a copy of a resolved incident): test_mcp counts the memories
            conn.execute(delete(tables.incident_memories).where(tables.incident_memories.c.incident_id == incident.id))


def test_hang_view_of_a_real_launch_run(page: Any, site: str) -> None:
    page.goto(f"{site}/hangs/launch_p2p")
    assert page.locator("svg.ring line.link.culprit").get_attribute("data-link") == "1-2"
    assert page.locator("li.fork-point > .frame-text").inner_text() == "ring_exchange (probe/fault_job.py:92)"
    rows = page.locator("table.ranks tbody tr")
    # The report names rank 2 as the culprit; rank 1 is the one left waiting in a recv.
    assert rows.count() == 3 and page.locator("table.ranks tr.culprit").get_attribute("data-rank") == "2"
    assert "recv #4" in page.locator('table.ranks tr[data-rank="1"]').inner_text()
    shot(page, "hang-p2p")


def test_api_docs_page_is_served_from_the_package(page: Any, site: str) -> None:
    page.goto(f"{site}/docs")  # the page fixture fails the test on any request outside the server
    spec = page.evaluate("fetch('/openapi.json').then(r => r.json())")
    operations = sum(len(methods) for methods in spec["paths"].values())
    assert page.locator("tr.endpoint").count() == operations
    assert page.locator("#schema-Incident").count() == 1 and page.locator("#schema-Diagnosis").count() == 1
    approve = page.locator("tr.endpoint", has_text="/api/v1/actions/{action_id}/approve")
    assert "token" in approve.inner_text()
    shot(page, "docs")


def test_acknowledge_is_recorded_with_who_did_it(page: Any, site: str, cluster: SimCluster) -> None:
    incident = next(i for i in cluster.result.incidents if cluster.store.incident(i.id).status.value == "open")
    page.goto(f"{site}/incidents/{incident.id}")
    page.fill("#token", TOKEN)
    page.click("#token-form button")
    try:
        with page.expect_navigation():
            page.locator('button.set-status[data-status="acknowledged"]').click()
        assert page.locator("#incident-status").inner_text() == "acknowledged"
        assert cluster.store.incident(incident.id).status.value == "acknowledged"
        change = page.locator("table.status-changes tbody tr").last
        assert "open → acknowledged" in change.inner_text() and change.locator("td.who").inner_text()
    finally:  # the session's cluster is shared: leave the incident as the other tests expect it
        cluster.store.set_incident_status(incident.id, IncidentStatus.OPEN, "test")


def test_chat_panel_shows_each_tool_step_and_the_cited_answer(page: Any, site: str, cluster: SimCluster) -> None:
    node = cluster.run.topology.nodes[1]
    page.goto(f"{site}/ask")
    page.fill("#chat-question", f"is node {node.name} healthy?")
    page.click("#chat-send")
    page.wait_for_function("document.getElementById('chat-status').textContent.startsWith('finished')")
    events = page.evaluate("window.vigilEvents")
    assert events[0] == "RUN_STARTED" and events[-1] == "RUN_FINISHED"
    assert events.count("TOOL_CALL_START") == events.count("TOOL_CALL_RESULT") == 2
    assert events.index("TOOL_CALL_RESULT") < events.index("TEXT_MESSAGE_START")  # steps shown before the answer
    steps = page.locator("#chat-log ol.steps li")
    assert steps.evaluate_all("els => els.map(e => e.dataset.tool)") == ["node_health", "incidents_touching"]
    assert steps.evaluate_all("els => els.every(e => e.classList.contains('done'))")
    assert f"'node': '{node.name}'" in steps.first.locator(".args").inner_text().replace('"', "'")
    lines = page.locator("#chat-log .answer p.line").all_inner_texts()
    level = cluster.store.node_health().get(node.id)
    assert lines[0] == (f"Node {node.id} is at level {(level or FaultLevel.HEALTHY).label}. "
                        "[health.nodes.0.node, health.nodes.0.level]")
    assert all(line.endswith("]") for line in lines)  # every sentence names its citations
    page.fill("#chat-question", "tell me a joke")
    page.click("#chat-send")
    page.wait_for_function("document.getElementById('chat-status').textContent === 'error'")
    assert "no flow answers" in page.locator("#chat-log .message.error").inner_text()
    shot(page, "chat")


@contextmanager
def own_incident(cluster: SimCluster, suffix: str) -> Iterator[Any]:
    """A copy of the cluster's incident for one test, removed after with what its diagnosis wrote (the session's
    store is shared: test_mcp counts the remembered incidents)."""
    incident = cluster.incident.model_copy(update={"id": f"{cluster.incident.id}-{suffix}"})
    cluster.store.create_incident(incident)
    try:
        yield incident
    finally:
        with cluster.store.engine.begin() as conn:
            for table in (tables.diagnoses, tables.diagnosis_claims, tables.incident_memories):
                conn.execute(delete(table).where(table.c.incident_id == incident.id))
            conn.execute(delete(tables.incidents).where(tables.incidents.c.id == incident.id))


def test_diagnose_again_shows_progress_and_fills_the_panels_in_place(page: Any, site: str,
                                                                      cluster: SimCluster) -> None:
    """Diagnose again answers at once (202): the page says the diagnosis is in progress while the server's thread
    runs it (held here), then swaps in the new diagnosis, causes and plan: no reload."""
    ctx = SERVED["app"].state.ctx
    with own_incident(cluster, "again") as incident:
        cluster.store.save_diagnosis(Diagnosis(incident_id=incident.id, summary="the diagnosis before",
                                               root_cause=None, confidence=0.1))
        try:
            with held_diagnosis(SERVED["app"], incident.id) as (release, begun):
                page.goto(f"{site}/incidents/{incident.id}")
                assert page.evaluate("document.body.dataset.diagnosis") == "done"
                assert page.locator("ol.causes > li").count() == 0
                page.evaluate("window.vigilSamePage = true")
                page.fill("#token", TOKEN)
                page.click("#token-form button")
                page.click("button.diagnose")
                page.wait_for_function("document.body.dataset.diagnosis === 'running'")
                assert "Diagnosis in progress" in page.locator("#diagnosis-pending").inner_text()
                assert "the diagnosis before" in page.locator(".diag-summary").inner_text()
                assert begun.wait(120)
            release.set()
            page.locator("ol.causes > li").first.wait_for(timeout=120_000)
            assert page.evaluate("window.vigilSamePage") is True  # filled in place, not reloaded
            assert page.evaluate("document.body.dataset.diagnosis") == "done"
            assert page.locator("#diagnosis-pending").count() == 0
            stored = cluster.store.diagnosis(incident.id)
            assert stored is not None and stored.summary in page.locator(".diag-summary").inner_text()
            assert incident.scope in page.locator("ol.causes > li.root").inner_text()
        finally:
            # the rerun's thread ends with the diagnosis stored: nothing of it outlives the incident's removal
            assert wait_for(lambda: not ctx.diagnoser.holding(incident.id))


FAST_POLL = "window.vigilDiagnosisPoll = {everyMs: 100, slowMs: 100, backoffMs: 100, maxBackoffMs: 2000, retries: 3};"


# counts the page's requests for a diagnosis status, in the page (window.statusAsks)
COUNT_STATUS_ASKS = """
window.statusAsks = 0;
const vigilFetch = window.fetch;
window.fetch = (url, ...rest) => {
  if (String(url).endsWith("/diagnosis/status")) { window.statusAsks += 1; }
  return vigilFetch(url, ...rest);
};
"""


def status_requests(page: Any, incident_id: str) -> list[float]:
    """When the page asked for ``incident_id``'s diagnosis status (seconds, monotonic), from now on."""
    asked: list[float] = []
    page.on("request", lambda request: asked.append(time.monotonic())
            if request.url.endswith(f"/api/v1/incidents/{incident_id}/diagnosis/status") else None)
    return asked


def test_the_page_stops_asking_for_the_diagnosis_of_an_incident_gone(page: Any, site: str, cluster: SimCluster,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # background diagnosis "on" but no thread started: the incident stays pending while the page asks
    monkeypatch.setattr(SERVED["app"].state.ctx.diagnoser, "threads", 1)
    page.add_init_script(FAST_POLL)
    with own_incident(cluster, "gone") as incident:
        asked = status_requests(page, incident.id)
        with page.expect_request(lambda request: request.url.endswith(f"/{incident.id}/diagnosis/status")):
            page.goto(f"{site}/incidents/{incident.id}")  # then asks how the diagnosis stands
        assert page.evaluate("document.body.dataset.diagnosis") == "pending"
        with cluster.store.engine.begin() as conn:
            conn.execute(delete(tables.incidents).where(tables.incidents.c.id == incident.id))
        page.wait_for_function("document.body.dataset.diagnosis === 'gone'", timeout=30_000)
        assert "no longer stored (HTTP 404)" in page.locator("#diagnosis-stopped").inner_text()
        seen = len(asked)
        page.wait_for_timeout(1500)  # fifteen of its asking intervals: it asks no more
        assert len(asked) == seen


def test_diagnose_again_pressed_while_the_page_waits_asks_in_one_loop(page: Any, site: str, cluster: SimCluster,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Diagnose again pressed while the page already asks how a pending diagnosis stands leaves the asking to that
    one loop: while its status request is held, no second loop asks beside it - the page's clock run a second on
    (ten of its asking intervals) after the press, its status asks stay at one; then one page read swaps the panels
    in."""
    ctx = SERVED["app"].state.ctx
    # background diagnosis "on" but no thread started: the incident stays pending until the rerun
    monkeypatch.setattr(ctx.diagnoser, "threads", 1)
    page.add_init_script(FAST_POLL)
    with own_incident(cluster, "one-loop") as incident, held_diagnosis(SERVED["app"], incident.id) as (release, _):
        status_url = f"**/api/v1/incidents/{incident.id}/diagnosis/status"
        held: list[Any] = []
        page.route(status_url, lambda route: held.append(route))
        try:
            page.goto(site + "/")
            page.fill("#token", TOKEN)
            page.click("#token-form button")
            # the page's timers run only as far as the test moves its clock; its status asks counted in the page
            page.clock.install()
            page.add_init_script(COUNT_STATUS_ASKS)
            reads: list[str] = []
            page.on("request", lambda request: reads.append(request.url)
                    if request.url.endswith(f"/incidents/{incident.id}") else None)
            page.goto(f"{site}/incidents/{incident.id}")
            with page.expect_request(lambda request: request.url.endswith(f"/{incident.id}/diagnosis/status")):
                page.clock.run_for(100)  # the first asking interval
            page.click("button.diagnose")
            page.wait_for_function("document.getElementById('action-message').textContent"
                                   ".startsWith('diagnosing again')")
            page.clock.run_for(1000)  # a second loop would ask in its first interval
            assert page.evaluate("window.statusAsks") == 1
            page.clock.resume()
            held_request(page, held).continue_()
            page.unroute(status_url)
            release.set()
            page.locator("ol.causes > li").first.wait_for(timeout=120_000)
            assert page.evaluate("document.body.dataset.diagnosis") == "done"
            assert len(reads) == 2  # the page opened, then read once for its panels
        finally:
            release.set()
            assert wait_for(lambda: not ctx.diagnoser.holding(incident.id))


def test_a_rerun_pressed_for_while_retrying_that_fails_between_two_asks_is_shown(
    page: Any, site: str, cluster: SimCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Diagnose again pressed while the page waits on a retry due, the rerun failing before the page asks again: the
    status reads retrying as before, but of another try, so the panels are read again and show its error - not
    "diagnosing again" until the next retry runs."""
    ctx = SERVED["app"].state.ctx
    worker = ctx.diagnoser
    # background diagnosis "on" but no thread started: nothing tries it again but the rerun
    monkeypatch.setattr(worker, "threads", 1)
    page.add_init_script(FAST_POLL)
    with own_incident(cluster, "rerun-fails") as incident:
        store = cluster.store
        attempt = store.claim_diagnosis(incident.id, worker.owner, 60.0)
        assert store.finish_diagnosis(incident.id, worker.owner, None, error="the first try failed", attempt=attempt,
                                      retries=3, retry_s=3600.0)

        def failing(incident_id: str) -> Any:
            raise RuntimeError("the rerun failed")

        monkeypatch.setattr(worker, "compute", failing)
        status_url = f"**/api/v1/incidents/{incident.id}/diagnosis/status"
        page.goto(site + "/")
        page.fill("#token", TOKEN)
        page.click("#token-form button")
        with page.expect_request(lambda request: request.url.endswith(f"/{incident.id}/diagnosis/status")):
            page.goto(f"{site}/incidents/{incident.id}")
        assert page.evaluate("document.body.dataset.diagnosis") == "retrying"
        held: list[Any] = []
        page.route(status_url, lambda route: held.append(route))
        page.click("button.diagnose")
        page.wait_for_function("document.getElementById('action-message').textContent"
                               ".startsWith('diagnosing again')")
        assert wait_for(lambda: (claim := store.diagnosis_claim(incident.id)) is not None
                        and (claim.state, claim.attempts) == ("retrying", 2))
        held_request(page, held).continue_()  # the one status request asked for since the press
        page.unroute(status_url)
        page.wait_for_function("(document.getElementById('diagnosis-retrying') || {textContent: ''})"
                               ".textContent.includes('the rerun failed')", timeout=20_000)
        assert page.evaluate("document.getElementById('diagnosis').dataset.attempts") == "2"


def test_the_page_backs_off_on_server_errors_and_gives_up_after_its_retries(
    page: Any, site: str, cluster: SimCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(SERVED["app"].state.ctx.diagnoser, "threads", 1)
    page.add_init_script(FAST_POLL)
    with own_incident(cluster, "flaky") as incident:
        asked = status_requests(page, incident.id)
        page.route(f"**/api/v1/incidents/{incident.id}/diagnosis/status",
                   lambda route: route.fulfill(status=503, body='{"detail": "unavailable"}'))
        page.goto(f"{site}/incidents/{incident.id}")
        page.wait_for_function("document.body.dataset.diagnosis === 'unreachable'", timeout=30_000)
        assert "HTTP 503, 4 times" in page.locator("#diagnosis-stopped").inner_text()
        assert len(asked) == 4  # the first ask and its three retries
        gaps = [b - a for a, b in zip(asked, asked[1:], strict=False)]
        assert [g >= w * 0.9 for g, w in zip(gaps, (0.1, 0.2, 0.4), strict=True)] == [True, True, True], gaps
        seen = len(asked)
        page.wait_for_timeout(1500)
        assert len(asked) == seen


def held_request(page: Any, held: list[Any], within_s: float = 120.0) -> Any:
    """The request a route held, once the page has asked: Playwright's sync API runs route handlers only inside its
    own calls, so a request asked for while the test polled the store is handed over here, not by a bare sleep."""
    deadline = time.monotonic() + within_s
    while not held:
        assert time.monotonic() < deadline, "the page asked for no status while the route held it"
        page.wait_for_timeout(20)
    return held.pop()


def wait_for(ready: Any, within_s: float = 120.0) -> bool:
    deadline = time.monotonic() + within_s
    while not ready():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
