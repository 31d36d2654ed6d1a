"""Group anomalies into incidents: per node or job, over time, and across the topology.

- Anomalies of one node (its GPUs, NICs, the host) or of one job (its ranks) that follow each other within
  ``gap_s`` form one incident.
- A job's symptoms (stall, crash, throughput drop, straggler) that start while a hardware incident is open
  on one of the job's nodes are effects of that incident, not a second one.
- Link faults of the kinds a leaf switch failure shows (the fault catalogue's symptoms of a fault that hits
  every child of a switch: links down, flapping, NICs lost) on several nodes under one leaf switch within
  ``switch_window_s``, on at least ``switch_min_share`` of the links below it, become one incident scoped to
  the switch. A switch that fails takes its links down together; two cables of 32 failing a minute apart
  are two links' faults, and so are a NIC's own (a speed that negotiated low, a GID table error).
- A job's incident is scoped to one of its ranks once its evidence names that rank alone (a launch verdict's
  culprit, a straggler) and the job-wide symptoms are no worse, even when those symptoms opened it.
- Only anomalies at DEGRADED or worse open an incident; OBSERVE-level ones (an application Xid) join an
  incident already open on their node or stay as loose observations.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from vigil.knowledge.faults import fault_catalogue
from vigil.model import (
    Anomaly,
    FaultLevel,
    Incident,
    IncidentStatus,
    Topology,
    node_id,
    parse_entity,
    stable_id,
    switch_id,
)

NIC_FAULTS = frozenset({"link_down", "link_flap", "nic_lost", "nic_speed_low", "rnic_gid_error", "nic_symbol_errors"})
MAX_EVIDENCE = 50


def switch_link_faults() -> frozenset[str]:
    """The NIC faults a leaf switch's failure shows on its links: the anomaly symptoms the fault catalogue gives
    the faults that hit every child of a switch."""
    shown = {symptom.removeprefix("anomaly:") for fault in fault_catalogue().faults.values()
             if fault.spread == "children" and "switch" in fault.entity
             for symptom in fault.symptoms if symptom.startswith("anomaly:")}
    return NIC_FAULTS & shown


def incident_id_for(anchor: str, first: Anomaly) -> str:
    """An incident's id from its anchor and first anomaly: the same anomaly seen again after a restart
    lands in the same incident instead of a second one."""
    return stable_id("inc", anchor, first.id)


@dataclass
class _Group:
    anchor: str
    id: str
    anomalies: list[Anomaly] = field(default_factory=list)
    merged_into: str | None = None
    settled: bool = False

    @property
    def start(self) -> float:
        return min(a.start for a in self.anomalies)

    @property
    def end(self) -> float:
        return max(a.end for a in self.anomalies)

    @property
    def level(self) -> FaultLevel:
        return max(a.level for a in self.anomalies)

    def fault_types(self) -> set[str]:
        return {a.fault_type for a in self.anomalies}


class IncidentGrouper:
    def __init__(self, topology: Topology, gap_s: float = 600.0, switch_window_s: float = 120.0,
                 effect_window_s: float = 300.0, resolve_after_s: float = 900.0,
                 min_level: FaultLevel = FaultLevel.DEGRADED, switch_min_share: float = 0.5) -> None:
        self.topology = topology
        self.gap_s = gap_s
        self.switch_window_s = switch_window_s
        # A switch failure hits every link below it; half leaves room for nodes whose reports are late.
        self.switch_min_share = switch_min_share
        self.effect_window_s = effect_window_s
        self.resolve_after_s = resolve_after_s
        self.min_level = min_level
        self.switch_faults = switch_link_faults()
        self.groups: list[_Group] = []
        self.observations: list[Anomaly] = []
        self._open: dict[str, _Group] = {}
        self.set_topology(topology)

    def set_topology(self, topology: Topology) -> None:
        """Read placement and switches from a newer topology (a node registered, a job started); the
        incidents being grouped stay."""
        self.topology = topology
        self._switch_of = {n.id: n.switch for n in topology.nodes}
        # the links below each switch: its nodes' NICs, or the nodes themselves where no NIC is inventoried
        self._switch_links: dict[str, int] = defaultdict(int)
        for n in topology.nodes:
            self._switch_links[n.switch] += len(n.nics) or 1
        self._job_nodes: dict[str, set[str]] = {}
        self._node_of_gpu: dict[str, str] = {}
        for node in topology.nodes:
            for gpu in node.gpus:
                self._node_of_gpu[gpu.id] = node.id
        for job in topology.jobs:
            self._job_nodes[job.entity] = {self._node_of_gpu[g] for g in job.placement if g in self._node_of_gpu}
            for r, placed in enumerate(job.placement):
                self._node_of_gpu[f"{job.entity}/rank/{r}"] = self._node_of_gpu.get(placed, "")

    # ---------------------------------------------------------------- anchors

    def anchor(self, entity: str) -> str:
        kind, parts = parse_entity(entity)
        if kind in ("gpu", "nic", "node"):
            return node_id(parts[0])
        if kind == "rank":
            return f"job/{parts[0]}"
        return entity

    # ---------------------------------------------------------------- grouping

    def add(self, anomalies: list[Anomaly]) -> None:
        # hardware first, so a job symptom seen in the same tick finds its cause
        for anomaly in sorted(anomalies, key=lambda a: (a.start, self.anchor(a.entity).startswith("job/"))):
            self._add_one(anomaly)

    def _add_one(self, anomaly: Anomaly) -> None:
        anchor = self.anchor(anomaly.entity)
        group = self._open.get(anchor)
        if group is not None and anomaly.start - group.end > self.gap_s:
            group = None
        if anchor.startswith("job/"):
            cause = self._hardware_cause(anchor, anomaly)
            if cause is not None:
                cause.anomalies.append(anomaly)
                return
        if group is None:
            if anomaly.level < self.min_level:
                self.observations.append(anomaly)
                return
            group = _Group(anchor=anchor, id=incident_id_for(anchor, anomaly))
            self.groups.append(group)
            self._open[anchor] = group
            if not anchor.startswith("job/"):
                self._absorb_job_effects(group, anomaly)
        group.anomalies.append(anomaly)
        if anomaly.fault_type in self.switch_faults:
            self._switch_merge(group)

    def _hardware_cause(self, job: str, anomaly: Anomaly) -> _Group | None:
        """The open hardware incident on one of the job's nodes that this job symptom follows, if any."""
        rank_node = self._node_of_gpu.get(anomaly.entity)
        candidates = []
        for node in self._job_nodes.get(job, set()):
            group = self._live(node)
            if group is None or not group.start - 60 <= anomaly.start <= group.end + self.effect_window_s:
                continue
            # the nearest preceding hardware symptom is the likeliest cause
            recent = max((a.start for a in group.anomalies if a.start <= anomaly.start + 60), default=group.start)
            candidates.append((node != rank_node, -group.level, anomaly.start - recent, group))
        if not candidates:
            return None
        return min(candidates, key=lambda c: c[:3])[3]

    def _live(self, anchor: str) -> _Group | None:
        group = self._open.get(anchor)
        while group is not None and group.merged_into is not None:
            group = next((g for g in self.groups if g.id == group.merged_into), None)
        return group

    def _absorb_job_effects(self, group: _Group, anomaly: Anomaly) -> None:
        """A hardware incident opening just after its job's symptoms takes those symptoms over."""
        for job, nodes in self._job_nodes.items():
            if group.anchor not in nodes:
                continue
            job_group = self._open.get(job)
            if job_group is None or job_group.merged_into or not (
                    anomaly.start - 60 <= job_group.start <= anomaly.start + 60):
                continue
            group.anomalies.extend(job_group.anomalies)
            job_group.merged_into = group.id
            del self._open[job]

    def _switch_merge(self, group: _Group) -> None:
        switch = self._switch_of.get(group.anchor)
        if not switch:
            return
        key = switch_id(switch)
        start = min(a.start for a in group.anomalies if a.fault_type in self.switch_faults)
        peers = [g for anchor, g in self._open.items()
                 if anchor.startswith("node/") and self._switch_of.get(anchor) == switch and g.merged_into is None
                 and any(a.fault_type in self.switch_faults and abs(a.start - start) <= self.switch_window_s
                         for a in g.anomalies)]
        existing = self._open.get(key)
        links = {a.entity if a.entity.startswith("nic/") else self.anchor(a.entity) for p in peers
                 for a in p.anomalies
                 if a.fault_type in self.switch_faults and abs(a.start - start) <= self.switch_window_s}
        if existing is not None and existing.end >= start - self.gap_s:
            target = existing
        elif len(peers) >= 2 and len(links) >= self.switch_min_share * self._switch_links[switch]:
            target = _Group(anchor=key, id=incident_id_for(key, min(
                (a for p in peers for a in p.anomalies if a.fault_type in self.switch_faults), key=lambda a: a.start)))
            self.groups.append(target)
            self._open[key] = target
        else:
            return
        for peer in peers:
            if peer is target:
                continue
            target.anomalies.extend(peer.anomalies)
            peer.merged_into = target.id
            self._open[peer.anchor] = target

    # ---------------------------------------------------------------- continuity

    def resume(self, incident: Incident, anomalies: Iterable[Anomaly]) -> None:
        """Take up an incident stored before a restart, so new anomalies join it instead of opening another."""
        anchor = incident.scope if incident.scope.startswith("switch/") else self.anchor(incident.scope)
        group = _Group(anchor=anchor, id=incident.id, anomalies=list(anomalies))
        if not group.anomalies:
            return
        self.groups.append(group)
        self._open[anchor] = group

    def settle(self, anchor: str) -> None:
        """The incident open on ``anchor`` is over now (a job that then finished normally), not after the
        quiet time; a later anomaly there opens a new one."""
        group = self._live(anchor)
        if group is not None and group.anchor == anchor:
            group.settled = True
            del self._open[anchor]

    def forget(self, incident_ids: set[str]) -> None:
        """Drop finished incidents (and those merged into them) from memory; the store keeps them."""
        self.groups = [g for g in self.groups if g.id not in incident_ids and g.merged_into not in incident_ids]
        kept = {id(g) for g in self.groups}
        self._open = {anchor: g for anchor, g in self._open.items() if id(g) in kept}

    # ---------------------------------------------------------------- output

    def incidents(self, now: float) -> list[Incident]:
        out = []
        for group in self.groups:
            if group.merged_into is not None or not group.anomalies:
                continue
            anomalies = sorted(group.anomalies, key=lambda a: (-a.level, a.start))
            entities = sorted({a.entity for a in group.anomalies})
            scope = group.anchor
            causes = [a for a in anomalies if a.level >= self.min_level and (
                self.anchor(a.entity) == group.anchor or group.anchor.startswith("switch/"))]
            hardware_entities = {a.entity for a in causes}
            if not group.anchor.startswith("switch/") and len(hardware_entities) == 1:
                scope = next(iter(hardware_entities))
            elif group.anchor.startswith("job/"):
                scope = _named_rank(group.anchor, causes) or scope
            fault_types: list[str] = []
            for a in anomalies:
                if a.fault_type not in fault_types:
                    fault_types.append(a.fault_type)
            head = next((a for a in causes if a.entity == scope), causes[0] if causes else anomalies[0])
            effects = sum(1 for a in group.anomalies if self.anchor(a.entity).startswith("job/"))
            if group.anchor.startswith("job/"):
                effects = 0
            title = f"{head.fault_type.replace('_', ' ')} on {scope}" + (
                f" (+{effects} effect{'s' if effects > 1 else ''} on jobs)" if effects else "")
            evidence = [ev for a in sorted(group.anomalies, key=lambda a: a.start) for ev in a.evidence][:MAX_EVIDENCE]
            quiet = group.settled or now - group.end > self.resolve_after_s
            status = IncidentStatus.RESOLVED if quiet else IncidentStatus.OPEN
            out.append(Incident(id=group.id, title=title, scope=scope, entities=entities, start=group.start,
                                end=group.end, level=group.level, fault_types=fault_types, status=status,
                                anomalies=[a.id for a in group.anomalies], evidence=evidence))
        return out


def _named_rank(job: str, causes: list[Anomaly]) -> str | None:
    """The one rank a job's incident comes down to: its rank-level evidence names that rank alone and the
    job-wide symptoms (a stall, a throughput drop, seen on the job's aggregate telemetry) are no worse than
    it. Those symptoms are often seen first - a job stops stepping before its supervisor has localized the
    hang - so the incident opened on the job narrows to the rank once the rank's evidence arrives."""
    ranks = {a.entity for a in causes if a.entity != job}
    if len(ranks) != 1:
        return None
    rank = next(iter(ranks))
    worst_rank = max(a.level for a in causes if a.entity == rank)
    worst_job = max((a.level for a in causes if a.entity == job), default=worst_rank)
    return rank if worst_rank >= worst_job else None
