"""The tools `vigil ask` answers from: every tool of the MCP server (the read tools and the analysis tools of
``vigil.faces.api.analysis``), called through the SDK's own ``call_tool`` - one copy, the one agents see.
Every tool returns a pydantic model; every scalar in it is a fact with a stable citation id
``<call id>.<path>`` (``job.ranks_on_unhealthy_hardware.0.gpu``), so an answer can be checked fact by fact
against what the tools returned."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult
from pydantic import BaseModel

from vigil.faces.api.analysis import (
    ChangesBefore,
    IncidentCorrelation,
    IncidentPlan,
    JobComparison,
    JobEvents,
    MemorySearch,
    MetricShift,
    OncallSummary,
    SimilarIncidents,
)
from vigil.faces.api.context import ServeContext
from vigil.faces.api.mcp_server import build_mcp_server
from vigil.faces.api.responses import (
    HealthReport,
    IncidentDetail,
    IncidentList,
    JobHealth,
    LogSearch,
    MetricPoints,
    XidExplanation,
)
from vigil.model import VigilInputError

# The MCP tools `vigil ask` may call (all read-only), with the model each answers with.
MCP_TOOLS: dict[str, type[BaseModel]] = {
    "list_incidents": IncidentList,
    "get_incident": IncidentDetail,
    "node_health": HealthReport,
    "query_metrics": MetricPoints,
    "diagnose_job": JobHealth,
    "explain_xid": XidExplanation,
    "search_logs": LogSearch,
    "job_events": JobEvents,
    "incidents_touching": IncidentList,
    "changes_before": ChangesBefore,
    "incident_plan": IncidentPlan,
    "oncall_summary": OncallSummary,
    "metric_shift": MetricShift,
    "compare_jobs": JobComparison,
    "correlate_incident": IncidentCorrelation,
    "similar_incidents": SimilarIncidents,
    "search_memory": MemorySearch,
}


@dataclass
class ToolResult:
    """One call: its citation id, the tool, its arguments and the model it answered with."""

    id: str
    tool: str
    args: dict[str, Any]
    result: BaseModel

    def facts(self) -> dict[str, Any]:
        """Every scalar of the result under its citation id."""
        out: dict[str, Any] = {}
        _flatten(self.id, self.result.model_dump(mode="json"), out)
        return out

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "tool": self.tool, "args": self.args, "result": self.result.model_dump(mode="json")}


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _flatten(f"{prefix}.{key}", item, out)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _flatten(f"{prefix}.{index}", item, out)
    else:
        out[prefix] = value


class Toolbox:
    """The read tools over one ServeContext; ``call`` runs one by name through the MCP server, which validates
    its arguments."""

    def __init__(self, ctx: ServeContext) -> None:
        self.ctx = ctx
        self._mcp: MCPServer = build_mcp_server(ctx)

    @property
    def names(self) -> list[str]:
        return list(MCP_TOOLS)

    def specs(self) -> list[dict[str, Any]]:
        """OpenAI function specs of every tool, from the MCP server's own input schemas."""
        return [
            {"type": "function", "function": {"name": t.name, "description": t.description or "",
                                              "parameters": t.input_schema}}
            for t in asyncio.run(self._mcp.list_tools()) if t.name in MCP_TOOLS
        ]

    def call(self, call_id: str, tool: str, args: dict[str, Any]) -> ToolResult:
        if tool not in MCP_TOOLS:
            raise VigilInputError(f"no tool {tool!r}; tools: {', '.join(self.names)}")
        # the MCP server words its errors for a remote client ("Error executing tool job_events: no job ..."); the
        # tool is named once here
        said = f"Error executing tool {tool}: "
        try:
            raw = asyncio.run(self._mcp.call_tool(tool, args))
        except ToolError as err:
            raise VigilInputError(f"{tool}: {str(err).removeprefix(said)}") from None
        if not isinstance(raw, CallToolResult) or raw.is_error or raw.structured_content is None:
            text = " ".join(getattr(c, "text", "") for c in getattr(raw, "content", []))
            raise VigilInputError(f"{tool}: {text.removeprefix(said) or 'failed'}")
        result = MCP_TOOLS[tool].model_validate(raw.structured_content)
        return ToolResult(id=call_id, tool=tool, args=args, result=result)
