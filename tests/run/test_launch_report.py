"""What `vigil launch --server` reports, through the real route into the store and the live engine: the job's
placement, rank exits, step telemetry and the verdict become incidents on the right rank, node and job."""

from __future__ import annotations

import math
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.conftest import wait_for
from tests.run.clock import Clock
from vigil.config import Settings
from vigil.faces.api.app import create_app
from vigil.model import (
    Event,
    HangDiagnosis,
    IncidentStatus,
    LaunchReport,
    LaunchVerdict,
    RankPlacement,
    RankState,
    RankStatus,
    StepTelemetry,
)
from vigil.remedy.heartbeat import Heartbeat
from vigil.run.engine import Engine
from vigil.run.report import LaunchReporter, gpu_indices
from vigil.sources.probe.records import RankSnapshot
from vigil.store.sql import Store

TOKEN = "launch-token"
PLACEMENT = [RankPlacement(rank=0, node="n01", gpu=0), RankPlacement(rank=1, node="n01", gpu=1),
             RankPlacement(rank=2, node="n02", gpu=0), RankPlacement(rank=3, node="n02", gpu=1)]


class Launch:
    """A store, the server's real app in front of it, and an engine on a controlled clock."""

    def __init__(self, tmp_path: Path) -> None:
        self.settings = Settings(home=tmp_path, api_token=TOKEN, resolve_after_s=600.0)
        self.store = Store(self.settings.database_url())
        self.clock = Clock()
        self.engine = Engine(self.store, self.settings, notifiers=[], clock=self.clock)
        self.client = TestClient(create_app(self.store, settings=self.settings),
                                 headers={"Authorization": f"Bearer {TOKEN}"})
        self.step = 0

    def report(self, job: str = "llm", **parts: object) -> dict[str, object]:
        body = LaunchReport(job=job, ts=self.clock.now, world_size=4, placement=PLACEMENT, **parts)  # type: ignore[arg-type]
        response = self.client.post("/api/v1/launches", content=body.model_dump_json(),
                                    headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
        assert response.status_code == 201, response.text
        result: dict[str, object] = response.json()
        return result

    def train(self, ticks: int, step_time: float = 0.5, loss: float | None = 2.0, job: str = "llm") -> None:
        """Ticks of a healthy job: 20 steps per tick, the loss drifting down slowly."""
        for _ in range(ticks):
            self.clock.now += 10.0
            self.step += 20
            self.report(job, steps=[StepTelemetry(ts=self.clock.now, steps=self.step, step_time_s=step_time,
                                                  loss=loss, grad_norm=1.0)])
            self.engine.tick()
            if loss is not None:
                loss *= 0.999

    def stopped(self, ticks: int, step_time: float = 0.5, job: str = "llm") -> None:
        """Ticks of a job that steps no more: every report repeats its last step, as the reporter's do."""
        for _ in range(ticks):
            self.clock.now += 10.0
            self.report(job, steps=[StepTelemetry(ts=self.clock.now, steps=self.step, step_time_s=step_time,
                                                  loss=2.0, grad_norm=1.0)])
            self.engine.tick()

    def end(self, verdict: LaunchVerdict, ranks: list[RankState] | None = None, job: str = "llm") -> None:
        self.clock.now += 1.0
        self.report(job, ranks=ranks or [], verdict=verdict)
        self.engine.tick()

    def open_incidents(self) -> list[dict[str, object]]:
        incidents: list[dict[str, object]] = self.client.get("/api/v1/incidents").json()
        return [i for i in incidents if i["status"] == "open"]


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Launch]:
    state = Launch(tmp_path)
    with state.client:
        yield state


def test_placement_registers_the_job_and_its_nodes(launch: Launch) -> None:
    assert launch.report(steps=[])["placed"] is True
    topology = launch.store.topology()
    assert topology is not None
    assert [j.placement for j in topology.jobs] == [["gpu/n01/0", "gpu/n01/1", "gpu/n02/0", "gpu/n02/1"]]
    assert [n.name for n in topology.nodes] == ["n01", "n02"]
    version = launch.store.topology_version()
    launch.report(steps=[])
    assert launch.store.topology_version() == version  # the same placement again is no new version


