"""The agent loop: hung and failing sources, degradation under CPU load, label hygiene, exposition, push."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from tests.collect.conftest import CountingSource, fast_settings
from vigil.model import Event, FaultLevel, Sample
from vigil.sources.collect.agent import IDEMPOTENCY_KEY_HEADER, Agent, AgentExposition, EventPusher, LabelGuard
from vigil.sources.collect.base import Collection, Source


class HangingSource(Source):
    """Blocks forever (until released at teardown), like an NVML call on a wedged driver."""

    name = "hanging"
    kind = "gpu"

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.entered = threading.Event()

    def collect(self, now: float) -> Collection:
        self.entered.set()
        self.release.wait()
        return Collection()


class BrokenSource(Source):
    name = "broken"
    kind = "network"

    def collect(self, now: float) -> Collection:
        raise RuntimeError("sysfs exploded")


def wait_for(condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached before the deadline")
        time.sleep(0.02)


def test_a_hung_source_never_stops_the_others() -> None:
    healthy, hung, broken = CountingSource(), HangingSource(), BrokenSource()
    agent = Agent([healthy, hung, broken], fast_settings(timeout_s=1.0), cpu_ratio=lambda: 0.1)
    loop = threading.Thread(target=agent.run, daemon=True)
    loop.start()
    try:
        wait_for(lambda: agent.runners[1].timeouts == 1 and healthy.reads >= 10)
        report = {s["name"]: s for s in agent.report()["sources"]}
        assert report["hanging"]["up"] is False and "hung" in report["hanging"]["status"]
        assert report["counting"]["up"] is True
        assert report["broken"]["up"] is False and report["broken"]["failures"] >= 1
        assert "sysfs exploded" in report["broken"]["status"]
        # the hung read holds one thread: it is not started again while stuck
        threads = [t for t in threading.enumerate() if t.name == "vigil-agent-hanging"]
        assert len(threads) == 1
        reads_before = healthy.reads
        wait_for(lambda: healthy.reads >= reads_before + 5)
        assert agent.runners[1].timeouts == 1
        hung.release.set()
        wait_for(lambda: agent.runners[1].up)
    finally:
        agent.stop_event.set()
        hung.release.set()
        loop.join(10)
    assert not loop.is_alive()


def test_collect_once_returns_when_a_source_hangs() -> None:
    hung = HangingSource()
    agent = Agent([CountingSource(), hung], fast_settings(timeout_s=1.0), cpu_ratio=lambda: 0.1)
    started = time.monotonic()
    agent.collect_once()
    assert time.monotonic() - started < 10
    assert [r.up for r in agent.runners] == [True, False]
    assert agent.runners[1].timeouts == 1 and "hung" in agent.runners[1].status
    assert agent.runners[0].points
    hung.release.set()


def test_degrades_above_80_percent_cpu_and_recovers_below_70() -> None:
    load = {"cpu": 0.2}
    gpu, kernel = CountingSource("gpu", "gpu"), CountingSource("kernel", "kernel")
    agent = Agent([gpu, kernel], fast_settings(degraded_factor=5.0), cpu_ratio=lambda: load["cpu"])
    agent.step()
    assert not agent.degraded and agent.effective_interval(agent.runners[0]) == pytest.approx(0.1)
    load["cpu"] = 0.93
    wait_for(lambda: (agent.step(), agent.degraded)[1])
    assert agent.effective_interval(agent.runners[0]) == pytest.approx(0.5)
    assert agent.effective_interval(agent.runners[1]) == pytest.approx(0.1)  # kernel log keeps full rate
    load["cpu"] = 0.75  # between the thresholds: stays degraded (hysteresis)
    for _ in range(5):
        agent.step()
        time.sleep(0.06)
    assert agent.degraded
    load["cpu"] = 0.4
    wait_for(lambda: (agent.step(), not agent.degraded)[1])
    assert agent.degradations == 1


def test_degraded_agent_reads_periodic_sources_less_often() -> None:
    gpu, kernel = CountingSource("gpu", "gpu"), CountingSource("kernel", "kernel")
    agent = Agent([gpu, kernel], fast_settings(degraded_factor=20.0), cpu_ratio=lambda: 0.99)
    loop = threading.Thread(target=agent.run, daemon=True)
    loop.start()
    wait_for(lambda: kernel.reads >= 16)
    agent.stop_event.set()
    loop.join(10)
    assert agent.degraded
    assert gpu.reads <= kernel.reads / 2, (gpu.reads, kernel.reads)


def test_label_guard_refuses_state_labels_folds_pods_and_caps_values(caplog) -> None:
    guard = LabelGuard(max_values=3)
    cleaned = guard.clean(
        "DCGM_FI_DEV_XID_ERRORS", (("err_msg", "fallen off"), ("pod", "trainer-7d9f8c6b5-x2x9z"), ("namespace", "ml"))
    )
    assert cleaned == (("pod", "trainer"), ("namespace", "ml"))
    assert guard.clean("m", (("pod", "worker-0"),)) == (("pod", "worker-0"),)  # StatefulSet ordinal kept
    assert guard.clean("m", (("pod", "launcher-bx7kq"),)) == (("pod", "launcher"),)  # Job pod suffix
    values = [guard.clean("DCGM_EXP_XID_ERRORS_COUNT", (("xid", str(x)),))[0][1] for x in (13, 31, 48, 79, 94, 13)]
    assert values == ["13", "31", "48", "other", "other", "13"]
    assert guard.refused_count == 1 and guard.folded_count == 4
    warnings = [r.message for r in caplog.records if "label hygiene" in r.message]
    assert len(warnings) == len(set(warnings)) == 4


def test_prometheus_exposition_over_http() -> None:
    class DcgmLike(Source):
        name, kind = "dcgmlike", "gpu"

        def collect(self, now: float) -> Collection:
            out = Collection()
            out.add("DCGM_FI_DEV_GPU_TEMP", "gpu/n01/0", 61, pod="trainer-7d9f8c6b5-x2x9z")
            out.add("DCGM_FI_DEV_GPU_TEMP", "gpu/n01/1", 83, pod="trainer-7d9f8c6b5-q8w4m")
            out.add("DCGM_FI_DEV_POWER_USAGE", "gpu/n01/1", 400, node="spoofed", gpu="7")
            out.add("DCGM_FI_DEV_XID_ERRORS", "gpu/n01/1", 79, err_msg="GPU has fallen off the bus")
            out.events.append(Event(ts=now, entity="gpu/n01/1", kind="xid", level=FaultLevel.ISOLATE))
            return out

    agent = Agent([DcgmLike(), BrokenSource()], fast_settings(), cpu_ratio=lambda: 0.1)
    agent.collect_once()
    server, port = agent.serve(port=0)
    try:
        page = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    finally:
        server.shutdown()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(page)
        for s in f.samples
    }
    assert samples[("DCGM_FI_DEV_GPU_TEMP", (("gpu", "1"), ("node", "n01"), ("pod", "trainer")))] == 83
    assert samples[("DCGM_FI_DEV_XID_ERRORS", (("gpu", "1"), ("node", "n01")))] == 79
    assert samples[("DCGM_FI_DEV_POWER_USAGE", (("gpu", "1"), ("node", "n01")))] == 400
    assert samples[("vigil_agent_source_up", (("source", "broken"),))] == 0
    assert samples[("vigil_agent_events_total", (("kind", "xid"), ("level", "isolate")))] == 1
    assert samples[("vigil_agent_labels_total", (("outcome", "refused"),))] == 1
    assert ("vigil_agent_degraded", ()) in samples
    assert any(name == "vigil_agent_process_resident_memory_bytes" for name, _ in samples)


def test_events_are_pushed_to_the_server_with_the_token_and_retried(page_server) -> None:
    class Xids(Source):
        name, kind = "xids", "kernel"

        def collect(self, now: float) -> Collection:
            return Collection(
                events=[Event(ts=now, entity="gpu/n01/0", kind="xid", level=FaultLevel.DRAIN, attrs={"xid": 119})]
            )

    page_server.status = 503
    agent = Agent(
        [Xids()],
        fast_settings(server_url=page_server.url, server_token="s3cret", push_interval_s=0.05),
        cpu_ratio=lambda: 0.1,
    )
    agent.collect_once()
    wait_for(lambda: (agent.step(), agent._pusher is not None and agent._pusher.failures >= 1)[1])
    page_server.status = 201
    wait_for(lambda: (agent.step(), agent._pusher is not None and agent._pusher.sent >= 2)[1])
    body = json.loads(page_server.received[-1])
    assert body[0]["kind"] == "xid" and body[0]["attrs"] == {"xid": 119}
    assert page_server.headers[-1]["Authorization"] == "Bearer s3cret"


class RankLines(Source):
    name, kind = "rank_log", "rank_log"

    def __init__(self, events: int = 1, xid: bool = True) -> None:
        super().__init__()
        self.events, self.xid = events, xid

    def collect(self, now: float) -> Collection:
        lines = [Event(ts=now, entity=f"job/{job}/rank/1", kind="rank_log", source="rank",
                       level=FaultLevel.DEGRADED, message="ValueError: bad batch",
                       attrs={"signature": "python.exception"}) for job in ("llm", "eval")] * self.events
        xids = [Event(ts=now, entity="gpu/n01/0", kind="xid", level=FaultLevel.DRAIN, attrs={"xid": 119})]
        return Collection(events=lines + xids * self.xid)


def test_rank_log_lines_go_to_their_route_with_the_node_and_a_refused_batch_is_counted(page_server) -> None:
    lines = RankLines()
    agent = Agent([lines], fast_settings(server_url=page_server.url, push_interval_s=0.05, push_samples=False),
                  cpu_ratio=lambda: 0.1)
    page_server.status = 201
    agent.collect_once()

    def received() -> list[tuple[str, Any]]:
        # the server records a body before its path, one request at a time: the pairs line up
        paths = list(page_server.paths)
        return list(zip(paths, map(json.loads, page_server.received[:len(paths)]), strict=True))

    wait_for(lambda: (agent.step(), sum(path == "/api/v1/rank-logs" for path, _ in received()) >= 2)[1])
    bodies = received()
    assert {e["kind"] for path, body in bodies if path == "/api/v1/events" for e in body} == {"xid"}
    pushed = [body for path, body in bodies if path == "/api/v1/rank-logs"]
    assert all(body["node"] == "n01" for body in pushed)
    # one push per job, so a refused layout costs only its own job's lines
    assert sorted({e["entity"] for e in body["events"]} for body in pushed[:2]) == [{"job/eval/rank/1"},
                                                                                   {"job/llm/rank/1"}]
    lines.xid = False
    wait_for(lambda: (agent.step(), agent._pusher is not None and not agent._pusher.busy and not agent.pending_events
                      and not agent.runners[0].busy)[1])
    page_server.status = 400  # the server refuses the whole push (an older server): sending it again cannot help
    agent.collect_once()
    wait_for(lambda: (agent.step(), agent.events_refused >= 2)[1])
    assert agent.report()["events_refused"] >= 2
    assert agent.report()["events_refused_by_reason"] == {"push_refused": agent.events_refused}
    assert not [e for e in agent.pending_events if e.kind == "rank_log"]  # dropped, not queued again


def test_the_agent_keeps_what_the_server_accepts_of_a_push_and_counts_the_refused_lines(tmp_path) -> None:
    """The agent pushing to the server's real rank-log route: one job's lines from ranks on this node and on
    others. The server stores the node's own ranks' lines and refuses the rest per line; the agent counts the
    refused ones by the server's reason, in its report and its metrics, and neither sends them again nor sends
    the stored ones twice."""
    from fastapi.testclient import TestClient

    from vigil.config import Settings
    from vigil.faces.api.app import create_app
    from vigil.model import LaunchReport, RankPlacement
    from vigil.store.sql import Store

    settings = Settings(home=tmp_path, api_token="tok")
    store = Store(settings.database_url())
    server = TestClient(create_app(store, settings=settings), base_url="http://vigil.test",
                        headers={"Authorization": "Bearer tok"})
    placement = [RankPlacement(rank=r, node=f"n0{1 + r // 4}", gpu=r % 4) for r in range(8)]  # n01: ranks 0-3
    launch = LaunchReport(job="llm", ts=time.time(), world_size=8, placement=placement)
    assert server.post("/api/v1/launches", content=launch.model_dump_json(),
                       headers={"Content-Type": "application/json"}).status_code == 201

    class Lines(Source):
        name, kind = "rank_log", "rank_log"

        def __init__(self) -> None:
            super().__init__()
            self.ranks = [1, 5, 2, 9, 6, 3]  # 5 and 6 are on n02; the job has no rank 9

        def collect(self, now: float) -> Collection:
            ranks, self.ranks = self.ranks, []
            return Collection(events=[Event(ts=now, entity=f"job/llm/rank/{r}", kind="rank_log", source="rank",
                                            level=FaultLevel.DEGRADED, message=f"ValueError: bad batch {r}",
                                            attrs={"signature": "python.exception"}) for r in ranks])

    agent = Agent([Lines()], fast_settings(server_url="http://vigil.test", push_interval_s=0.05,
                                           push_samples=False), cpu_ratio=lambda: 0.1)
    assert agent._pusher is not None
    agent._pusher._client = server  # the route itself, in this process
    agent.collect_once()
    wait_for(lambda: (agent.step(), agent._pusher is not None and agent._pusher.sent + agent.events_refused >= 6
                      and not agent._pusher.busy)[1])
    stored = sorted(e.entity for e in store.events(kind="rank_log", limit=100))
    assert stored == ["job/llm/rank/1", "job/llm/rank/2", "job/llm/rank/3"]
    assert agent._pusher.sent == 3 and agent.events_refused == 3
    assert agent.report()["events_refused_by_reason"] == {"rank_on_another_node": 2, "rank_outside_job": 1}
    metrics = {(s.name, tuple(sorted(s.labels.items()))): s.value for family in AgentExposition(agent).collect()
               for s in family.samples}
    assert metrics[("vigil_agent_rank_log_events_refused_total", (("reason", "rank_on_another_node"),))] == 2
    assert metrics[("vigil_agent_rank_log_events_refused_total", (("reason", "rank_outside_job"),))] == 1
    assert metrics[("vigil_agent_events_dropped_total", (("reason", "refused"),))] == 3
    # nothing is queued again: further rounds push nothing more, and the store keeps exactly the three lines
    assert not agent.pending_events
    for _ in range(5):
        agent.collect_once()
        agent.step()
    wait_for(lambda: agent._pusher is not None and not agent._pusher.busy)
    assert agent._pusher.sent == 3 and agent.events_refused == 3 and agent._pusher.failures == 0
    assert len(store.events(kind="rank_log", limit=100)) == 3


def _real_rank_log_route(tmp_path: Any) -> tuple[Any, Any]:
    """The server's rank-log route over a real store, in this process; job llm's ranks 0-3 on node n01."""
    from fastapi.testclient import TestClient

    from vigil.config import Settings
    from vigil.faces.api.app import create_app
    from vigil.model import LaunchReport, RankPlacement
    from vigil.store.sql import Store

    settings = Settings(home=tmp_path, api_token="tok")
    store = Store(settings.database_url())
    server = TestClient(create_app(store, settings=settings), base_url="http://vigil.test",
                        headers={"Authorization": "Bearer tok"})
    launch = LaunchReport(job="llm", ts=time.time(), world_size=4,
                          placement=[RankPlacement(rank=r, node="n01", gpu=r) for r in range(4)])
    assert server.post("/api/v1/launches", content=launch.model_dump_json(),
                       headers={"Content-Type": "application/json"}).status_code == 201
    return server, store



def _loses_the_first_answer(server: Any, route: str, answers: list[dict[str, Any]]) -> Any:
    """The server's real route, except that the first answer from `route` never reaches the agent (stored on the
    server, lost on the way back); every answer from `route` is kept in `answers`."""

    class LosesTheFirstAnswer:
        lost = False

        def post(self, url: str, **kwargs: Any) -> httpx.Response:
            response = server.post(url, **kwargs)
            if url.endswith(route):
                answers.append(response.json())
                if not self.lost:
                    self.lost = True
                    raise httpx.ReadTimeout("the answer was lost", request=response.request)
            return response

    return LosesTheFirstAnswer()

def test_a_rank_log_push_sent_again_after_its_answer_was_lost_is_stored_once(tmp_path) -> None:
    """The agent following a rank's real log file and pushing to the server's real route; the answer to the
    first push is lost after the server stored it (a timeout on the way back), so the agent sends the same push
    again. Every line is stored once - the two equal lines the rank printed included, each once."""
    from vigil.sources.collect.rank_files import RankLogFiles, RankLogSource

    server, store = _real_rank_log_route(tmp_path)
    answers: list[dict[str, Any]] = []

    client = _loses_the_first_answer(server, "/rank-logs", answers)

    layout = RankLogFiles(glob=str(tmp_path / "logs" / "*" / "rank-*.log"),
                          pattern=r"/(?P<job>[^/]+)/rank-(?P<rank>\d+)\.log$")
    agent = Agent([RankLogSource([layout], node="n01")],
                  fast_settings(server_url="http://vigil.test", push_interval_s=0.05, push_samples=False),
                  cpu_ratio=lambda: 0.1)
    assert agent._pusher is not None
    agent._pusher._client = client
    agent.collect_once()  # the layout's first look: no file yet
    log = tmp_path / "logs" / "llm" / "rank-1.log"
    log.parent.mkdir(parents=True)
    log.write_text("step 14 loss 2.1\nValueError: bad batch at step 15\nValueError: bad batch at step 15\n"
                   "RuntimeError: CUDA error: an illegal memory access was encountered\n")
    agent.collect_once()
    wait_for(lambda: (agent.step(), agent._pusher is not None and agent._pusher.sent >= 3
                      and not agent._pusher.busy)[1])
    assert agent._pusher.failures == 1 and len(answers) == 2
    assert (answers[0]["accepted"], answers[0]["duplicates"]) == (3, 0)
    assert (answers[1]["accepted"], answers[1]["duplicates"]) == (3, 3)  # the retry: nothing new
    stored = store.events(kind="rank_log", limit=100)
    assert [(e.entity, e.message) for e in stored] == [
        ("job/llm/rank/1", "ValueError: bad batch at step 15"), ("job/llm/rank/1", "ValueError: bad batch at step 15"),
        ("job/llm/rank/1", "RuntimeError: CUDA error: an illegal memory access was encountered")]
    assert len({e.attrs["log_offset"] for e in stored}) == 3


def test_the_rank_log_route_stores_a_line_once_per_node_rank_position_and_read(tmp_path) -> None:
    """What makes two pushed lines one: the node, the rank, the file and offset the line was read at, the time it
    was read and its text - all repeated by a push sent again, never all shared by two lines. A line without a
    position (an older agent's) is stored as it comes."""
    server, store = _real_rank_log_route(tmp_path)
    line = "ValueError: bad batch at step 15"

    def event(rank: int = 1, offset: int | None = 17, ts: float = 100.0, where: str = "/logs/llm/rank-1.log",
              message: str = line) -> dict[str, Any]:
        attrs: dict[str, Any] = {"signature": "python.exception"}
        if offset is not None:
            attrs.update(log_file=where, log_offset=offset)
        return Event(ts=ts, entity=f"job/llm/rank/{rank}", kind="rank_log", source="rank",
                     level=FaultLevel.DEGRADED, message=message, attrs=attrs).model_dump(mode="json")

    def push(*events: dict[str, Any], node: str = "n01") -> dict[str, Any]:
        response = server.post("/api/v1/rank-logs", json={"node": node, "events": list(events)})
        assert response.status_code == 201, response.text
        answer: dict[str, Any] = response.json()
        return answer

    first = [event(), event(offset=50), event(rank=2, where="/logs/llm/rank-2.log")]
    assert push(*first)["duplicates"] == 0
    answer = push(*first)  # the same push again
    assert (answer["accepted"], answer["stored"], answer["duplicates"], answer["rejected"]) == (3, 3, 3, 0)
    assert len(store.events(kind="rank_log", limit=100)) == 3
    # each differs from a stored line in one thing: a later read (a truncated file's new line at the same
    # offset), another file, other text at that position; and within one push, a line twice is one line
    fresh = [event(ts=160.0), event(where="/logs/llm/rank-1.err"), event(message="ValueError: bad batch at step 16")]
    assert push(*fresh, fresh[0])["duplicates"] == 1
    assert len(store.events(kind="rank_log", limit=100)) == 6
    # without a position nothing tells two equal lines of one read from a push sent again: both are kept
    assert push(event(offset=None), event(offset=None))["duplicates"] == 0
    assert len(store.events(kind="rank_log", limit=100)) == 8


XID_79 = "NVRM: Xid (PCI:0000:18:00): 79, pid=0, name=, GPU has fallen off the bus."
XID_48 = "NVRM: Xid (PCI:0000:18:00): 48, pid=77, name=python, DBE (0x1)"


def test_an_events_push_sent_again_after_its_answer_was_lost_is_stored_once(tmp_path) -> None:
    """The agent following a real kernel log and pushing its events to the server's real route; the answer to
    the first push is lost after the server stored it, so the agent sends the same push again. Every event is
    stored once - the same Xid line logged twice, at two times, included, each once."""
    from vigil.sources.collect.kmsg import KernelLogSource

    server, store = _real_rank_log_route(tmp_path)
    answers: list[dict[str, Any]] = []

    client = _loses_the_first_answer(server, "/events", answers)

    kernel_log = tmp_path / "kern.log"
    kernel_log.write_text("")
    agent = Agent([KernelLogSource.from_file(kernel_log, node="n01", boot_time=1_000.0)],
                  fast_settings(server_url="http://vigil.test", push_interval_s=0.05, push_samples=False),
                  cpu_ratio=lambda: 0.1)
    assert agent._pusher is not None
    agent._pusher._client = client
    kernel_log.write_text(f"[ 9.0] {XID_79}\n[ 9.5] {XID_48}\n"
                          f"[ 12.5] {XID_79}\n")
    agent.collect_once()
    wait_for(lambda: (agent.step(), agent._pusher is not None and agent._pusher.sent >= 3
                      and not agent._pusher.busy)[1])
    assert agent._pusher.failures == 1 and len(answers) == 2
    assert [(a["stored"], a["duplicates"]) for a in answers] == [(3, 0), (3, 3)]  # the retry: nothing new
    stored = store.events(limit=100)
    assert [(e.ts, e.message) for e in stored] == [(1_009.0, XID_79), (1_009.5, XID_48), (1_012.5, XID_79)]


def test_the_events_route_stores_an_event_once_per_content_and_time(tmp_path) -> None:
    """What makes two pushed events one: every field - a push sent again repeats them all; the same line at
    another time, on another entity or with other attributes is another event. A rank_log line that does not say
    where it was read is stored as it comes (two equal lines of one look share every field)."""
    server, store = _real_rank_log_route(tmp_path)

    def event(ts: float = 100.0, entity: str = "gpu/n01/0", **attrs: Any) -> dict[str, Any]:
        return Event(ts=ts, entity=entity, kind="xid", source="kernel", level=FaultLevel.ISOLATE, message=XID_79,
                     attrs={"xid": 79, **attrs}).model_dump(mode="json")

    def push(*events: dict[str, Any]) -> dict[str, Any]:
        response = server.post("/api/v1/events", json=list(events))
        assert response.status_code == 201, response.text
        answer: dict[str, Any] = response.json()
        return answer

    first = [event(), event(ts=160.0), event(entity="gpu/n01/1"), event(pid=4242)]
    assert push(*first) == {"stored": 4, "duplicates": 0}
    assert push(*reversed(first)) == {"stored": 4, "duplicates": 4}  # the same push again, in another order
    assert push(event(ts=220.0), event(ts=220.0)) == {"stored": 2, "duplicates": 1}  # a line twice in one push
    assert len(store.events(kind="xid", limit=100)) == 5
    line = Event(ts=100.0, entity="job/llm/rank/1", kind="rank_log", source="rank", level=FaultLevel.DEGRADED,
                 message="ValueError: bad batch at step 15").model_dump(mode="json")
    assert push(line, line) == {"stored": 2, "duplicates": 0}
    assert len(store.events(kind="rank_log", limit=100)) == 2


def test_a_samples_push_sent_again_after_its_answer_was_lost_is_stored_once(tmp_path) -> None:
    """The agent pushing a source's samples to the server's real route; the answer to its first push is lost
    after the server stored it, so the agent sends that push again, under its key, after the next round's own
    push: the server answers the retry as a success naming its samples as duplicates and holds each push
    once."""
    server, store = _real_rank_log_route(tmp_path)
    answers: list[dict[str, Any]] = []
    client = _loses_the_first_answer(server, "/samples", answers)
    agent = Agent([CountingSource()], fast_settings(server_url="http://vigil.test", node="n01", push_interval_s=0.05),
                  cpu_ratio=lambda: 0.1)
    assert agent._pusher is not None
    agent._pusher._client = client
    wait_for(lambda: (agent.step(), agent._pusher is not None and len(answers) >= 3 and not agent._pusher.busy)[1])
    looked = answers[0]["stored"]
    assert looked > 0
    # the round after the lost answer sends its own push first, then the one whose answer was lost
    assert answers[:3] == [{"stored": looked, "duplicates": 0}, {"stored": looked, "duplicates": 0},
                           {"stored": looked, "duplicates": looked}]
    assert agent._pusher.failures == 1 and not agent._pusher.backlog
    assert len([p for p in store.pushes_after(0) if p.node == "n01"]) == len(answers) - 1


def test_the_samples_route_stores_a_keyed_push_once_per_node(tmp_path) -> None:
    """A push named by an Idempotency-Key is stored once per node and key; a push without one (an older agent's)
    is stored as it comes; one node's key does not stand for another's push."""
    server, store = _real_rank_log_route(tmp_path)

    def push(node: str = "n01", key: str | None = None) -> dict[str, Any]:
        body = {"node": node, "samples": [{"ts": 100.0, "entity": f"node/{node}", "metric": "vigil_node_load1",
                                           "value": 2.5}]}
        response = server.post("/api/v1/samples", json=body, headers={"Idempotency-Key": key} if key else {})
        assert response.status_code == 201, response.text
        answer: dict[str, Any] = response.json()
        return answer

    assert [push(key="p1"), push(key="p1"), push(key="p2")] == [
        {"stored": 1, "duplicates": 0}, {"stored": 1, "duplicates": 1}, {"stored": 1, "duplicates": 0}]
    assert push(node="n02", key="p1") == {"stored": 1, "duplicates": 0}
    assert [push(), push()] == [{"stored": 1, "duplicates": 0}] * 2
    assert sorted(p.node for p in store.pushes_after(0)) == ["n01"] * 4 + ["n02"]
    assert server.post("/api/v1/samples", json={"node": "n01", "samples": []},
                       headers={"Idempotency-Key": "k" * 201}).status_code == 422


def _answering(statuses: list[int], seen: list[tuple[str, float]]) -> EventPusher:
    """An agent's pusher whose server answers its samples pushes with ``statuses`` in turn; each push's key and the
    time of its sample are kept in ``seen``."""
    answers = iter(statuses)

    def server(request: httpx.Request) -> httpx.Response:
        seen.append((request.headers[IDEMPOTENCY_KEY_HEADER], json.loads(request.content)["samples"][0]["ts"]))
        return httpx.Response(next(answers), json={"stored": 1, "duplicates": 0})

    pusher = EventPusher("http://vigil.test")
    pusher._client = httpx.Client(transport=httpx.MockTransport(server))
    return pusher


def _push_samples_at(pusher: EventPusher, ts: float) -> None:
    """One push round of the agent (no events) with one sample taken at ``ts``."""
    pusher._post([], lambda events: None, [Sample(ts=ts, entity="node/n01", metric="vigil_node_load1", value=1.0)],
                 "n01", None)


@pytest.mark.parametrize("refusal", [400, 413, 422])
def test_a_refused_retry_gives_way_to_the_newer_push_behind_it(refusal: int) -> None:
    """The server fails the first push (503) and refuses it when it comes again, after the round's own, newer push:
    that push is dropped and the newer one taken all the same."""
    seen: list[tuple[str, float]] = []
    pusher = _answering([503, 201, refusal], seen)
    _push_samples_at(pusher, 1.0)
    assert len(pusher.backlog) == 1
    _push_samples_at(pusher, 2.0)
    first, newer = seen[0][0], seen[1][0]
    assert seen == [(first, 1.0), (newer, 2.0), (first, 1.0)] and newer != first
    assert pusher.samples_pushes_sent == 1
    assert not pusher.backlog and pusher.samples_pushes_refused == 1


@pytest.mark.parametrize("status", [408, 425, 429, 503])
def test_a_push_refused_for_now_is_sent_again(status: int) -> None:
    """Request Timeout, Too Early and Too Many Requests (a gateway's rate limit) refuse a push for now, as a server
    error does: the push is kept and sent again under its key after the next round's own."""
    seen: list[tuple[str, float]] = []
    pusher = _answering([status, 201, 201], seen)
    _push_samples_at(pusher, 1.0)
    assert [push.key for push in pusher.backlog] == [seen[0][0]]
    _push_samples_at(pusher, 2.0)
    assert [ts for _, ts in seen] == [1.0, 2.0, 1.0] and seen[2][0] == seen[0][0] != seen[1][0]
    assert not pusher.backlog and pusher.samples_pushes_refused == 0


def test_a_refused_push_is_not_sent_again() -> None:
    seen: list[tuple[str, float]] = []
    pusher = _answering([422, 201], seen)
    _push_samples_at(pusher, 1.0)
    assert not pusher.backlog and pusher.failures == 0
    _push_samples_at(pusher, 2.0)
    assert [ts for _, ts in seen] == [1.0, 2.0] and pusher.samples_pushes_refused == 1


def test_events_beyond_the_queue_for_an_absent_server_are_dropped_and_counted() -> None:
    from vigil.sources.collect.agent import MAX_PENDING_EVENTS

    agent = Agent([RankLines(events=MAX_PENDING_EVENTS // 2 + 2)], fast_settings(server_url="http://127.0.0.1:9"),
                  cpu_ratio=lambda: 0.1)
    agent.collect_once()
    assert len(agent.pending_events) == MAX_PENDING_EVENTS and agent.report()["events_dropped"] == 5
    metrics = {(s.name, tuple(sorted(s.labels.items()))): s.value for family in AgentExposition(agent).collect()
               for s in family.samples}
    assert metrics[("vigil_agent_events_dropped_total", (("reason", "queue_full"),))] == 5


def test_a_finished_read_is_harvested_before_the_next_read_starts() -> None:
    class Lines(Source):
        name, kind = "lines", "kernel"

        def __init__(self) -> None:
            super().__init__()
            self.reads = 0

        def collect(self, now: float) -> Collection:
            self.reads += 1
            return Collection(events=[Event(ts=now, entity="node/n01", kind="kernel", level=FaultLevel.DRAIN,
                                            message=f"read {self.reads}")])

    agent = Agent([Lines()], fast_settings(server_url="http://127.0.0.1:9"), cpu_ratio=lambda: 0.1)
    [runner] = agent.runners
    runner.start(0.0)
    assert runner.thread is not None
    runner.thread.join()  # the read finished after the loop's last harvest
    agent.schedule(time.monotonic() + 60)  # and the source is due again before the next harvest
    if runner.thread is not None:
        runner.thread.join()
    agent.harvest()
    agent.schedule(time.monotonic() + 120)
    runner.thread.join()
    agent.harvest()
    # the second read did not overwrite the first one's lines
    assert [e.message for e in agent.pending_events] == ["read 1", "read 2"]


def test_cli_once_json_on_this_machine_says_no_gpu_and_collects_the_rest(tmp_path) -> None:
    from vigil.faces.cli.main import app

    kernel_log = tmp_path / "kern.log"
    kernel_log.write_text("[ 1.0] NVRM: Xid (PCI:0000:18:00): 79, pid=0, name=, GPU has fallen off the bus.\n")
    result = CliRunner().invoke(app, ["agent", "--once", "--json", "--dcgm-url", "", "--kmsg-file", str(kernel_log)])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output[result.output.index("{") :])
    sources = {s["name"]: s for s in report["sources"]}
    assert sources["nvml"]["status"].startswith("no GPU")
    assert sources["host"]["points"] > 5
    assert report["events"] == {"xid/isolate": 1}


def test_cli_rejects_a_bad_interval() -> None:
    from vigil.faces.cli.main import app

    result = CliRunner().invoke(app, ["agent", "--once", "--interval", "-1"])
    assert result.exit_code != 0
    assert "--interval must be a positive number" in str(result.exception)


def test_agent_keeps_a_local_history_with_tiered_retention(tmp_path) -> None:
    from vigil.store.metrics import MetricStore

    clock = {"now": 1_000_000.0}
    gpu, host = CountingSource("gpu", "gpu"), CountingSource("host", "host")

    class GpuTemps(Source):
        name, kind = "temps", "gpu"

        def collect(self, now: float) -> Collection:
            out = Collection()
            out.add("DCGM_FI_DEV_GPU_TEMP", "gpu/n01/0", 60)
            out.add("DCGM_EXP_XID_ERRORS_COUNT", "gpu/n01/0", 1, xid="79")
            out.add("DCGM_EXP_XID_ERRORS_COUNT", "gpu/n01/0", 2, xid="48")
            return out

    settings = fast_settings(
        store=str(tmp_path / "history"),
        record_interval_s=0.01,
        raw_retention_s=600.0,
        aggregate_step_s=60.0,
        retention_every_s=0.01,
    )
    agent = Agent([gpu, host, GpuTemps()], settings, cpu_ratio=lambda: 0.1, clock=lambda: clock["now"])
    for _ in range(40):
        agent.collect_once()
        agent.record(time.monotonic())
        clock["now"] += 30.0
        time.sleep(0.011)
    agent.close()
    raw = MetricStore(tmp_path / "history" / "raw")
    ts, temps = raw.series("gpu/n01/0", "DCGM_FI_DEV_GPU_TEMP")
    assert len(ts) >= 15 and ts.min() >= clock["now"] - 30.0 - 600.0 - 1e-6  # older frames expired
    assert set(temps.tolist()) == {60.0}
    assert raw.series("gpu/n01/0", "DCGM_EXP_XID_ERRORS_COUNT")[1][-1] == 3  # label split summed
    assert agent.store is not None
    agg_ts, agg = agent.store.job.tier.series("gpu/n01/0", "DCGM_FI_DEV_GPU_TEMP", "mean")
    assert len(agg_ts) >= 10 and set(agg.tolist()) == {60.0}
    assert list((tmp_path / "history" / "aggregates").glob("*.vza"))


def test_real_sources_end_to_end_xid_lands_on_the_gpu_named_by_dcgm_exporter(page_server, dcgm_page, tmp_path) -> None:
    from vigil.sources.collect.agent import build_sources

    page_server.page = dcgm_page.encode()
    kernel_log = tmp_path / "kern.log"
    kernel_log.write_text("")
    settings = fast_settings(dcgm_url=f"{page_server.url}/metrics", kmsg_file=str(kernel_log))
    agent = Agent(build_sources(settings), settings, cpu_ratio=lambda: 0.1)
    agent.collect_once()
    kernel_log.write_text("[ 9.0] NVRM: Xid (PCI:0000:2a:00): 48, pid=77, name=python, DBE (0x1)\n")
    events: list[Event] = []
    kernel = next(r for r in agent.runners if r.name == "kernel")
    original = agent._accept_events
    agent._accept_events = lambda batch: (events.extend(batch), original(batch))  # type: ignore[method-assign]
    agent.collect_once()
    assert [(e.kind, e.entity, e.level) for e in events] == [("xid", "gpu/n01/1", FaultLevel.ISOLATE)]
    report = agent.report()
    assert {s["name"] for s in report["sources"]} >= {"host", "nvml", "infiniband", "dcgm", "kernel"}
    assert any(p["metric"] == "DCGM_FI_DEV_GPU_TEMP" and p["labels"].get("pod") == "trainer" for p in report["points"])
    assert kernel.up and agent.report()["labels"]["folded"] > 0
    agent.close()
