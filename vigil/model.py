"""Vigil's vocabulary: the records that every stage reads and writes.

Every stage (collect, store, detect, diagnose, remedy, serve) takes these records in and gives these
records out; the same types go over HTTP, into the store and into the LLM prompt.

Times are Unix seconds (float). Entities are named by stable string ids:

    node/<name>                 a host
    gpu/<node>/<index>          GPU <index> of a host
    nic/<node>/<name>           a network interface of a host (mlx5_0, eth0, ...)
    switch/<name>               a leaf / spine switch
    rack/<name>                 a rack
    job/<id>                    a training job
    job/<id>/rank/<r>           one rank of a job
    cluster/<name>              the whole cluster
"""

from __future__ import annotations

import enum
import hashlib
import re
import uuid
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    ValidationError,
)
from pydantic_core import CoreSchema, core_schema

__all__ = [
    "ActionKind",
    "ActionStatus",
    "Action",
    "Anomaly",
    "Cause",
    "Diagnosis",
    "EntityId",
    "Event",
    "Evidence",
    "FaultLevel",
    "GroundTruthFault",
    "Gpu",
    "Incident",
    "IncidentMemory",
    "IncidentStatus",
    "Job",
    "LaunchReport",
    "LaunchVerdict",
    "LogRecord",
    "Nic",
    "Node",
    "RankPlacement",
    "RankState",
    "RemediationStep",
    "Sample",
    "SimilarIncident",
    "StepTelemetry",
    "Switch",
    "Topology",
    "VigilConflictError",
    "VigilInputError",
    "describe_validation_error",
    "entity_kind",
    "gpu_id",
    "job_id",
    "new_id",
    "nic_id",
    "node_id",
    "parse_entity",
    "rack_id",
    "rank_id",
    "switch_id",
]


class VigilInputError(ValueError):
    """Bad input from a user or a source; the message is one line naming what was wrong."""

    def __init__(self, message: object = "") -> None:
        # Messages quote what was read (a pickle's complaint, a key from a file): fold them onto one line.
        super().__init__(" ".join(str(message).split()))


class VigilConflictError(VigilInputError):
    """A create that would replace something already stored (HTTP 409; exit status 2 on the command line)."""


class IdempotencyKeyReused(VigilInputError):
    """A push sent under the key of an earlier push that held something else: not that push sent again, so neither
    stored nor a duplicate (HTTP 422, as the IETF Idempotency-Key header draft answers a reused key)."""


# --------------------------------------------------------------------------- entity ids

_NAME = r"[A-Za-z0-9][A-Za-z0-9_.:\-]*"
_ENTITY_PATTERNS: dict[str, re.Pattern[str]] = {
    "node": re.compile(rf"^node/({_NAME})$"),
    "gpu": re.compile(rf"^gpu/({_NAME})/(\d+)$"),
    "nic": re.compile(rf"^nic/({_NAME})/({_NAME})$"),
    "switch": re.compile(rf"^switch/({_NAME})$"),
    "rack": re.compile(rf"^rack/({_NAME})$"),
    "rank": re.compile(rf"^job/({_NAME})/rank/(\d+)$"),
    "job": re.compile(rf"^job/({_NAME})$"),
    "cluster": re.compile(rf"^cluster/({_NAME})$"),
}


def parse_entity(entity: str) -> tuple[str, tuple[str, ...]]:
    """Split an entity id into its kind and parts: ``gpu/n01/3`` -> ``("gpu", ("n01", "3"))``."""
    for kind, pattern in _ENTITY_PATTERNS.items():
        match = pattern.match(entity)
        if match:
            return kind, match.groups()
    raise VigilInputError(
        f"bad entity id {entity!r}: expected node/<name>, gpu/<node>/<index>, nic/<node>/<name>, "
        "switch/<name>, rack/<name>, job/<id>, job/<id>/rank/<r> or cluster/<name>"
    )


def entity_kind(entity: str) -> str:
    return parse_entity(entity)[0]


