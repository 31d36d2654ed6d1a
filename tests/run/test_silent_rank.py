"""A hang localized from the ranks' own logs, through the real routes and the live engine: every rank but one
prints the watchdog's timeout of the same collective (the production rank-log decoder turns the lines into
events, pushed by each rank's node as the agent's rank-log forwarder pushes them), so the job's incident
narrows to the one that did not - unless its silence has another reason (several silent ranks, its node down,
its logs missing)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.run.clock import Clock
from vigil.config import Settings
from vigil.faces.api.app import create_app
from vigil.model import LaunchReport, RankPlacement, Sample, StepTelemetry
from vigil.run.engine import Engine
from vigil.sources.collect.ranklog import decode_rank_line
from vigil.store.sql import Store

TOKEN = "ranklog-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
# Four ranks on each of two nodes.
TWO_NODES = [RankPlacement(rank=r, node=f"n0{1 + r // 4}", gpu=r % 4) for r in range(8)]
# Rank 7 alone on a third node.
THIRD_NODE = [*TWO_NODES[:7], RankPlacement(rank=7, node="n03", gpu=0)]


def watchdog_line(rank: int, seq: int = 18231) -> str:
    return (f"[rank{rank}]:[E1206 09:12:44.183920 4821{rank} ProcessGroupNCCL.cpp:616] [PG ID 0 PG GUID 0(default_pg) "
            f"Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, "
            "NumelIn=262144000, NumelOut=262144000, Timeout(ms)=600000) ran for 600043 milliseconds before timing out.")


class Job:
    """A store, the server's real app in front of it, an engine on a controlled clock, and one 8-rank job that
    `vigil launch` reports."""

    def __init__(self, tmp_path: Path, placement: Sequence[RankPlacement]) -> None:
        self.settings = Settings(home=tmp_path, api_token=TOKEN, resolve_after_s=600.0)
        self.store = Store(self.settings.database_url())
        self.clock = Clock()
        self.engine = Engine(self.store, self.settings, notifiers=[], clock=self.clock)
        self.client = TestClient(create_app(self.store, settings=self.settings), headers=AUTH)
        self.placement = list(placement)
        self.step = 0

    def report(self, stepped: bool) -> None:
        self.step += 20 if stepped else 0
        body = LaunchReport(job="llm", ts=self.clock.now, world_size=len(self.placement), placement=self.placement,
                            steps=[StepTelemetry(ts=self.clock.now, steps=self.step, step_time_s=0.5, loss=2.0,
                                                 grad_norm=1.0)])
        response = self.client.post("/api/v1/launches", content=body.model_dump_json(),
                                    headers={**AUTH, "Content-Type": "application/json"})
        assert response.status_code == 201, response.text

    def ticks(self, n: int, stepped: bool) -> None:
        for _ in range(n):
            self.clock.now += 10.0
            self.report(stepped)
            self.engine.tick()

    def rank_lines(self, lines: dict[int, str]) -> None:
        """Each rank's line through the production decoder, pushed by the rank's node to the rank-log route."""
        by_node: dict[str, list[dict[str, object]]] = {}
        for rank, line in lines.items():
            event = decode_rank_line(f"job/llm/rank/{rank}", line, self.clock.now + 0.01 * rank)
            assert event is not None
            by_node.setdefault(self.placement[rank].node, []).append(event.model_dump(mode="json"))
        for node, events in by_node.items():
            response = self.client.post("/api/v1/rank-logs", json={"node": node, "events": events})
            assert response.status_code == 201, response.text

    def node_down(self, node: str) -> None:
        """The node's agent reports it down (the engine reads vigil_node_up from the pushed samples)."""
        sample = Sample(ts=self.clock.now, entity=f"node/{node}", metric="vigil_node_up", value=0.0)
        response = self.client.post("/api/v1/samples", json={"node": node, "samples": [sample.model_dump()]})
        assert response.status_code == 201, response.text

    def hang(self, silent: set[int]) -> None:
        """The job stops stepping, then every rank not in ``silent`` times the same collective out."""
        self.ticks(4, stepped=True)
        self.ticks(10, stepped=False)
        self.rank_lines({r: watchdog_line(r) for r in range(len(self.placement)) if r not in silent})
        self.ticks(5, stepped=False)

    def incidents(self) -> list[dict[str, object]]:
        found: list[dict[str, object]] = self.client.get("/api/v1/incidents").json()
        return found