def test_report_needs_the_token_and_a_well_formed_body(launch: Launch) -> None:
    body = LaunchReport(job="llm", ts=1.0, world_size=1).model_dump_json()
    refused = launch.client.post("/api/v1/launches", content=body, headers={"Authorization": "Bearer not-it"})
    assert refused.status_code == 401
    bad = launch.client.post("/api/v1/launches", json={"job": "no spaces", "ts": 1, "world_size": 1},
                             headers={"Authorization": f"Bearer {TOKEN}"})
    assert bad.status_code == 422 and "job" in bad.text


def test_killed_rank_becomes_a_crash_incident_on_its_rank_node_and_job(launch: Launch) -> None:
    launch.train(6)
    assert launch.open_incidents() == []
    launch.clock.now += 2.0
    launch.report(ranks=[RankState(rank=2, exit_code=-9)])
    launch.end(LaunchVerdict(verdict="crash", culprit_ranks=[2], hang_kind="process_dead",
                             root_error="rank 2: killed: killed by signal SIGKILL", exit_codes={2: -9, 0: -15}))
    [incident] = launch.open_incidents()
    assert incident["scope"] == "job/llm/rank/2" and incident["fault_types"] == ["job_crash"]
    [evidence] = incident["evidence"]  # type: ignore[misc]
    assert evidence["attrs"] == {"node": "n02", "gpu": 0, "exit_code": -9}
    diagnosis = launch.client.get(f"/api/v1/incidents/{incident['id']}/diagnosis").json()
    assert diagnosis["root_cause"]["entity"] == "job/llm/rank/2"
    exits = launch.client.get("/api/v1/events?kind=rank_exit").json()
    assert [(e["entity"], e["attrs"]["signal"], e["attrs"]["node"]) for e in exits] == [
        ("job/llm/rank/2", "SIGKILL", "n02")]
    # The crashed job reports no more: its last telemetry is no stall, however long the engine goes on.
    for _ in range(20):
        launch.clock.now += 10.0
        launch.engine.tick()
    assert [i["scope"] for i in launch.open_incidents()] == ["job/llm/rank/2"]


def test_hang_verdict_names_the_culprit_rank(launch: Launch) -> None:
    launch.train(4)
    launch.end(LaunchVerdict(verdict="hang", culprit_ranks=[1], hang_kind="not_enqueued",
                             summary="rank 1 never entered all_reduce #12"))
    [incident] = launch.open_incidents()
    assert incident["scope"] == "job/llm/rank/1" and incident["fault_types"] == ["job_hang"]
    diagnosis = launch.client.get(f"/api/v1/incidents/{incident['id']}/diagnosis").json()
    assert diagnosis["root_cause"]["entity"] == "job/llm/rank/1"
    assert diagnosis["root_cause"]["fault_type"] == "job_hang"


def test_the_last_step_before_a_hang_repeated_is_no_throughput_drop(launch: Launch) -> None:
    # The step before the hang happened to be slow; the reports during the hang repeat it. One slow step is
    # no throughput drop, however many ticks see it again: the incident is the hang, on its rank alone.
    launch.train(6)
    launch.train(1, step_time=0.8)
    launch.stopped(6, step_time=0.8)
    assert launch.open_incidents() == []
    launch.end(LaunchVerdict(verdict="hang", culprit_ranks=[1], hang_kind="not_enqueued",
                             summary="rank 1 never entered all_reduce #12"))
    [incident] = launch.open_incidents()
    assert incident["scope"] == "job/llm/rank/1" and incident["fault_types"] == ["job_hang"]


def test_a_hang_incident_opened_on_the_job_narrows_to_the_rank_its_verdict_names(launch: Launch) -> None:
    # The job's telemetry shows the stop first (no step for 90 s: a stall on the job); the supervisor's
    # verdict, naming rank 1, comes after. The incident stays one and ends scoped to the rank.
    launch.train(4)
    launch.stopped(10)
    [opened] = launch.open_incidents()
    assert opened["scope"] == "job/llm" and opened["fault_types"] == ["job_hang"]
    launch.end(LaunchVerdict(verdict="hang", culprit_ranks=[1], hang_kind="not_enqueued",
                             summary="rank 1 never entered all_reduce #12"))
    [incident] = launch.open_incidents()
    assert incident["id"] == opened["id"]
    assert incident["scope"] == "job/llm/rank/1" and incident["fault_types"] == ["job_hang"]
    assert incident["title"] == "job hang on job/llm/rank/1"
    diagnosis = launch.client.get(f"/api/v1/incidents/{incident['id']}/diagnosis").json()
    assert diagnosis["root_cause"]["entity"] == "job/llm/rank/1"