def covers(entity: str, other: str) -> bool:
    """Whether ``other`` lies on ``entity``: the entity itself, a node's GPUs and NICs, a job's ranks."""
    if other == entity:
        return True
    kind, parts = parse_entity(entity)
    if kind == "node":
        return other.startswith((f"gpu/{parts[0]}/", f"nic/{parts[0]}/"))
    if kind == "job":
        return other.startswith(f"{entity}/rank/")
    return False


def _check_entity(entity: str) -> str:
    parse_entity(entity)
    return entity


EntityId = Annotated[str, AfterValidator(_check_entity)]


def node_id(name: str) -> str:
    return f"node/{name}"


def gpu_id(node: str, index: int) -> str:
    return f"gpu/{node}/{index}"


def nic_id(node: str, name: str) -> str:
    return f"nic/{node}/{name}"


def switch_id(name: str) -> str:
    return f"switch/{name}"


def rack_id(name: str) -> str:
    return f"rack/{name}"


def job_id(job: str) -> str:
    return f"job/{job}"


def rank_id(job: str, rank: int) -> str:
    return f"job/{job}/rank/{rank}"


def node_of(entity: str) -> str | None:
    """The node id an entity lives on (for gpu/nic/node ids), else None."""
    kind, parts = parse_entity(entity)
    if kind in ("node", "gpu", "nic"):
        return node_id(parts[0])
    return None


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def stable_id(prefix: str, *parts: object) -> str:
    """An id named by what a record is about: the same record made again (a tick replayed after a crash, a
    demo run again with the same seed) gets the same id, where ``new_id`` gives a new one each time."""
    return f"{prefix}-" + hashlib.sha1("|".join(str(p) for p in parts).encode()).hexdigest()[:16]


# Record ids travel in URLs, file names and SQL keys: letters, digits and ``_ . : -``, no path separators.
RECORD_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,63}$"


# --------------------------------------------------------------------------- fault levels


class FaultLevel(enum.IntEnum):
    """GPU / node fault levels, from "nothing to do" to "take it out now".

    The one place these are defined; docs/fault-levels.md explains how each source maps onto them.

    - HEALTHY: no open fault.
    - OBSERVE: a one-off or application-caused error (Xid 13, 31, 43, 94); keep running, watch for repeats.
    - DEGRADED: usable but slow or error-prone (thermal throttling, PCIe replays, NVLink CRC, SBE storm);
      keep the job, schedule inspection.
    - DRAIN: must leave service at the next safe point (checkpoint, job end): GPU reset or reboot needed
      (Xid 119 GSP timeout, pending row remap, PCIe width downgrade, NIC link flaps).
    - ISOLATE: stop using it now: data can be wrong or the device is gone (DBE, row-remap failure,
      fallen off the bus, uncontained error, NIC lost, link down on the job's rail).
    """

    HEALTHY = 0
    OBSERVE = 1
    DEGRADED = 2
    DRAIN = 3
    ISOLATE = 4

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, value: str | int) -> FaultLevel:
        expected = f"expected one of {', '.join(m.label for m in cls)}"
        if isinstance(value, cls):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            try:
                return cls(value)
            except ValueError:
                raise VigilInputError(f"bad fault level {value!r}: {expected}") from None
        if not isinstance(value, str):
            raise VigilInputError(f"bad fault level {value!r}: {expected}")
        if value.strip().isascii() and value.strip().isdigit():
            return cls.parse(int(value))
        try:
            return cls[value.strip().upper()]
        except KeyError:
            raise VigilInputError(f"bad fault level {value!r}: {expected}") from None

    # JSON carries the label ("drain"), everywhere: REST, the store's bodies, --json output, MCP. Input also
    # takes the integer (0..4), so records stored before labels were the JSON form still read.
    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_plain_validator_function(
            cls.parse,
            serialization=core_schema.plain_serializer_function_ser_schema(
                lambda level: level.label, when_used="json"
            ),
        )

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: CoreSchema, handler: GetJsonSchemaHandler) -> dict[str, Any]:
        return {
            "title": "FaultLevel",
            "type": "string",
            "enum": [m.label for m in cls],
            "description": "healthy < observe < degraded < drain < isolate (input also takes 0..4)",
        }


