"""A job Vigil did not launch, seen through the node agent's rank-log forwarder, with real parts: a 4-rank gloo job
started by torchrun writing each rank's output to its own file (``--log-dir --redirects 3``), one rank raising;
a real `vigil agent` following those files and a real `vigil serve` (engine inside). The ranks' decoded lines
reach the store as rank_log events on the right ranks (the raising rank's exception, its peers' gloo errors
about it), and the crash incident the job's failure opens is diagnosed down to the rank that raised: the one
rank of four without the peers' error.

What a scheduler says is not in this test (no Slurm or Kubernetes places a GPU-less job here): the job's
placement goes in through the launch route and its failure as the event the Slurm reader stores for a FAILED
job (vigil.sources.collect.slurm), in their own formats."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.run.live_processes import answers, start, vigil_env
from tests.serve.conftest import TOKEN, free_port, wait_for
from vigil.knowledge.faults import fault_level
from vigil.model import Event, LaunchReport, RankPlacement
from vigil.sources.collect.base import default_node_name

pytestmark = pytest.mark.slow

JOB_SCRIPT = Path(__file__).with_name("heartbeat_job.py")
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
JOB = "tr-4242"
WORLD = 4


class Cluster:
    def __init__(self, url: str, agent_url: str, logs: list[Path]) -> None:
        self.url = url
        self.agent_url = agent_url
        self.logs = logs

    def get(self, path: str) -> Any:
        response = httpx.get(self.url + path, timeout=10, headers=HEADERS)
        response.raise_for_status()
        return response.json()

    def post(self, path: str, body: str) -> Any:
        response = httpx.post(self.url + path, content=body, timeout=10,
                              headers={**HEADERS, "Content-Type": "application/json"})
        assert response.status_code == 201, response.text
        return response.json()

    def wait(self, condition: Any, timeout_s: float, what: str) -> None:
        try:
            wait_for(condition, timeout_s, what, interval_s=0.25)
        except AssertionError:
            for log in self.logs:
                print(f"--- {log.name}\n{log.read_text()[-3000:]}")
            raise

    def agent_metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {(s.name, tuple(sorted(s.labels.items()))): s.value for family in text_string_to_metric_families(
            httpx.get(self.agent_url + "/metrics", timeout=10).text) for s in family.samples}

    def rank_lines(self) -> list[dict[str, Any]]:
        return [e for e in self.get("/api/v1/events?kind=rank_log") if e["entity"].startswith(f"job/{JOB}/")]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """`vigil serve` and `vigil agent` on this node, following torchrun's per-rank stderr files under
    ``tmp_path/torchrun`` (``<run id>/attempt_<n>/<local rank>/stderr.log``) as ranks of JOB."""
    port, agent_port = free_port(), free_port()
    logs = [tmp_path / "serve.log", tmp_path / "agent.log"]
    kernel_log = tmp_path / "kern.log"
    kernel_log.write_text("")
    with ExitStack() as stack:
        start(stack, [sys.executable, "-m", "vigil", "serve", "--port", str(port)], logs[0],
              vigil_env(VIGIL_HOME=str(tmp_path / "home"), VIGIL_API_TOKEN=TOKEN, VIGIL_ENGINE_INTERVAL_S="0.5"))
        url = f"http://127.0.0.1:{port}"
        cluster = Cluster(url, f"http://127.0.0.1:{agent_port}", logs)
        cluster.wait(lambda: answers(url + "/api/v1/health"), 60, "vigil serve to answer")
        start(stack, [sys.executable, "-m", "vigil", "agent", "--interval", "0.5", "--port", str(agent_port),
                      "--dcgm-url", "",
                      "--kmsg-file", str(kernel_log), "--server", url,
                      "--rank-logs", str(tmp_path / "torchrun" / "*" / "attempt_*" / "*" / "stderr.log"),
                      "--rank-log-pattern", r"/attempt_\d+/(?P<rank>\d+)/stderr\.log$", "--rank-log-job", JOB],
              logs[1], vigil_env(VIGIL_AGENT_NODE=default_node_name(), VIGIL_AGENT_SERVER_TOKEN=TOKEN,
                                 VIGIL_AGENT_PUSH_INTERVAL_S="0.5"))
        cluster.wait(lambda: [n["name"] for n in cluster.get("/api/v1/nodes")] == [default_node_name()], 60,
                     "the agent to register its node")
        # the rank-log source's first look follows the files already there from their end: the job starts after it
        files = ("vigil_agent_rank_log_files", (("node", default_node_name()),))
        cluster.wait(lambda: files in cluster.agent_metrics(), 60, "the agent's first look at the rank log files")
        yield cluster


def _torchrun(tmp_path: Path, *job_args: str) -> int:
    """The job under torchrun (not `vigil launch`): each rank's stdout and stderr in its own file."""
    # torchrun stops the other ranks once it sees one fail; looking every 10 s gives every peer time to print
    # its own gloo error (a rank not next to the failed one in the ring hears of it when its neighbour exits)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(WORLD),
               "--monitor-interval", "10", "--log-dir", str(tmp_path / "torchrun"), "--redirects", "3",
               str(JOB_SCRIPT), *job_args]
    with (tmp_path / "torchrun.log").open("wb") as out:
        return subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=vigil_env(), timeout=300).returncode