def test_a_throughput_drop_then_a_hang_verdict_is_one_incident_on_the_rank(launch: Launch) -> None:
    launch.train(6)
    launch.train(4, step_time=0.8)
    [opened] = launch.open_incidents()
    assert opened["scope"] == "job/llm" and opened["fault_types"] == ["throughput_drop"]
    launch.end(LaunchVerdict(verdict="hang", culprit_ranks=[1], hang_kind="not_enqueued",
                             summary="rank 1 never entered all_reduce #52"))
    [incident] = launch.open_incidents()
    assert incident["id"] == opened["id"] and incident["scope"] == "job/llm/rank/1"
    assert incident["fault_types"] == ["job_hang", "throughput_drop"]


def test_a_hang_verdict_naming_two_ranks_keeps_the_job_scope(launch: Launch) -> None:
    launch.train(4)
    launch.stopped(10)
    launch.end(LaunchVerdict(verdict="hang", culprit_ranks=[1, 3], hang_kind="stuck_in_collective",
                             summary="ranks 1 and 3 stuck in all_reduce #12"))
    [incident] = launch.open_incidents()
    assert incident["scope"] == "job/llm" and incident["fault_types"] == ["job_hang"]


def test_nan_loss_opens_an_incident_that_closes_when_the_job_ends_normally(launch: Launch) -> None:
    launch.train(5)
    launch.train(1, loss=math.nan)
    [incident] = launch.open_incidents()
    assert incident["scope"] == "job/llm" and incident["fault_types"] == ["nan_loss"]
    launch.train(2)
    launch.end(LaunchVerdict(verdict="ok"))
    assert launch.open_incidents() == []
    stored = launch.store.incident(str(incident["id"]))
    assert stored is not None and stored.status is IncidentStatus.RESOLVED


def test_job_without_loss_is_judged_on_its_step_time(launch: Launch) -> None:
    launch.train(8, loss=None)
    assert launch.open_incidents() == []
    launch.train(4, step_time=0.8, loss=None)
    [incident] = launch.open_incidents()
    assert incident["fault_types"] == ["throughput_drop"]
    assert "step time 0.8 s" in str(incident["evidence"])


def test_loss_spike_against_the_jobs_own_history(launch: Launch) -> None:
    launch.train(8)
    launch.train(1, loss=9.0)
    [incident] = launch.open_incidents()
    assert incident["fault_types"] == ["loss_spike"]


# --------------------------------------------------------------------------- the reporter


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _snapshot(rank: int, steps: int) -> RankSnapshot:
    now = time.time()
    return RankSnapshot(rank=rank, world_size=2, pid=100 + rank, host="n01.example", heartbeat=now, started=now,
                        steps=steps, step_times=[0.25] if steps > 1 else [])


def test_reporter_with_no_server_warns_once_and_never_blocks(tmp_path: Path) -> None:
    warnings: list[str] = []
    reporter = LaunchReporter(f"http://127.0.0.1:{_closed_port()}", "llm", 2, 2, tmp_path, node="n01",
                              gpus=[None, None], interval_s=0.05, warn=warnings.append)
    began = time.monotonic()
    for steps in range(1, 40):
        reporter.watch({0: _snapshot(0, steps), 1: _snapshot(1, steps)}, {0: None, 1: None}, {0: 100, 1: 101})
        time.sleep(0.01)
    reporter.finish(HangDiagnosis(verdict="ok"), wait_s=2.0)
    assert time.monotonic() - began < 5.0
    assert reporter.failures >= 1 and reporter.sent == 0
    assert len(warnings) == 1, warnings
    assert "unreachable" in warnings[0] and "training goes on" in warnings[0]


def _reporting_to(launch: Launch, out_dir: Path) -> tuple[LaunchReporter, list[LaunchReport]]:
    """A 2-rank job's reporter whose HTTP client posts to the server's real app, and the reports it sent."""
    sent: list[LaunchReport] = []

    def post(request: httpx.Request) -> httpx.Response:
        sent.append(LaunchReport.model_validate_json(request.content))
        response = launch.client.post("/api/v1/launches", content=request.content, headers=dict(request.headers))
        return httpx.Response(response.status_code, content=response.content)

    reporter = LaunchReporter("http://vigil.test", "llm", 2, 2, out_dir, node="n01", gpus=[0, 1],
                              interval_s=0.0, token=TOKEN, transport=httpx.MockTransport(post))
    return reporter, sent


