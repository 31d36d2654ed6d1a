"""Score incidents against injected ground truth: precision, recall, localization, delay, per fault type.

An incident matches a fault when it covers the fault's entity (the entity itself, its node, its job for a
rank, the nodes below a switch, or a job running there) and overlaps the fault in time, from its precursor
(plus a minute of slack) to five minutes after its end. It localizes the fault when its scope is the
fault's entity, or the node / job that holds it (a GPU's fault scoped to its node, a rank's to its job);
``exact_localization`` counts only the incidents scoped to the fault's own entity, so a hang left on its
job shows there.
"""

from __future__ import annotations

from collections import defaultdict

from pydantic import BaseModel

from vigil.model import GroundTruthFault, Incident, Topology, node_id, parse_entity

PRE_SLACK_S = 60.0
POST_SLACK_S = 300.0


class FaultMatch(BaseModel):
    fault_id: str
    fault_type: str
    entity: str
    start: float
    visible_to_rules: bool
    incident_id: str | None = None
    incident_scope: str | None = None
    delay_s: float | None = None
    localized: bool = False
    exact: bool = False


class Score(BaseModel):
    faults_injected: int
    faults_visible: int
    faults_detected: int
    incidents: int
    true_incidents: int
    precision: float
    recall: float
    recall_all: float
    localization: float
    exact_localization: float
    mean_delay_s: float | None
    by_fault: dict[str, dict[str, float]]
    matches: list[FaultMatch]


class _Coverage:
    def __init__(self, topology: Topology) -> None:
        self.node_of: dict[str, str] = {}
        self.job_nodes: dict[str, set[str]] = {}
        self.switch_nodes: dict[str, set[str]] = defaultdict(set)
        for node in topology.nodes:
            self.switch_nodes[f"switch/{node.switch}"].add(node.id)
            for gpu in node.gpus:
                self.node_of[gpu.id] = node.id
            for nic in node.nics:
                self.node_of[nic.id] = node.id
        self.node_jobs: dict[str, set[str]] = defaultdict(set)
        for job in topology.jobs:
            for r, placed in enumerate(job.placement):
                self.node_of[f"{job.entity}/rank/{r}"] = self.node_of.get(placed, "")
                self.node_jobs[self.node_of.get(placed, "")].add(job.entity)

    def keys(self, entity: str, with_jobs: bool = False) -> set[str]:
        """The entities an incident may name for this one; ``with_jobs`` adds the jobs running on it (an
        incident about a job's symptom detects the fault without localizing it)."""
        kind, parts = parse_entity(entity)
        keys = {entity}
        if kind in ("gpu", "nic", "node"):
            keys.add(node_id(parts[0]))
            if with_jobs:
                keys |= self.node_jobs.get(node_id(parts[0]), set())
        elif kind == "rank":
            keys.add(f"job/{parts[0]}")
            if self.node_of.get(entity):
                keys.add(self.node_of[entity])
        elif kind == "switch":
            keys |= self.switch_nodes.get(entity, set())
            if with_jobs:
                keys |= set().union(*(self.node_jobs.get(n, set()) for n in self.switch_nodes.get(entity, set())))
        return keys


def score(incidents: list[Incident], truth: list[GroundTruthFault], topology: Topology) -> Score:
    cover = _Coverage(topology)
    inc_keys = {inc.id: set().union(*(cover.keys(e) for e in [inc.scope, *inc.entities])) for inc in incidents}

    def overlapping(fault: GroundTruthFault, keys: set[str]) -> list[Incident]:
        lo = fault.start - float(fault.attrs.get("precursor_s", 0.0)) - PRE_SLACK_S
        hi = fault.end + POST_SLACK_S
        return [inc for inc in incidents if inc_keys[inc.id] & keys and inc.start <= hi and inc.end >= lo]

    # First the incidents that name the fault's own entity; then, for faults still unmatched, incidents about
    # a job running there that no other fault explains (a symptom seen, the culprit not localized).
    exact = {fault.id: overlapping(fault, cover.keys(fault.entity)) for fault in truth}
    explained = {inc.id for found in exact.values() for inc in found}
    matched_incidents: set[str] = set()
    matches: list[FaultMatch] = []
    for fault in truth:
        found = exact[fault.id]
        if not found:
            found = [inc for inc in overlapping(fault, cover.keys(fault.entity, with_jobs=True))
                     if inc.id not in explained]
        match = FaultMatch(fault_id=fault.id, fault_type=fault.fault_type, entity=fault.entity, start=fault.start,
                           visible_to_rules=fault.visible_to_rules)
        if found:
            best = min(found, key=lambda inc: (inc.scope != fault.entity, abs(inc.start - fault.start)))
            matched_incidents.update(inc.id for inc in found)
            match.incident_id = best.id
            match.incident_scope = best.scope
            match.delay_s = round(best.start - fault.start, 1)
            match.localized = best.scope in cover.keys(fault.entity) and (
                best.scope == fault.entity or parse_entity(fault.entity)[0] in ("gpu", "nic", "rank"))
            match.exact = best.scope == fault.entity
        matches.append(match)
    visible = [m for m in matches if m.visible_to_rules]
    detected = [m for m in visible if m.incident_id]
    by_fault: dict[str, dict[str, float]] = {}
    for name in sorted({m.fault_type for m in matches}):
        group = [m for m in matches if m.fault_type == name]
        hits = [m for m in group if m.incident_id]
        by_fault[name] = {"injected": len(group), "detected": len(hits), "recall": len(hits) / len(group),
                          "visible_to_rules": float(group[0].visible_to_rules)}
    delays = [m.delay_s for m in detected if m.delay_s is not None]
    return Score(
        faults_injected=len(truth), faults_visible=len(visible), faults_detected=len(detected),
        incidents=len(incidents), true_incidents=len(matched_incidents),
        precision=len(matched_incidents) / len(incidents) if incidents else 1.0,
        recall=len(detected) / len(visible) if visible else 1.0,
        recall_all=sum(1 for m in matches if m.incident_id) / len(matches) if matches else 1.0,
        localization=sum(m.localized for m in detected) / len(detected) if detected else 1.0,
        exact_localization=sum(m.exact for m in detected) / len(detected) if detected else 1.0,
        mean_delay_s=round(sum(delays) / len(delays), 1) if delays else None,
        by_fault=by_fault, matches=matches,
    )
