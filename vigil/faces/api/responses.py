"""Response models of the REST routes that do not return a vigil/model.py record as it is: the contract the
OpenAPI page documents and the dashboard reads. Fault levels are ``FaultLevel`` labels ("healthy",
"observe", "degraded", "drain", "isolate") everywhere in JSON, as in vigil/model.py records."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from vigil.model import Action, Diagnosis, Event, FaultLevel, HangDiagnosis, Job, Node


class Health(BaseModel):
    status: str = "ok"
    incidents: int


class GpuCell(BaseModel):
    id: str
    index: int
    model: str
    level: FaultLevel


class GpuRow(GpuCell):
    node: str


class NodeRow(BaseModel):
    """One row of the heat map: the node's own level and the worst of it and its GPUs."""

    name: str
    id: str
    rack: str | None = None
    switch: str | None = None
    node_level: FaultLevel
    level: FaultLevel
    gpus: list[GpuCell]


class LifecycleStep(BaseModel):
    model_config = {"populate_by_name": True}

    ts: float
    from_state: str = Field(alias="from")
    stage: str
    trigger: str
    detail: str


class NodeDetail(BaseModel):
    node: Node
    level: FaultLevel
    stage: str
    since: float
    reason: str
    steps: list[LifecycleStep]
    events: list[Event]
    actions: list[Action]


class Series(BaseModel):
    ts: list[float]
    values: list[float | None]


class JobStepTimes(BaseModel):
    job: Job
    ranks: dict[int, Series]
    job_series: Series


class Stored(BaseModel):
    """A push of records: how many were stored."""

    stored: int


class SamplesStored(Stored):
    """An agent's samples push: ``stored`` counts every sample accepted; ``duplicates`` the ones of a push the
    node sent already under the same ``Idempotency-Key`` (sent again after its answer was lost), not stored
    twice: all of a push or none."""

    duplicates: int = 0


class EventsStored(Stored):
    """An events push: ``stored`` counts every event accepted; ``duplicates`` the ones an earlier push stored
    already (the same push sent again after its answer was lost), not stored twice."""

    duplicates: int = 0


class AlertsStored(EventsStored):
    """An Alertmanager notification: one event per alert, counted as an events push counts them (``duplicates``:
    the alerts a notification sent earlier stored already), and the entities the alerts are about."""

    entities: list[str]


class MetricSeries(Series):
    entity: str
    metric: str


class PromSample(BaseModel):
    labels: dict[str, str]
    ts: float
    value: float


class HangSummary(BaseModel):
    name: str
    verdict: str
    culprit_ranks: list[int] = Field(default_factory=list)
    hang_kind: str | None = None
    error: str | None = None


class StackTreeNode(BaseModel):
    frame: str
    ranks: list[int]
    fork_point: bool
    children: list[StackTreeNode] = Field(default_factory=list)


class HangView(BaseModel):
    name: str
    world_size: int
    diagnosis: HangDiagnosis
    stack_tree: StackTreeNode


# --------------------------------------------------------------------------- MCP tool results
# Small, already-computed summaries (an agent's context is a budget); fault levels as labels, like every JSON
# answer, which is what a model reads best and what the tools' descriptions name.


class IncidentSummary(BaseModel):
    id: str
    title: str
    level: FaultLevel
    scope: str
    fault_types: list[str]
    start: float
    end: float
    status: str
    entities: list[str]


class IncidentList(BaseModel):
    count: int
    incidents: list[IncidentSummary]


class EvidenceItem(BaseModel):
    """Evidence without its raw attributes."""

    ref: str
    kind: str
    entity: str
    ts: float
    summary: str
    metric: str | None = None
    value: float | None = None


class ActionItem(BaseModel):
    """An action without its back-end parameters."""

    id: str
    ts: float
    kind: str
    target: str
    incident_id: str | None
    reason: str
    requested_by: str
    dry_run: bool
    status: str
    result: str


class IncidentDetail(IncidentSummary):
    evidence: list[EvidenceItem]
    evidence_total: int
    diagnosis: Diagnosis | None
    # None with diagnosis_pending true: the server is diagnosing it in the background (ask again shortly);
    # diagnosis_state failed: diagnosis_error says why.
    diagnosis_state: Literal["done", "pending", "running", "retrying", "failed", "off"] = "done"
    diagnosis_pending: bool = False
    diagnosis_error: str = ""
    actions: list[ActionItem]


class GpuHealth(BaseModel):
    gpu: str
    level: FaultLevel


class NodeHealth(BaseModel):
    node: str
    level: FaultLevel
    gpus: list[GpuHealth]


class HealthReport(BaseModel):
    nodes_total: int
    matching: int
    nodes: list[NodeHealth]


class MetricStats(BaseModel):
    min: float
    max: float
    mean: float
    last: float


class MetricPoints(BaseModel):
    entity: str
    metric: str
    points_total: int
    stats: MetricStats | None
    ts: list[float]
    values: list[float | None]


class RankOnBadHardware(BaseModel):
    rank: int
    gpu: str
    level: FaultLevel


class StepTimeStats(BaseModel):
    median: float
    last: float
    max: float


class JobHealth(BaseModel):
    job: str
    world_size: int
    ranks_on_unhealthy_hardware: list[RankOnBadHardware]
    incidents: list[IncidentSummary]
    step_time_median_s_by_rank: dict[int, float]
    straggler_rank: int | None
    job_step_time_s: StepTimeStats | None


class XidExplanation(BaseModel):
    xid: int
    mnemonic: str
    description: str
    nvidia_action: str
    level: FaultLevel
    vigil_action: str
    known: bool


class LogHit(BaseModel):
    ts: float | None
    entity: str
    source: str
    kind: str
    line: str


class LogSearch(BaseModel):
    matches: int
    results: list[LogHit]