def test_reporter_sends_placement_telemetry_and_verdict(launch: Launch, tmp_path: Path) -> None:
    beats = [Heartbeat(tmp_path, rank=r) for r in range(2)]
    reporter, sent = _reporting_to(launch, tmp_path)
    for step in range(1, 5):
        for r, beat in enumerate(beats):
            beat.step(step, loss=2.0 - 0.1 * step + r, grad_norm=0.5 * (r + 1), tokens_per_s=1000.0)
        reporter.watch({0: _snapshot(0, step), 1: _snapshot(1, step)}, {0: None, 1: None}, {0: 100, 1: 101})
    reporter.watch({0: _snapshot(0, 4), 1: _snapshot(1, 4)}, {0: None, 1: -9}, {0: 100, 1: 101})
    reporter.finish(HangDiagnosis(verdict="crash", culprit_ranks=[1], root_error="rank 1 killed",
                                  ranks=[RankStatus(rank=0, state="stopped", exit_code=-15),
                                         RankStatus(rank=1, state="dead", exit_code=-9)]), wait_s=10.0)
    assert reporter.sent == len(sent) and reporter.failures == 0
    assert sent[0].placement == [RankPlacement(rank=0, node="n01", gpu=0, pid=100),
                                 RankPlacement(rank=1, node="n01", gpu=1, pid=101)]
    steps = [s for report in sent for s in report.steps]
    assert steps[-1].steps == 4 and steps[-1].step_time_s == 0.25
    assert steps[-1].loss == pytest.approx(2.1) and steps[-1].grad_norm == 1.0 and steps[-1].tokens_per_s == 2000.0
    assert [(s.rank, s.exit_code) for r in sent for s in r.ranks] == [(1, -9), (0, -15)]
    assert sent[-1].verdict is not None and sent[-1].verdict.exit_codes == {0: -15, 1: -9}
    topology = launch.store.topology()
    assert topology is not None and topology.jobs[0].placement == ["gpu/n01/0", "gpu/n01/1"]



def test_a_killed_rank_ends_the_jobs_telemetry_where_it_stopped(launch: Launch, tmp_path: Path) -> None:
    """Rank 1 killed at step 10, its peer at 11: no later report says the job reached step 11 (the step count of
    the ranks still running) at the pace that still summed the dead rank's tokens/s - the throughput rule read that
    as a new step at a stale pace, a false throughput_drop beside the crash."""
    beats = [Heartbeat(tmp_path, rank=r) for r in range(2)]
    reporter, sent = _reporting_to(launch, tmp_path)
    for step in range(1, 11):
        for beat in beats:
            beat.step(step, tokens_per_s=1000.0)
        reporter.watch({0: _snapshot(0, step), 1: _snapshot(1, step)}, {0: None, 1: None}, {0: 100, 1: 101})
    beats[0].step(11, tokens_per_s=1000.0)
    reporter.watch({0: _snapshot(0, 11), 1: _snapshot(1, 10)}, {0: None, 1: None}, {0: 100, 1: 101})
    reporter.watch({0: _snapshot(0, 11), 1: _snapshot(1, 10)}, {0: None, 1: -9}, {0: 100, 1: 101})
    reporter.watch({0: _snapshot(0, 11), 1: _snapshot(1, 10)}, {0: None, 1: -9}, {0: 100, 1: 101})
    reporter.close(10.0)
    assert reporter.failures == 0
    [exit_report] = [i for i, r in enumerate(sent) if r.ranks]
    assert [(s.rank, s.exit_code) for s in sent[exit_report].ranks] == [(1, -9)]
    assert [s.steps for r in sent[exit_report:] for s in r.steps] == []  # no telemetry once a rank has failed
    assert max(s.steps for r in sent for s in r.steps) == 10


GLOO_PEER_CLOSED = ("[rank0]: RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection "
                    "closed by peer [127.0.0.1]:40325. This is typically caused by a remote worker crashing.")


