"""A job's incidents include those narrowed to one of its ranks, for CPU jobs (ranks placed on nodes) too."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from vigil.config import Settings
from vigil.faces.api.analysis import Analysis
from vigil.faces.api.context import ServeContext
from vigil.faces.api.mcp_server import build_mcp_server
from vigil.model import FaultLevel, Gpu, Incident, Job, Node, Topology
from vigil.store.sql import Store


def _ctx(tmp_path: Path) -> tuple[ServeContext, dict[str, Incident]]:
    store = Store(f"sqlite:///{tmp_path / 'vigil.db'}")
    store.save_topology(Topology(
        nodes=[Node(name="cpu1"), Node(name="g1", gpus=[Gpu(node="g1", index=0)]), Node(name="other")],
        jobs=[Job(id="hang", placement=["node/cpu1", "node/cpu1"]), Job(id="gpujob", placement=["gpu/g1/0"])],
    ))
    made = {
        "rank": Incident(title="hang on rank 1", scope="job/hang/rank/1", entities=["job/hang/rank/1"],
                         start=10.0, end=20.0, level=FaultLevel.DEGRADED, fault_types=["job_hang"]),
        "gpu": Incident(title="xid 79", scope="gpu/g1/0", entities=["gpu/g1/0"], start=5.0, end=6.0,
                        level=FaultLevel.ISOLATE, fault_types=["gpu_fell_off_bus"]),
        "elsewhere": Incident(title="node down", scope="node/other", entities=["node/other"], start=1.0, end=2.0,
                              level=FaultLevel.DRAIN, fault_types=["node_down"]),
    }
    for incident in made.values():
        store.create_incident(incident)
    return ServeContext(store=store, settings=Settings(home=tmp_path)), made


def _tool(ctx: ServeContext, name: str, **arguments: Any) -> dict[str, Any]:
    result = asyncio.run(build_mcp_server(ctx).call_tool(name, arguments))
    assert not result.is_error, result.content  # type: ignore[union-attr]
    return json.loads(result.content[0].text)  # type: ignore[union-attr]


def test_diagnose_job_lists_an_incident_narrowed_to_its_rank(tmp_path: Path) -> None:
    ctx, made = _ctx(tmp_path)
    health = _tool(ctx, "diagnose_job", job_id="hang")
    assert health["world_size"] == 2
    assert [i["id"] for i in health["incidents"]] == [made["rank"].id]


def test_diagnose_job_still_lists_incidents_on_its_hardware(tmp_path: Path) -> None:
    ctx, made = _ctx(tmp_path)
    assert [i["id"] for i in _tool(ctx, "diagnose_job", job_id="gpujob")["incidents"]] == [made["gpu"].id]


def test_incidents_touching_a_job_covers_its_ranks_and_nothing_else(tmp_path: Path) -> None:
    ctx, made = _ctx(tmp_path)
    analysis = Analysis(ctx)
    assert [i.id for i in analysis.incidents_touching("job/hang").incidents] == [made["rank"].id]
    assert [i.id for i in analysis.incidents_touching("job/hang/rank/0").incidents] == []
    assert [i.id for i in analysis.incidents_touching("node/g1").incidents] == [made["gpu"].id]
    window = analysis.compare_jobs("hang", "gpujob")
    assert window.a.incident_ids == [made["rank"].id]
    assert window.b is not None and window.b.incident_ids == [made["gpu"].id]