# --------------------------------------------------------------------------- base


class Record(BaseModel):
    """Base of every record: strict about unknown fields so typos are caught at the edge."""

    model_config = ConfigDict(extra="forbid", frozen=False, validate_assignment=False)

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str | bytes) -> Any:
        try:
            return cls.model_validate_json(text)
        except ValidationError as err:
            raise VigilInputError(f"bad {cls.__name__}: {describe_validation_error(err)}") from None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Any:
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            raise VigilInputError(f"bad {cls.__name__}: {describe_validation_error(err)}") from None


def describe_validation_error(err: ValidationError) -> str:
    """One line naming each bad field and what was expected."""
    parts = []
    for item in err.errors()[:5]:
        where = ".".join(str(p) for p in item["loc"]) or "<record>"
        parts.append(f"field {where!r}: {item['msg']}")
    more = len(err.errors()) - 5
    if more > 0:
        parts.append(f"and {more} more")
    return "; ".join(parts)


# --------------------------------------------------------------------------- observations


class Sample(Record):
    """One metric value: dcgm-exporter names for GPUs (DCGM_FI_DEV_GPU_TEMP, ...), vigil_* otherwise."""

    ts: float
    entity: EntityId
    metric: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z_:][A-Za-z0-9_:]*$")
    value: float


class Event(Record):
    """Something that happened: an Xid, a link flap, a Kubernetes event, an alert, a job restart."""

    ts: float
    entity: EntityId
    kind: str = Field(min_length=1, max_length=100)
    source: str = Field(default="unknown", max_length=100)
    message: str = Field(default="", max_length=8192)
    level: FaultLevel = FaultLevel.OBSERVE
    attrs: dict[str, Any] = Field(default_factory=dict)


class LogRecord(Record):
    """One log line of a rank, a node's kernel log or a service."""

    ts: float | None = None
    entity: EntityId
    source: str = Field(default="log", max_length=100)
    line: str = Field(max_length=1 << 20)
    lineno: int | None = None


class Evidence(Record):
    """One fact that supports an anomaly, incident or cause; ``ref`` is stable so an LLM can cite it."""

    ref: str = Field(default_factory=lambda: new_id("ev"))
    kind: Literal["metric", "event", "log", "detector", "hang", "topology", "peer", "precheck"]
    entity: EntityId
    ts: float
    summary: str = Field(max_length=4096)
    metric: str | None = None
    value: float | None = None
    attrs: dict[str, Any] = Field(default_factory=dict)


class Anomaly(Record):
    """A detector's finding about one entity over a time span."""

    id: str = Field(default_factory=lambda: new_id("an"))
    entity: EntityId
    start: float
    end: float
    detector: str
    fault_type: str
    level: FaultLevel
    score: float = 1.0
    evidence: list[Evidence] = Field(default_factory=list)


def anomaly_id_for(anomaly: Anomaly) -> str:
    """An anomaly's id from its detector, entity, fault and start (to the millisecond): a detector opens one
    anomaly per entity and fault at a time, so two anomalies with the same id are one finding seen twice."""
    return stable_id("an", anomaly.detector, anomaly.entity, anomaly.fault_type, f"{anomaly.start:.3f}")


class IncidentStatus(enum.StrEnum):
    OPEN = "open"
    ACKNOWLEDGED = "acknowledged"
    RESOLVED = "resolved"


class Incident(Record):
    """Anomalies grouped by entity, topology and time: what a person is paged about."""

    id: str = Field(default_factory=lambda: new_id("inc"), pattern=RECORD_ID_PATTERN)
    title: str
    scope: EntityId
    entities: list[EntityId]
    start: float
    end: float
    level: FaultLevel
    fault_types: list[str]
    status: IncidentStatus = IncidentStatus.OPEN
    anomalies: list[str] = Field(default_factory=list)
    evidence: list[Evidence] = Field(default_factory=list)


