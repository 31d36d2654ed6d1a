"""The knowledge graph: cluster topology plus fault knowledge, in one networkx graph.

Topology nodes are entity ids (``node/n01``, ``gpu/n01/3``, ``switch/leaf0`` ...) plus NVLink domains
(``nvlink/<domain>``); knowledge nodes are ``fault:<type>``, ``symptom:<id>``, ``cause:<text>`` and
``remedy:<action>``. Edges point in the direction a fault spreads (``switch -> nic -> node -> gpu -> rank
-> job``) and carry ``rel`` (the structural relation) and ``impact`` (how strongly a fault at the source shows
at the target). Knowledge edges are ``symptom -indicates-> fault`` (weight = likelihood), ``fault -caused_by->
cause`` and ``fault -remedied_by-> remedy``.

Topology comes from the simulator's :class:`vigil.model.Topology`, from Kubernetes node labels
(:func:`topology_from_node_labels`) and from ``nvidia-smi topo -m`` / NVML (:func:`parse_nvidia_smi_topo`,
:func:`read_nvml_topology`).
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import numpy as np
from scipy import sparse

from vigil.diagnose.kb import KnowledgeBase, default_kb
from vigil.model import (
    Gpu,
    Nic,
    Node,
    Switch,
    Topology,
    VigilInputError,
    gpu_id,
    nic_id,
    rack_id,
    rank_id,
    switch_id,
)
from vigil.sources.collect.gpu_topology import NvTopology, nvml_topology, parse_nvidia_smi_topo, read_nvml_topology
from vigil.sources.collect.kube_client import kube_api_client

# How strongly a fault at the source entity shows at the target, per structural relation.
IMPACT = {
    "uplink": 0.8,  # spine -> leaf
    "cabled": 0.9,  # leaf switch -> nic
    "nic_of": 0.8,  # nic -> node
    "in_rack": 0.6,  # rack -> node
    "hosts_gpu": 0.9,  # node -> gpu
    "hosts_nic": 0.9,  # node -> nic
    "runs": 0.95,  # gpu -> rank
    "uses": 0.8,  # rank -> gpu (a rank's own fault, e.g. OOM, shows in its GPU's metrics)
    "rank_of": 0.9,  # rank -> job
    "nvlink": 0.4,  # gpu -> nvlink domain -> gpu
}
# A device's fault shows at its host (SIBLING_UP), a host's at its devices (SIBLING_DOWN); a path that goes up
# and straight down again reaches a sibling device, which the device's fault does not touch.
SIBLING_UP = frozenset({"nic_of"})
SIBLING_DOWN = frozenset({"hosts_nic"})
# A rank's fault stalls every collective of its job: symptoms on its peers are explained this strongly.
PEER_IMPACT = 0.5


@dataclass
class KnowledgeGraph:
    """Topology and fault knowledge; build with :meth:`build`."""

    graph: nx.DiGraph
    topology: Topology
    kb: KnowledgeBase
    job_ranks: dict[str, list[str]] = field(default_factory=dict)
    rank_job: dict[str, str] = field(default_factory=dict)
    _index: dict[str, int] = field(default_factory=dict, repr=False)
    _names: list[str] = field(default_factory=list, repr=False)
    _walk: sparse.csr_matrix | None = field(default=None, repr=False)
    _behind: dict[str, set[str]] = field(default_factory=dict, repr=False)
    _impact_preds: dict[str, list[tuple[str, float, str]]] | None = field(default=None, repr=False)
    _reach: dict[tuple[str, int], dict[str, float]] = field(default_factory=dict, repr=False)
    _hosted: dict[str, list[str]] | None = field(default=None, repr=False)

    # ------------------------------------------------------------------ building

    @classmethod
    def build(cls, topology: Topology, kb: KnowledgeBase | None = None,
              nvlink: Mapping[str, NvTopology] | None = None) -> KnowledgeGraph:
        """Graph of ``topology``; ``nvlink`` maps node names to their ``nvidia-smi topo -m`` reading."""
        kb = kb or default_kb()
        graph = nx.DiGraph()
        cluster = f"cluster/{topology.cluster}"
        graph.add_node(cluster, kind="cluster")
        for switch in topology.switches:
            graph.add_node(switch.id, kind="switch", tier=switch.tier)
        for switch in topology.switches:
            for uplink in switch.uplinks:
                _edge(graph, switch_id(uplink), switch.id, "uplink", kind="switch")
        for node in topology.nodes:
            _add_node(graph, node)
        kg = cls(graph, topology, kb)
        for job in topology.jobs:
            ranks = []
            graph.add_node(job.entity, kind="job")
            for rank, gpu in enumerate(job.placement):
                rid = rank_id(job.id, rank)
                ranks.append(rid)
                kg.rank_job[rid] = job.entity
                graph.add_node(rid, kind="rank", job=job.entity, rank=rank)
                if gpu in graph:
                    _edge(graph, gpu, rid, "runs")
                    _edge(graph, rid, gpu, "uses")
                _edge(graph, rid, job.entity, "rank_of")
            kg.job_ranks[job.entity] = ranks
        for name, reading in (nvlink or {}).items():
            kg.add_nvlink(name, reading)
        kg._add_knowledge()
        return kg

    def add_nvlink(self, node_name: str, reading: NvTopology) -> None:
        """NVLink domains and GPU <-> NIC affinity of one node from its ``nvidia-smi topo -m`` reading."""
        for domain, members in reading.nvlink_domains().items():
            dom = f"nvlink/{node_name}-{domain}"
            self.graph.add_node(dom, kind="nvlink")
            for index in members:
                gpu = gpu_id(node_name, index)
                if gpu in self.graph:
                    _edge(self.graph, gpu, dom, "nvlink")
                    _edge(self.graph, dom, gpu, "nvlink")
        for gpu_index, nic_name in reading.nearest_nics().items():
            gpu, nic = gpu_id(node_name, gpu_index), nic_id(node_name, nic_name)
            if gpu in self.graph and nic in self.graph:
                self.graph.add_edge(nic, gpu, rel="rail", impact=0.9)
        self._walk, self._impact_preds = None, None
        self._reach.clear()

    def _add_knowledge(self) -> None:
        graph = self.graph
        for fault in self.kb.faults.values():
            fid = f"fault:{fault.name}"
            graph.add_node(fid, kind="fault", level=fault.level.label, title=fault.title)
            for kind in fault.entity_kinds:
                graph.add_edge(f"kind:{kind}", fid, rel="can_have")
            for symptom, likelihood in fault.symptoms.items():
                graph.add_node(f"symptom:{symptom}", kind="symptom")
                graph.add_edge(f"symptom:{symptom}", fid, rel="indicates", weight=likelihood)
            for cause in fault.causes:
                graph.add_node(f"cause:{cause}", kind="cause")
                graph.add_edge(fid, f"cause:{cause}", rel="caused_by")
            for remedy in fault.remedies:
                graph.add_node(f"remedy:{remedy.action.value}", kind="remedy")
                graph.add_edge(fid, f"remedy:{remedy.action.value}", rel="remedied_by", on=remedy.on,
                               risk=remedy.risk)

    # ------------------------------------------------------------------ queries

    def kind(self, entity: str) -> str:
        return str(self.graph.nodes[entity].get("kind", "")) if entity in self.graph else ""

    def __contains__(self, entity: object) -> bool:
        return entity in self.graph

    def causes_of(self, entity: str, max_depth: int = 5) -> dict[str, float]:
        """Entities whose fault can show at ``entity``, with the strongest impact along any path (incl. itself)."""
        cached = self._reach.get((entity, max_depth))
        if cached is not None:
            return cached
        preds = self._predecessors()
        reach = {entity: 1.0}
        frontier = deque([(entity, 1.0, 0, "")])
        while frontier:
            current, strength, depth, came_by = frontier.popleft()
            if depth >= max_depth:
                continue
            for source, impact, rel in preds.get(current, ()):
                # up to the host and down to a sibling device is no causal path: one NIC's fault does not
                # take down the NIC beside it
                if came_by in SIBLING_DOWN and rel in SIBLING_UP:
                    continue
                value = strength * impact
                if value > reach.get(source, 0.0):
                    reach[source] = value
                    frontier.append((source, value, depth + 1, rel))
        if len(self._reach) < 200_000:
            self._reach[(entity, max_depth)] = reach
        return reach

    def _predecessors(self) -> dict[str, list[tuple[str, float, str]]]:
        """Impact predecessors per entity as plain lists: the reverse walk's hot loop avoids graph views."""
        if self._impact_preds is None:
            preds: dict[str, list[tuple[str, float, str]]] = {}
            for source, target, data in self.graph.edges(data=True):
                if "impact" in data and self.graph.nodes[source].get("kind") != "nvlink":
                    preds.setdefault(target, []).append((source, float(data["impact"]), str(data.get("rel", ""))))
            self._impact_preds = preds
        return self._impact_preds

    def prepare(self) -> KnowledgeGraph:
        """Build the per-topology tables (walk matrix, predecessor lists) now instead of on first use."""
        self._ensure_walk()
        self._predecessors()
        return self

    def node_of(self, entity: str) -> str | None:
        kind = self.kind(entity)
        if kind == "node":
            return entity
        if kind in ("gpu", "nic"):
            return "node/" + entity.split("/")[1]
        if kind == "rank":
            gpu = self.gpu_of_rank(entity)
            return self.node_of(gpu) if gpu else None
        return None

    def hosted(self, node: str) -> list[str]:
        """The GPUs and NICs whose ``node_of`` is ``node`` (an index built on first use)."""
        if self._hosted is None:
            hosted: dict[str, list[str]] = {}
            for entity, data in self.graph.nodes(data=True):
                if data.get("kind") in ("gpu", "nic"):
                    host = self.node_of(entity)
                    if host:
                        hosted.setdefault(host, []).append(entity)
            self._hosted = hosted
        return self._hosted.get(node, [])

    def gpu_of_rank(self, rank: str) -> str | None:
        for source in self.graph.predecessors(rank):
            if self.graph.nodes[source].get("kind") == "gpu":
                return str(source)
        return None

    def children(self, entity: str) -> list[str]:
        """Entities one impact step below (a switch's NICs, a node's GPUs and NICs)."""
        return [t for t in self.graph.successors(entity) if "impact" in self.graph.edges[entity, t]]

    def nodes_behind(self, switch: str) -> set[str]:
        """Hosts cabled to a switch (through any of their NICs)."""
        cached = self._behind.get(switch)
        if cached is not None:
            return cached
        hosts: set[str] = set()
        for nic in self.graph.successors(switch):
            if self.kind(nic) == "nic":
                host = self.node_of(nic)
                if host:
                    hosts.add(host)
            elif self.kind(nic) == "switch":
                hosts |= self.nodes_behind(nic)
        self._behind[switch] = hosts
        return hosts

    def personalized_pagerank(self, seeds: Mapping[str, float], alpha: float = 0.85, iterations: int = 40,
                              among: Iterable[str] | None = None) -> dict[str, float]:
        """PageRank over the undirected topology restarted at ``seeds`` (weights); the non-zero scores, of the
        ``among`` entities only when given."""
        self._ensure_walk()
        assert self._walk is not None
        restart = np.zeros(len(self._names))
        for entity, weight in seeds.items():
            idx = self._index.get(entity)
            if idx is not None and weight > 0:
                restart[idx] += weight
        total = restart.sum()
        if total <= 0:
            return {}
        restart /= total
        rank = restart.copy()
        for _ in range(iterations):
            rank = alpha * (self._walk @ rank) + (1 - alpha) * restart
        if among is not None:
            wanted = [(e, self._index[e]) for e in among if e in self._index]
            return {e: float(rank[i]) for e, i in wanted if rank[i] > 1e-12}
        nonzero = np.nonzero(rank > 1e-12)[0]
        return {self._names[i]: float(rank[i]) for i in nonzero}

    def _ensure_walk(self) -> None:
        """Column-stochastic transition matrix of the topology part, built once per graph."""
        if self._walk is not None:
            return
        names = [n for n, d in self.graph.nodes(data=True) if d.get("kind") in _TOPOLOGY_KINDS]
        index = {n: i for i, n in enumerate(names)}
        rows, cols = [], []
        for u, v, data in self.graph.edges(data=True):
            if "impact" in data and u in index and v in index:
                rows += [index[v], index[u]]
                cols += [index[u], index[v]]
        adjacency = sparse.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(names), len(names)))
        degree = np.asarray(adjacency.sum(axis=0)).ravel()
        degree[degree == 0] = 1.0
        self._walk = (adjacency @ sparse.diags(1.0 / degree)).tocsr()
        self._names, self._index = names, index

    def incident_subgraph(self, entities: Iterable[str], faults: Iterable[str] = (), hops: int = 1,
                          max_nodes: int = 400) -> nx.DiGraph:
        """The part of the graph an incident touches: its entities, their neighbours, the candidate faults'
        knowledge. Bounded by ``max_nodes`` so a prompt built from it stays small."""
        keep: set[str] = set()
        frontier = [e for e in entities if e in self.graph]
        keep.update(frontier)
        for _ in range(hops):
            nxt = []
            for entity in frontier:
                for other in list(self.graph.predecessors(entity)) + list(self.graph.successors(entity)):
                    if self.graph.nodes[other].get("kind") in _TOPOLOGY_KINDS and other not in keep:
                        if len(keep) >= max_nodes:
                            break
                        keep.add(other)
                        nxt.append(other)
            frontier = nxt
        for fault in faults:
            fid = f"fault:{fault}"
            if fid in self.graph:
                keep.add(fid)
                keep.update(t for t in self.graph.successors(fid))
        return self.graph.subgraph(keep).copy()

    def stats(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for _, data in self.graph.nodes(data=True):
            kind = str(data.get("kind", "other"))
            counts[kind] = counts.get(kind, 0) + 1
        counts["edges"] = self.graph.number_of_edges()
        return counts


_TOPOLOGY_KINDS = frozenset({"cluster", "rack", "switch", "node", "gpu", "nic", "job", "rank", "nvlink"})


def _edge(graph: nx.DiGraph, source: str, target: str, rel: str, kind: str | None = None) -> None:
    if kind and source not in graph:
        graph.add_node(source, kind=kind)
    graph.add_edge(source, target, rel=rel, impact=IMPACT[rel])


def _add_node(graph: nx.DiGraph, node: Node) -> None:
    graph.add_node(node.id, kind="node", labels=dict(node.labels))
    if node.rack:
        _edge(graph, rack_id(node.rack), node.id, "in_rack", kind="rack")
    # A multi-node NVLink domain (GB200 NVL72 clique, Topograph accelerator label) spans hosts.
    domain = node.labels.get("vigil.nvlink_domain")
    for gpu in node.gpus:
        graph.add_node(gpu.id, kind="gpu", model=gpu.model, pci=gpu.pci_bus_id.lower())
        _edge(graph, node.id, gpu.id, "hosts_gpu")
        if domain:
            dom = f"nvlink/{_safe_name(domain)}"
            graph.add_node(dom, kind="nvlink")
            _edge(graph, gpu.id, dom, "nvlink")
            _edge(graph, dom, gpu.id, "nvlink")
    for nic in node.nics:
        graph.add_node(nic.id, kind="nic", speed_gbps=nic.speed_gbps)
        _edge(graph, node.id, nic.id, "hosts_nic")
        _edge(graph, nic.id, node.id, "nic_of")
        leaf = nic.switch or node.switch
        if leaf:
            _edge(graph, switch_id(leaf), nic.id, "cabled", kind="switch")
    if node.switch and not node.nics:
        _edge(graph, switch_id(node.switch), node.id, "cabled", kind="switch")


# --------------------------------------------------------------------------- Kubernetes node labels

# Label keys, most specific first. GPU Feature Discovery (nvidia.com/*), the well-known Kubernetes labels,
# NVIDIA Topograph (network.topology.nvidia.com/* and its older topology.kubernetes.io/network-level-N),
# AWS EC2 instance topology (topology.k8s.aws/network-node-layer-N, layer 3 is nearest the host) and GKE.
LEAF_SWITCH_LABELS = (
    "topology.vigil.io/switch",
    "network.topology.nvidia.com/block",
    "network.topology.nvidia.com/leaf",
    "topology.kubernetes.io/network-level-1",
    "topology.k8s.aws/network-node-layer-3",
    "cloud.google.com/gce-topology-subblock",
)
SPINE_SWITCH_LABELS = (
    "topology.vigil.io/spine",
    "network.topology.nvidia.com/spine",
    "topology.kubernetes.io/network-level-2",
    "topology.k8s.aws/network-node-layer-2",
    "cloud.google.com/gce-topology-block",
)
RACK_LABELS = ("topology.vigil.io/rack", "topology.kubernetes.io/rack", "rack")
NVLINK_DOMAIN_LABELS = ("network.topology.nvidia.com/accelerator", "nvidia.com/gpu.clique")
_LABEL_SAFE = re.compile(r"[^A-Za-z0-9_.:\-]")


def _safe_name(value: str) -> str:
    """Label values may hold characters entity ids do not allow; keep them stable but safe."""
    cleaned = _LABEL_SAFE.sub("-", value.strip())
    return cleaned if cleaned and cleaned[0].isalnum() else f"x{cleaned}"


def _first(labels: Mapping[str, str], keys: Iterable[str]) -> str:
    for key in keys:
        value = labels.get(key)
        if value:
            return str(value)
    return ""


def topology_from_node_labels(nodes: Any, cluster: str = "k8s", nics_per_node: int = 0) -> Topology:
    """A Topology from Kubernetes nodes: a ``kubectl get nodes -o json`` NodeList, a list of its items, or
    a list of ``{"name": ..., "labels": {...}}``. GPUs come from ``nvidia.com/gpu.count`` (GPU Feature
    Discovery) or ``status.capacity["nvidia.com/gpu"]``; leaf/spine switches, racks and NVLink domains from
    the label keys above."""
    items = nodes.get("items") if isinstance(nodes, Mapping) else nodes
    if not isinstance(items, list):
        raise VigilInputError("Kubernetes nodes: expected a NodeList ({'items': [...]}) or a list of nodes")
    topo_nodes: list[Node] = []
    switches: dict[str, Switch] = {}
    for position, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise VigilInputError(f"Kubernetes nodes: item {position} is not a mapping")
        meta = item.get("metadata", item)
        name = meta.get("name")
        labels = meta.get("labels") or {}
        if not name or not isinstance(labels, Mapping):
            raise VigilInputError(f"Kubernetes nodes: item {position} has no metadata.name or labels mapping")
        labels = {str(k): str(v) for k, v in labels.items()}
        node_name = _safe_name(str(name))
        capacity = (item.get("status") or {}).get("capacity") or {}
        count_text = labels.get("nvidia.com/gpu.count") or str(capacity.get("nvidia.com/gpu", "0"))
        try:
            gpu_count = int(count_text)
        except ValueError:
            raise VigilInputError(
                f"Kubernetes node {name}: nvidia.com/gpu.count must be an integer, got {count_text!r}") from None
        product = labels.get("nvidia.com/gpu.product", "")
        leaf = _safe_name(_first(labels, LEAF_SWITCH_LABELS)) if _first(labels, LEAF_SWITCH_LABELS) else ""
        spine_raw = _first(labels, SPINE_SWITCH_LABELS)
        if leaf and leaf not in switches:
            switches[leaf] = Switch(name=leaf, tier="leaf")
        if spine_raw:
            spine = _safe_name(spine_raw)
            switches.setdefault(spine, Switch(name=spine, tier="spine"))
            if leaf and spine not in switches[leaf].uplinks:
                switches[leaf].uplinks.append(spine)
        rack = _first(labels, RACK_LABELS)
        domain = _first(labels, NVLINK_DOMAIN_LABELS)
        if domain:
            labels["vigil.nvlink_domain"] = domain
        topo_nodes.append(Node(
            name=node_name,
            rack=_safe_name(rack) if rack else "",
            switch=leaf,
            gpus=[Gpu(node=node_name, index=i, model=product) for i in range(gpu_count)],
            nics=[Nic(node=node_name, name=f"mlx5_{i}", switch=leaf) for i in range(nics_per_node)],
            labels=labels,
        ))
    return Topology(cluster=cluster, nodes=topo_nodes, switches=list(switches.values()))


def read_kubernetes_topology(cluster: str = "k8s") -> Topology:  # pragma: no cover - needs an API server
    """Read the live cluster's nodes through the Kubernetes API (in-cluster config, else kubeconfig)."""
    from kubernetes import client

    api_client = kube_api_client()
    node_list = client.CoreV1Api(api_client).list_node()
    return topology_from_node_labels(api_client.sanitize_for_serialization(node_list), cluster=cluster)


__all__ = [
    "IMPACT",
    "KnowledgeGraph",
    "NvTopology",
    "PEER_IMPACT",
    "nvml_topology",
    "parse_nvidia_smi_topo",
    "read_kubernetes_topology",
    "read_nvml_topology",
    "topology_from_node_labels",
]