def test_reporter_forwards_the_lines_the_signature_library_names(launch: Launch, tmp_path: Path) -> None:
    reporter, sent = _reporting_to(launch, tmp_path)
    (tmp_path / "rank0.log").write_text("step 1 loss 2.3\n")
    (tmp_path / "rank1.log").write_text("step 1 loss 2.4\n[rank1]: ValueError: bad batch")  # not ended yet
    reporter.watch({0: _snapshot(0, 1), 1: _snapshot(1, 1)}, {0: None, 1: None}, {0: 100, 1: 101})
    with (tmp_path / "rank1.log").open("a") as log:
        log.write(" at step 5\n")
    with (tmp_path / "rank0.log").open("a") as log:
        log.write("step 2 loss 2.2\n" + GLOO_PEER_CLOSED + "\n")
    reporter.finish(HangDiagnosis(verdict="crash", culprit_ranks=[1], root_error="rank 1: ValueError",
                                  ranks=[RankStatus(rank=0, state="dead", exit_code=1),
                                         RankStatus(rank=1, state="dead", exit_code=1)]), wait_s=10.0)
    assert reporter.failures == 0 and reporter.sent == len(sent)
    logs = [e for report in sent for e in report.logs]
    assert sorted((e.entity, e.attrs["signature"]) for e in logs) == [
        ("job/llm/rank/0", "gloo.peer_closed"), ("job/llm/rank/1", "python.exception")]
    assert sent[-1].logs and sent[-1].verdict is not None  # the last lines travel with the verdict
    stored = {(e.entity, e.attrs["signature"], e.message) for e in launch.store.events(kind="rank_log")}
    assert stored == {("job/llm/rank/0", "gloo.peer_closed", GLOO_PEER_CLOSED),
                      ("job/llm/rank/1", "python.exception", "[rank1]: ValueError: bad batch at step 5")}


def _losing_the_first_answer(launch: Launch, answers: list[dict[str, object]]) -> httpx.MockTransport:
    """A transport to the server whose first answer is lost after the server stored the report; every answer the
    server gave goes into ``answers``."""

    def post(request: httpx.Request) -> httpx.Response:
        response = launch.client.post("/api/v1/launches", content=request.content, headers=dict(request.headers))
        answers.append(response.json())
        if len(answers) == 1:
            raise httpx.ReadTimeout("the answer was lost", request=request)
        return httpx.Response(response.status_code, content=response.content)

    return httpx.MockTransport(post)


def test_a_report_sent_again_after_its_answer_was_lost_is_stored_once(launch: Launch, tmp_path: Path) -> None:
    """The answer to the report carrying the ranks' lines is lost after the server stored it, so the reporter
    sends the same report again: each line is stored once - the two equal lines rank 0 printed included, each
    once - and so are the rank exits and the verdict."""
    answers: list[dict[str, object]] = []
    reporter = LaunchReporter("http://vigil.test", "llm", 2, 2, tmp_path, node="n01", gpus=[0, 1], interval_s=0.0,
                              token=TOKEN, transport=_losing_the_first_answer(launch, answers),
                              warn=lambda _message: None)
    illegal_access = "RuntimeError: CUDA error: an illegal memory access was encountered"
    (tmp_path / "rank0.log").write_text(f"step 1 loss 2.3\n{illegal_access}\n{illegal_access}\n")
    (tmp_path / "rank1.log").write_text(GLOO_PEER_CLOSED + "\n")
    reporter.watch({0: _snapshot(0, 1), 1: _snapshot(1, 1)}, {0: None, 1: None}, {0: 100, 1: 101})
    wait_for(lambda: reporter.sent == 1, 10, "the report sent again")
    reporter.finish(HangDiagnosis(verdict="crash", culprit_ranks=[0], root_error=illegal_access,
                                  ranks=[RankStatus(rank=0, state="dead", exit_code=1),
                                         RankStatus(rank=1, state="dead", exit_code=1)]), wait_s=10.0)
    assert reporter.failures == 1 and len(answers) == 3
    assert [(a["events"], a["duplicates"]) for a in answers] == [(3, 0), (3, 3), (3, 0)]  # lines, then exits + verdict
    stored = launch.store.events(limit=100)
    assert sorted((e.entity, e.kind, e.message) for e in stored if e.kind == "rank_log") == [
        ("job/llm/rank/0", "rank_log", illegal_access), ("job/llm/rank/0", "rank_log", illegal_access),
        ("job/llm/rank/1", "rank_log", GLOO_PEER_CLOSED)]
    assert sorted(e.kind for e in stored if e.kind != "rank_log") == ["job", "rank_exit", "rank_exit"]