# --------------------------------------------------------------------------- diagnosis


class Cause(Record):
    """A candidate root cause: an entity and a fault type, with the evidence that moved its score."""

    entity: EntityId
    fault_type: str
    score: float
    explanation: str = ""
    evidence_refs: list[str] = Field(default_factory=list)


class ActionKind(enum.StrEnum):
    """The remediation whitelist: nothing outside it is ever proposed or executed."""

    ALERT = "alert"
    CORDON = "cordon"
    UNCORDON = "uncordon"
    DRAIN = "drain"
    RESET_GPU = "reset_gpu"
    REBOOT = "reboot"
    RESTART_JOB = "restart_job"
    MIGRATE_JOB = "migrate_job"
    VENDOR_TICKET = "vendor_ticket"
    RUN_DIAGNOSTICS = "run_diagnostics"
    COLLECT_LOGS = "collect_logs"
    # tidal scheduling: tell a preemptible job to checkpoint, take its capacity back, bound a tier's share
    PREEMPT_NOTICE = "preempt_notice"
    PREEMPT = "preempt"
    SET_QUOTA = "set_quota"
    DELETE_CHECKPOINT = "delete_checkpoint"  # a step directory a clean-up proposal named (vigil checkpoint clean)

    @property
    def destructive(self) -> bool:
        """Takes capacity or work away (the two-person rule applies); the rest only tell or gather."""
        return self not in (ActionKind.ALERT, ActionKind.VENDOR_TICKET, ActionKind.RUN_DIAGNOSTICS,
                            ActionKind.COLLECT_LOGS)


class RemediationStep(Record):
    action: ActionKind
    target: EntityId
    command: str = Field(default="", max_length=1000)
    risk: Literal["low", "medium", "high"] = "low"
    reason: str = ""


class IncidentMemory(Record):
    """A resolved incident remembered: what it was, its root cause, what was done and how it ended. Written
    once when the incident resolves; what the similar-incident index is built from."""

    incident_id: str
    title: str
    scope: EntityId
    fault_types: list[str]
    level: FaultLevel
    start: float
    end: float
    resolved_after_s: float = Field(ge=0.0)
    root_cause_entity: str = ""
    root_cause_fault: str = ""
    # "diagnosis" when a stored diagnosis named the root cause, "incident" when it is the incident's own scope
    root_cause_from: Literal["diagnosis", "incident"] = "incident"
    summary: str = ""
    actions: list[str] = Field(default_factory=list)
    outcome: str = ""
    evidence: list[str] = Field(default_factory=list)
    remembered_at: float = 0.0


class SimilarIncident(Record):
    """A past incident like the current one and what fixed it, with the index's similarity (cosine, 0..1)."""

    incident_id: str
    score: float = Field(ge=0.0, le=1.0)
    title: str
    root_cause_fault: str = ""
    root_cause_entity: str = ""
    actions: list[str] = Field(default_factory=list)
    outcome: str = ""
    resolved_after_s: float = 0.0


class Diagnosis(Record):
    incident_id: str
    summary: str
    root_cause: Cause | None
    confidence: float = Field(ge=0.0, le=1.0)
    causes: list[Cause] = Field(default_factory=list)
    evidence_refs: list[str] = Field(default_factory=list)
    plan: list[RemediationStep] = Field(default_factory=list)
    generated_by: str = "deterministic"
    similar: list[SimilarIncident] = Field(default_factory=list)


class ActionStatus(enum.StrEnum):
    PROPOSED = "proposed"
    APPROVED = "approved"
    EXECUTED = "executed"
    SKIPPED = "skipped"
    FAILED = "failed"
    REFUSED = "refused"