def test_a_torchrun_jobs_raising_rank_reaches_the_engine_through_the_agent(cluster: Cluster, tmp_path: Path) -> None:
    node = default_node_name()
    # the job's placement, as its scheduler would have it: every rank on this node
    placement = [RankPlacement(rank=r, node=node) for r in range(WORLD)]
    cluster.post("/api/v1/launches", LaunchReport(job=JOB, ts=0.0, world_size=WORLD, placement=placement)
                 .model_dump_json())
    assert _torchrun(tmp_path, "--steps", "100000", "--raise-rank", "1", "--at-step", "15") != 0
    stderr = sorted((tmp_path / "torchrun").glob("*/attempt_0/*/stderr.log"))
    assert [p.parent.name for p in stderr] == [str(r) for r in range(WORLD)], (
        tmp_path / "torchrun.log").read_text()[-3000:]
    assert "ValueError: bad batch at step 15" in stderr[1].read_text()

    # rank 1's ring neighbours hear of its exit at once; a rank further away hears of it only when a neighbour dies,
    # and on a loaded machine torchrun may stop that rank first: what is expected is what each rank's file holds
    peers = [r for r in range(WORLD) if r != 1 and "Connection closed by peer" in stderr[r].read_text()]
    assert peers, (tmp_path / "torchrun.log").read_text()[-3000:]
    expected = {(f"job/{JOB}/rank/1", "python.exception")} | {(f"job/{JOB}/rank/{r}", "gloo.peer_closed")
                                                              for r in peers}
    cluster.wait(lambda: {(e["entity"], e["attrs"]["signature"]) for e in cluster.rank_lines()} >= expected, 60,
                 "every rank's error line through the agent")
    lines = cluster.rank_lines()
    assert {(e["entity"], e["attrs"]["signature"]) for e in lines} == expected, lines
    [raised] = [e for e in lines if e["entity"] == f"job/{JOB}/rank/1"]
    assert "ValueError: bad batch at step 15: labels out of range" in raised["message"] and raised["source"] == "rank"
    assert all("Connection closed by peer" in e["message"] for e in lines if e["entity"] != raised["entity"])

    # the scheduler reports the job FAILED (as the Slurm reader stores it); the engine opens the crash incident
    failed = Event(ts=raised["ts"] + 1.0, entity=f"job/{JOB}", kind="job", source="slurm",
                   level=fault_level("job_crash"), message=f"Slurm job {JOB} FAILED on {node}",
                   attrs={"reason": "crashed", "state": "FAILED", "exit_reason": "FAILED exit code 1:0",
                          "nodes": [node]})
    cluster.post("/api/v1/events", f"[{failed.model_dump_json()}]")
    cluster.wait(lambda: [i for i in cluster.get("/api/v1/incidents") if i["scope"].startswith(f"job/{JOB}")],
                 60, "the job's crash incident")
    [incident] = [i for i in cluster.get("/api/v1/incidents") if i["scope"].startswith(f"job/{JOB}")]
    assert incident["fault_types"] == ["job_crash"], incident
    path = f"/api/v1/incidents/{incident['id']}/diagnosis"
    cluster.wait(lambda: httpx.get(cluster.url + path, timeout=10, headers=HEADERS).status_code == 200, 60,
                 "the incident's diagnosis")
    diagnosis = cluster.get(path)
    # a ValueError in the job's own code is the application's error, not the GPU's memory (gpu_oom)
    assert (diagnosis["root_cause"]["entity"], diagnosis["root_cause"]["fault_type"]) == (
        f"job/{JOB}/rank/1", "application_error"), diagnosis["root_cause"]

    # the agent's own account: the files it follows, the lines it read, nothing dropped or refused
    metrics = cluster.agent_metrics()
    assert metrics[("vigil_agent_rank_log_files", (("node", node),))] == WORLD
    assert metrics[("vigil_agent_rank_log_lines_total", (("node", node),))] >= WORLD
    assert metrics[("vigil_agent_source_up", (("source", "rank_log"),))] == 1
    assert metrics[("vigil_agent_events_dropped_total", (("reason", "queue_full"),))] == 0
    assert metrics[("vigil_agent_events_dropped_total", (("reason", "refused"),))] == 0
    assert not [key for key in metrics if key[0] == "vigil_agent_rank_log_events_refused_total"]