def test_step_telemetry_sent_again_after_its_answer_was_lost_is_stored_once(launch: Launch, tmp_path: Path) -> None:
    """The answer to the reporter's first telemetry report is lost after the server stored it, so the reporter
    sends the same report again: its samples are one push for the engine, and the next look's are another."""
    answers: list[dict[str, object]] = []
    reporter = LaunchReporter("http://vigil.test", "llm", 2, 2, tmp_path, node="n01", gpus=[0, 1], interval_s=0.0,
                              token=TOKEN, transport=_losing_the_first_answer(launch, answers),
                              warn=lambda _message: None)
    reporter.watch({0: _snapshot(0, 5), 1: _snapshot(1, 5)}, {0: None, 1: None}, {0: 100, 1: 101})
    wait_for(lambda: reporter.sent == 1, 10, "the report sent again")
    reporter.watch({0: _snapshot(0, 9), 1: _snapshot(1, 9)}, {0: None, 1: None}, {0: 100, 1: 101})
    reporter.close(wait_s=10.0)
    assert reporter.failures == 1 and reporter.sent == 2
    looked = int(str(answers[0]["samples"]))
    assert looked > 0
    assert [(a["samples"], a["duplicate_samples"]) for a in answers] == [(looked, 0), (looked, looked), (looked, 0)]
    pushes = [p for p in launch.store.pushes_after(0) if p.node == "launch:llm"]
    assert [[v for m, _, v in p.points if m == "vigil_job_steps_total"] for p in pushes] == [[5.0], [9.0]]


def test_a_flooding_rank_costs_a_bounded_report(tmp_path: Path) -> None:
    reports: list[LaunchReport] = []

    def post(request: httpx.Request) -> httpx.Response:
        reports.append(LaunchReport.model_validate_json(request.content))
        return httpx.Response(201, json={})

    reporter = LaunchReporter("http://vigil.test", "llm", 1, 1, tmp_path, node="n01", gpus=[0], interval_s=0.0,
                              transport=httpx.MockTransport(post))
    (tmp_path / "rank0.log").write_text("RuntimeError: CUDA error: an illegal memory access was encountered\n" * 5000)
    assert reporter.read_logs(1.0) == 256  # one look reads a bounded number of lines
    reporter.read_logs(2.0, looks=100)
    reporter.finish(HangDiagnosis(verdict="ok"), wait_s=10.0)
    assert [len(r.logs) for r in reports] == [1000]
    assert reporter.logs_dropped == 4000


def test_a_report_speaks_only_for_its_own_ranks(launch: Launch) -> None:
    for kind, entity in (("rank_log", "job/other/rank/0"), ("rank_log", "job/llm/rank/4"), ("xid", "job/llm/rank/0")):
        body = LaunchReport(job="llm", ts=1.0, world_size=4, logs=[
            Event(ts=1.0, entity=entity, kind=kind, source="rank", message="Xid 79")]).model_dump_json()
        refused = launch.client.post("/api/v1/launches", content=body, headers={"Content-Type": "application/json"})
        assert refused.status_code == 400 and "rank_log" in refused.text, refused.text
    assert launch.store.events() == []


def test_gpu_indices_follow_cuda_visible_devices() -> None:
    assert gpu_indices(2, {"CUDA_VISIBLE_DEVICES": "4,5"}) == [4, 5]
    assert gpu_indices(3, {"CUDA_VISIBLE_DEVICES": "4,5"}) == [4, 5, None]
    assert gpu_indices(2, {"CUDA_VISIBLE_DEVICES": ""}) == [None, None]
    assert gpu_indices(2, {"CUDA_VISIBLE_DEVICES": "GPU-8a1f"}) == [None, None]


def test_a_launched_job_stays_beside_the_jobs_kubernetes_lists(tmp_path: Path) -> None:
    from tests.collect.recorded_pods import RecordedCoreApi, recorded_nodes
    from vigil.model import Job
    from vigil.sources.collect.kube_jobs import KubernetesJobs

    settings = Settings(home=tmp_path, kube_jobs_poll_s=30)
    store = Store(settings.database_url())
    for node in recorded_nodes():
        store.register_node(node)
    store.register_job(Job(id="llm", placement=["gpu/n03/6", "gpu/n03/7"], source="launch"))
    engine = Engine(store, settings, notifiers=[], kube_jobs=KubernetesJobs(RecordedCoreApi()))
    engine.tick()
    topology = store.topology()
    assert topology is not None
    assert sorted((j.id, j.source) for j in topology.jobs) == [
        ("eval", "kubernetes"), ("llama-ft", "kubernetes"), ("llm", "launch")]