class Action(Record):
    """One remediation action and its audit trail: who, why, what, result."""

    id: str = Field(default_factory=lambda: new_id("act"), pattern=RECORD_ID_PATTERN)
    ts: float
    kind: ActionKind
    target: EntityId
    incident_id: str | None = None
    reason: str = ""
    requested_by: str = "vigil"
    dry_run: bool = True
    status: ActionStatus = ActionStatus.PROPOSED
    result: str = ""
    params: dict[str, Any] = Field(default_factory=dict)


# --------------------------------------------------------------------------- topology


class Gpu(Record):
    node: str
    index: int = Field(ge=0)
    uuid: str = ""
    model: str = ""
    pci_bus_id: str = ""
    # Indices of this node's GPUs reached over NVLink, directly or through the node's NVSwitches.
    nvlink_peers: list[int] = Field(default_factory=list)

    @property
    def id(self) -> str:
        return gpu_id(self.node, self.index)


class Nic(Record):
    node: str
    name: str
    switch: str = ""
    speed_gbps: float = 400.0
    pci_bus_id: str = ""

    @property
    def id(self) -> str:
        return nic_id(self.node, self.name)


class Node(Record):
    name: str
    rack: str = ""
    switch: str = ""
    gpus: list[Gpu] = Field(default_factory=list)
    nics: list[Nic] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)

    @property
    def id(self) -> str:
        return node_id(self.name)


class Switch(Record):
    name: str
    tier: Literal["leaf", "spine"] = "leaf"
    uplinks: list[str] = Field(default_factory=list)

    @property
    def id(self) -> str:
        return switch_id(self.name)


class Job(Record):
    """A training job; ``placement[r]`` is the gpu id that rank r runs on (the node id for a rank that uses
    no GPU, e.g. a CPU gloo job)."""

    id: str
    name: str = ""
    placement: list[str] = Field(default_factory=list)
    start: float = 0.0
    source: str = Field(default="", description="who registered it (slurm, kubernetes, launch; empty: a file)")

    @property
    def entity(self) -> str:
        return job_id(self.id)

    @property
    def world_size(self) -> int:
        return len(self.placement)


class Topology(Record):
    cluster: str = "vigil"
    nodes: list[Node] = Field(default_factory=list)
    switches: list[Switch] = Field(default_factory=list)
    jobs: list[Job] = Field(default_factory=list)

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def nodes_under(self, switch: str) -> list[Node]:
        return [n for n in self.nodes if n.switch == switch]

    def gpu_count(self) -> int:
        return sum(len(n.gpus) for n in self.nodes)


class GroundTruthFault(Record):
    """An injected fault (simulator) or a labelled one (data sets): what detection is scored against."""

    id: str = Field(default_factory=lambda: new_id("gt"))
    fault_type: str
    entity: EntityId
    start: float
    end: float
    visible_to_rules: bool = True
    attrs: dict[str, Any] = Field(default_factory=dict)


# --------------------------------------------------------------------------- hang diagnosis of a job run

HangVerdict = Literal["ok", "hang", "crash", "mismatch", "slow"]
HangKind = Literal["not_enqueued", "stuck_in_collective", "signature_mismatch", "process_dead", "p2p"]
# One exit status per verdict, the same from `vigil launch script` and `vigil diagnose run`.
HANG_EXIT_CODES: dict[str, int] = {"ok": 0, "slow": 0, "crash": 3, "hang": 4, "mismatch": 5}


class StackFork(BaseModel):
    """Where the odd ranks' stack leaves the majority's, in one thread; ``frame`` is ``name (file:line)``."""

    name: str
    filename: str = ""
    line: int | None = None
    thread: str = "MainThread"
    parent: str | None = None
    frame: str
    majority_frame: str | None = None
    ranks: list[int] = Field(default_factory=list)
    majority_ranks: list[int] = Field(default_factory=list)


class StackClass(BaseModel):
    """Ranks whose stacks are identical (an equivalence class), with the innermost main-thread frame."""

    ranks: list[int]
    main_top: str