@pytest.fixture
def job(tmp_path: Path) -> Iterator[Job]:
    state = Job(tmp_path, TWO_NODES)
    with state.client:
        yield state


def test_a_hang_opened_on_the_job_narrows_to_the_rank_its_peers_timeouts_leave_out(job: Job) -> None:
    job.ticks(4, stepped=True)
    job.ticks(10, stepped=False)
    [opened] = job.incidents()
    assert opened["scope"] == "job/llm"
    job.rank_lines({r: watchdog_line(r) for r in range(8) if r != 5})
    job.ticks(1, stepped=False)
    assert [i["scope"] for i in job.incidents()] == ["job/llm"]  # the peers' lines settle before any verdict
    job.ticks(4, stepped=False)
    [incident] = job.incidents()
    assert incident["id"] == opened["id"]
    assert incident["scope"] == "job/llm/rank/5" and incident["title"] == "job hang on job/llm/rank/5"
    [named] = [e for e in incident["evidence"] if e["entity"] == "job/llm/rank/5"]  # type: ignore[attr-defined]
    assert named["kind"] == "peer" and named["attrs"]["seq"] == 18231 and named["attrs"]["node"] == "node/n02"
    assert "7 of 8 ranks of job/llm timed out in collective SeqNum 18231 (ALLREDUCE)" in named["summary"]
    diagnosis = job.client.get(f"/api/v1/incidents/{incident['id']}/diagnosis").json()
    assert diagnosis["root_cause"]["entity"] == "job/llm/rank/5"


def test_two_silent_ranks_keep_the_job_scope(job: Job) -> None:
    job.hang(silent={5, 6})
    [incident] = job.incidents()
    assert incident["scope"] == "job/llm"
    assert not [a for a in job.store.anomalies(limit=1000) if "/rank/" in a.entity]


def test_a_crashed_node_keeps_the_job_scope(job: Job) -> None:
    # Node n02 crashed: its four ranks say nothing, the other four time out.
    job.ticks(4, stepped=True)
    job.node_down("n02")
    job.hang(silent={4, 5, 6, 7})
    assert "job/llm/rank" not in " ".join(str(i["scope"]) for i in job.incidents())
    assert not [a for a in job.store.anomalies(limit=1000) if "/rank/" in a.entity]


@pytest.mark.parametrize(("earlier_line", "down", "scope"), [
    (True, False, "job/llm/rank/7"),  # its node's logs arrive and it is up: the silence is its own
    (True, True, "job/llm"),  # its node went down: not a hang of the rank
    (False, False, "job/llm"),  # nothing from its node ever arrived: its logs may be missing
])
def test_a_rank_alone_on_its_node_is_named_only_when_its_node_is_up_and_its_logs_arrive(
        tmp_path: Path, earlier_line: bool, down: bool, scope: str) -> None:
    job = Job(tmp_path, THIRD_NODE)
    with job.client:
        job.ticks(2, stepped=True)
        if earlier_line:
            job.rank_lines({7: "[rank7]: NCCL WARN NET/IB : Got async event : port error"})
        if down:
            job.node_down("n03")
        job.hang(silent={7})
        assert [i["scope"] for i in job.incidents() if str(i["scope"]).startswith("job/")] == [scope]


def _event(job: Job, entity: str, kind: str = "rank_log", line: str = "ValueError: bad batch at step 15") -> dict:
    event = decode_rank_line(entity, line, job.clock.now)
    assert event is not None
    return event.model_copy(update={"kind": kind}).model_dump(mode="json")


