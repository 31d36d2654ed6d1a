"""The MCP server through the official SDK's own client, over stdio and over streamable HTTP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.serve.conftest import (
    APPROVER,
    APPROVER_TOKEN,
    REPO,
    STRAGGLER_RANK,
    TOKEN,
    SimCluster,
    approvers_file,
    free_port,
    wait_for,
)

pytestmark = pytest.mark.slow

TOOLS = {"list_incidents", "get_incident", "node_health", "query_metrics", "diagnose_job", "explain_xid", "search_logs",
         "job_events", "incidents_touching", "changes_before", "incident_plan", "oncall_summary", "metric_shift",
         "compare_jobs", "correlate_incident",
         "similar_incidents", "search_memory"}


def server_env(cluster: SimCluster) -> dict[str, str]:
    return {
        "VIGIL_HOME": str(cluster.home),
        "VIGIL_DB_URL": cluster.store.url,
        "VIGIL_API_TOKEN": TOKEN,
        "VIGIL_USERS_FILE": str(approvers_file(cluster.home)),
        "PYTHONPATH": str(REPO),
    }


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    return json.loads(result.content[0].text)  # type: ignore[union-attr, no-any-return]


async def exercise(client: Client, cluster: SimCluster) -> None:
    names = {tool.name for tool in (await client.list_tools()).tools}
    assert names == TOOLS  # read-only: no write tools unless --allow-writes

    listed = await call(client, "list_incidents", status="any", limit=200)
    assert {i["id"] for i in listed["incidents"]} >= {i.id for i in cluster.result.incidents}
    detail = await call(client, "get_incident", incident_id=cluster.incident.id)
    assert detail["diagnosis"]["root_cause"]["entity"] == cluster.diagnosis.root_cause.entity  # type: ignore[union-attr]
    assert len(detail["evidence"]) == min(30, len(cluster.incident.evidence))

    health = await call(client, "node_health", min_level="drain")
    expected = {e for e, level in cluster.store.node_health().items() if e.startswith("gpu/") and level >= 3}
    assert {g["gpu"] for n in health["nodes"] for g in n["gpus"]} == expected

    gpu = cluster.run.topology.nodes[1].gpus[2].id
    metric = await call(client, "query_metrics", entity=gpu, metric="DCGM_FI_DEV_GPU_TEMP", max_points=50)
    ts, values = cluster.metrics.series(gpu, "DCGM_FI_DEV_GPU_TEMP")
    assert metric["points_total"] == len(ts) and len(metric["values"]) == 50
    assert metric["stats"]["max"] == pytest.approx(float(values.max()))

    job = await call(client, "diagnose_job", job_id=cluster.run.topology.jobs[0].id)
    assert job["straggler_rank"] == STRAGGLER_RANK and job["world_size"] == 32

    xid = await call(client, "explain_xid", code=79)
    assert xid["level"] == "isolate" and "bus" in xid["description"].lower()

    logs = await call(client, "search_logs", text="Xid", limit=10)
    assert 0 < len(logs["results"]) <= 10 and all("xid" in r["line"].lower() for r in logs["results"])

    # the analysis tools: counts computed over the store, and the memory of resolved incidents
    incidents = cluster.store.incidents(limit=100_000)
    changes = await call(client, "changes_before", incident_id=cluster.incident.id, window_s=600)
    expected_events = cluster.store.events(since=cluster.incident.start - 600, until=cluster.incident.start,
                                           limit=100_000)
    assert changes["events_total"] == len(expected_events)
    assert sum(c["count"] for c in changes["events_by_kind"]) <= len(expected_events)
    summary = await call(client, "oncall_summary", hours=744)
    assert summary["incidents_total"] == len(incidents)
    resolved = {i.id for i in incidents if i.status.value == "resolved"}
    similar = await call(client, "similar_incidents", incident_id=cluster.incident.id, k=2)
    assert similar["remembered"] == len(resolved) and len(similar["similar"]) <= 2
    assert {s["incident_id"] for s in similar["similar"]} <= resolved - {cluster.incident.id}
    memory = await call(client, "search_memory", text=cluster.incident.fault_types[0], k=3)
    assert memory["remembered"] == len(resolved)
    assert all(0 < m["score"] <= 1 for m in memory["matches"])

    missing = await client.call_tool("get_incident", {"incident_id": "inc-nope"})
    assert missing.is_error and "no incident 'inc-nope'" in missing.content[0].text  # type: ignore[union-attr]
    bad_entity = await client.call_tool("query_metrics", {"entity": "gpu/x", "metric": "DCGM_FI_DEV_GPU_TEMP"})
    assert bad_entity.is_error and "bad entity id" in bad_entity.content[0].text  # type: ignore[union-attr]


def test_mcp_over_stdio(cluster: SimCluster) -> None:
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "vigil", "mcp"], env=server_env(cluster), cwd=str(REPO)
    )

    async def session() -> None:
        async with Client(params) as client:
            await exercise(client, cluster)

    anyio.run(session)


def test_mcp_over_streamable_http_with_write_tools(cluster: SimCluster, tmp_path: Path) -> None:
    port = free_port()
    log = (tmp_path / "mcp.log").open("w")
    env = {**os.environ, **server_env(cluster)}
    process = subprocess.Popen(
        [sys.executable, "-m", "vigil", "mcp", "--transport", "http", "--port", str(port), "--allow-writes"],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        import httpx

        def listening() -> bool:
            try:
                return httpx.get(url, timeout=1).status_code in (401, 405, 406, 400)
            except httpx.HTTPError:
                return False

        wait_for(listening, 60, "vigil mcp --transport http to listen")
        assert httpx.post(url, json={}, timeout=5).status_code == 401  # writes enabled: token required

        async def session() -> None:
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            async with (
                httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as http,
                httpx2.AsyncClient(headers={"Authorization": f"Bearer {APPROVER_TOKEN}"}, timeout=30) as http2,
                Client(streamable_http_client(url, http_client=http)) as client,
                Client(streamable_http_client(url, http_client=http2)) as approver,
            ):
                names = {tool.name for tool in (await client.list_tools()).tools}
                assert names == TOOLS | {"propose_action", "approve_action", "execute_action"}
                xid = await call(client, "explain_xid", code=119)
                assert xid["level"] == "drain"
                proposed = await call(
                    client, "propose_action", kind="cordon", target="node/n002", reason="from an agent"
                )
                # The shared token is one identity: it cannot approve its own proposal; another person can.
                own = await client.call_tool("approve_action", {"action_id": proposed["id"]})
                assert own.is_error and "two-person" in own.content[0].text  # type: ignore[union-attr]
                approved = await call(approver, "approve_action", action_id=proposed["id"])
                assert approved["status"] == "approved" and approved["params"]["approved_by"] == APPROVER
                refused = await client.call_tool(
                    "propose_action", {"kind": "rm_rf", "target": "node/n002", "reason": "x"}
                )
                assert refused.is_error and "whitelist" in refused.content[0].text  # type: ignore[union-attr]
                # the rest of the read tools, over HTTP this time
                await exercise_reads(client, cluster)

        anyio.run(session)
        stored = [a for a in cluster.store.actions(limit=10000) if a.reason == "from an agent"]
        # the authenticated identity, not the transport: the shared token is the user "api"
        assert stored and stored[-1].requested_by == "api" and stored[-1].status.value == "approved"
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


async def exercise_reads(client: Client, cluster: SimCluster) -> None:
    listed = await call(client, "list_incidents", status="open")
    assert listed["count"] == min(20, len(cluster.store.incidents(status="open", limit=10000)))
    job = await call(client, "diagnose_job", job_id="j00")
    assert job["straggler_rank"] == STRAGGLER_RANK