class RankStatus(BaseModel):
    rank: int
    state: str
    op: str | None = None
    heartbeat_age_s: float | None = None
    exit_code: int | None = None
    top_frame: str | None = None
    median_step_s: float | None = None
    mean_comm_wait_s: float | None = None


class HangDiagnosis(BaseModel):
    """What ``vigil launch script`` writes to diagnosis.json, ``vigil diagnose run`` prints and the dashboard's
    hang view reads: one type, so no reader guesses keys. Unknown keys from other versions are ignored."""

    verdict: HangVerdict
    culprit_ranks: list[int] = Field(default_factory=list)
    hang_kind: HangKind | None = None
    culprit_links: list[list[int]] = Field(default_factory=list, description="[src, dst] rank pairs")
    fork_point: StackFork | None = None
    root_error: str | None = None
    detected_after_s: float | None = None
    summary: str = ""
    job: str = "local"
    world_size: int = 0
    source: Literal["probe", "flight_recorder"] = "probe"
    stack_source: str = "none"
    ranks: list[RankStatus] = Field(default_factory=list)
    stack_classes: list[StackClass] = Field(default_factory=list)
    stacks: dict[int, list[str]] = Field(default_factory=dict, description="main thread, outermost first")
    evidence: list[Evidence] = Field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return HANG_EXIT_CODES[self.verdict]


# --------------------------------------------------------------------------- what `vigil launch` reports


class RankPlacement(BaseModel):
    """Where one rank runs: its node (as the node's agent names it) and GPU index (None: no GPU)."""

    model_config = ConfigDict(extra="forbid")

    rank: int = Field(ge=0)
    node: str = Field(min_length=1, max_length=200, pattern=rf"^{_NAME}$")
    gpu: int | None = Field(default=None, ge=0)
    pid: int | None = None


class RankState(BaseModel):
    """A rank's process as the launch supervisor sees it: running, or exited with its status (a negative
    status is the signal that killed it, as Python's ``Popen.returncode`` reports it)."""

    model_config = ConfigDict(extra="forbid")

    rank: int = Field(ge=0)
    exit_code: int | None = None


class StepTelemetry(BaseModel):
    """One look at the job's training progress: steps done and the latest step time (from the probe), loss,
    gradient norm and tokens/s (from the ranks' heartbeat lines, when the script writes them). Non-finite
    values travel as the strings "NaN" / "Infinity": a NaN loss is news, not a bad record."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")

    ts: float
    steps: int = Field(ge=0)
    step_time_s: float | None = None
    loss: float | None = None
    grad_norm: float | None = None
    tokens_per_s: float | None = None
    checkpointing: bool = False


class LaunchVerdict(BaseModel):
    """The supervisor's verdict on the job (the headline of its HangDiagnosis)."""

    model_config = ConfigDict(extra="forbid")

    verdict: HangVerdict
    culprit_ranks: list[int] = Field(default_factory=list)
    hang_kind: HangKind | None = None
    root_error: str | None = Field(default=None, max_length=4096)
    summary: str = Field(default="", max_length=4096)
    exit_codes: dict[int, int] = Field(default_factory=dict, description="each exited rank's status")


class LaunchReport(BaseModel):
    """What one `vigil launch` tells the server: its ranks' placement and state, step telemetry since its last
    report, the events its ranks' log lines made since then (``rank_log`` events on the job's ranks, decoded by
    ``vigil.sources.collect.ranklog``) and the verdict once the job ended. Every part is optional, so a report is
    sent when any changed."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")

    job: str = Field(min_length=1, max_length=200, pattern=rf"^{_NAME}$")
    ts: float
    world_size: int = Field(ge=1)
    placement: list[RankPlacement] = Field(default_factory=list, max_length=100_000)
    ranks: list[RankState] = Field(default_factory=list, max_length=100_000)
    steps: list[StepTelemetry] = Field(default_factory=list, max_length=10_000)
    logs: list[Event] = Field(default_factory=list, max_length=10_000)
    verdict: LaunchVerdict | None = None