def _push(job: Job, node: str, entity: str, kind: str = "rank_log") -> tuple[int, dict]:
    response = job.client.post("/api/v1/rank-logs", json={"node": node, "events": [_event(job, entity, kind)]})
    return response.status_code, response.json()


def test_a_node_pushes_log_lines_only_of_the_ranks_placed_on_it(job: Job) -> None:
    job.ticks(1, stepped=True)
    status, answer = _push(job, "n02", "job/llm/rank/5")
    assert status == 201 and answer["accepted"] == answer["stored"] == 1 and answer["rejected"] == 0
    for node, entity, kind, reason, detail in (
            ("n01", "job/llm/rank/5", "rank_log", "rank_on_another_node", "job/llm/rank/5 is placed on node/n02"),
            ("n01", "job/llm/rank/8", "rank_log", "rank_outside_job", "not one of the job's 8 ranks"),
            ("n01", "job/llm/rank/0", "xid", "not_rank_log", "expected rank_log events"),
            ("n01", "node/n01", "rank_log", "not_rank_log", "expected rank_log events")):
        status, answer = _push(job, node, entity, kind)
        # a well-formed push whose events are refused is answered, not failed: what was refused, and why
        assert status == 200, answer
        assert (answer["accepted"], answer["rejected"], answer["rejected_by_reason"]) == (0, 1, {reason: 1})
        assert answer["rejections"][0]["index"] == 0 and answer["rejections"][0]["entity"] == entity
        assert detail in answer["rejections"][0]["detail"]
    # a job the topology does not hold (yet): its scheduler may list it later, the lines are kept
    assert _push(job, "n01", "job/unlisted/rank/3")[0] == 201
    stored = {(e.entity, e.kind) for e in job.store.events(kind="rank_log", limit=100)}
    assert stored == {("job/llm/rank/5", "rank_log"), ("job/unlisted/rank/3", "rank_log")}


def test_one_refused_line_does_not_cost_the_rest_of_the_push(job: Job) -> None:
    """A push mixing the node's own ranks' lines with lines the server refuses: every valid line is stored, in
    the push's order, and the answer counts the refused ones by reason and names each with its position."""
    job.ticks(1, stepped=True)
    before = job.store.events(kind="rank_log", limit=100)
    own = [_event(job, f"job/llm/rank/{r}", line=f"ValueError: bad batch at step {15 + r}") for r in range(4)]
    push = [own[0], _event(job, "job/llm/rank/5"), own[1], _event(job, "job/llm/rank/9"), own[2],
            _event(job, "job/llm/rank/6"), _event(job, "job/other/rank/2"), own[3]]
    response = job.client.post("/api/v1/rank-logs", json={"node": "n01", "events": push})
    assert response.status_code == 200, response.text
    answer = response.json()
    assert (answer["accepted"], answer["stored"], answer["rejected"]) == (5, 5, 3)
    assert answer["rejected_by_reason"] == {"rank_on_another_node": 2, "rank_outside_job": 1}
    assert [(r["index"], r["entity"], r["reason"]) for r in answer["rejections"]] == [
        (1, "job/llm/rank/5", "rank_on_another_node"), (3, "job/llm/rank/9", "rank_outside_job"),
        (5, "job/llm/rank/6", "rank_on_another_node")]
    stored = [(e.entity, e.message) for e in job.store.events(kind="rank_log", limit=100)]
    assert not before
    assert sorted(stored) == sorted([(e["entity"], e["message"]) for e in own]
                                    + [("job/other/rank/2", "ValueError: bad batch at step 15")])
    # a body that is not a push at all is still refused whole, and stores nothing
    response = job.client.post("/api/v1/rank-logs", json={"node": "n01", "events": [{"entity": "job/llm/rank/0"}]})
    assert response.status_code == 422
    assert len(job.store.events(kind="rank_log", limit=100)) == 5
