"""Knowledge graph: topology from the simulator, Kubernetes node labels and nvidia-smi topo -m."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vigil.diagnose.kg import KnowledgeGraph, nvml_topology, parse_nvidia_smi_topo, topology_from_node_labels
from vigil.model import Gpu, Job, Nic, Node, Switch, Topology, VigilInputError
from vigil.sources.sim.cluster import build_topology

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "diagnose"


def small_topology() -> Topology:
    nodes = []
    for i in range(4):
        name = f"n{i}"
        leaf = "leaf0" if i < 2 else "leaf1"
        nodes.append(Node(name=name, rack=f"r{i // 2}", switch=leaf,
                          gpus=[Gpu(node=name, index=g) for g in range(2)],
                          nics=[Nic(node=name, name=f"mlx5_{g}", switch=leaf) for g in range(2)]))
    switches = [Switch(name="spine0", tier="spine"), Switch(name="leaf0", uplinks=["spine0"]),
                Switch(name="leaf1", uplinks=["spine0"])]
    job = Job(id="j1", placement=[g.id for n in nodes for g in n.gpus])
    return Topology(cluster="t", nodes=nodes, switches=switches, jobs=[job])


def test_topology_edges_follow_fault_propagation() -> None:
    kg = KnowledgeGraph.build(small_topology())
    assert kg.kind("gpu/n0/1") == "gpu" and kg.kind("job/j1/rank/3") == "rank"
    assert kg.graph.has_edge("switch/leaf0", "nic/n0/mlx5_0")
    assert kg.graph.has_edge("gpu/n1/1", "job/j1/rank/3")
    assert kg.gpu_of_rank("job/j1/rank/3") == "gpu/n1/1"
    assert kg.node_of("job/j1/rank/3") == "node/n1"
    assert kg.nodes_behind("switch/leaf1") == {"node/n2", "node/n3"}
    assert kg.nodes_behind("switch/spine0") == {f"node/n{i}" for i in range(4)}
    assert kg.job_ranks["job/j1"][0] == "job/j1/rank/0"


def test_causes_of_walks_up_the_impact_edges_with_decay() -> None:
    kg = KnowledgeGraph.build(small_topology())
    causes = kg.causes_of("job/j1/rank/5")
    assert causes["job/j1/rank/5"] == 1.0
    assert causes["gpu/n2/1"] > causes["node/n2"] > causes["switch/leaf1"] > 0
    assert "switch/leaf0" not in causes  # n2 is not cabled to leaf0
    assert "gpu/n0/0" not in causes  # another rank's GPU does not cause this rank's symptoms


def test_knowledge_nodes_link_symptoms_faults_causes_remedies() -> None:
    kg = KnowledgeGraph.build(small_topology())
    assert kg.graph.edges["symptom:xid:79", "fault:gpu_lost"]["weight"] == 1.0
    assert kg.graph.has_edge("fault:gpu_lost", "remedy:cordon")
    assert kg.graph.has_edge("kind:switch", "fault:switch_failure")
    sub = kg.incident_subgraph(["gpu/n0/1"], faults=["gpu_lost"])
    assert "node/n0" in sub and "fault:gpu_lost" in sub and "remedy:cordon" in sub
    assert "gpu/n3/0" not in sub


def test_pagerank_concentrates_on_the_shared_switch() -> None:
    kg = KnowledgeGraph.build(small_topology())
    seeds = {"nic/n2/mlx5_0": 1.0, "nic/n3/mlx5_1": 1.0}
    scores = kg.personalized_pagerank(seeds)
    assert scores["switch/leaf1"] > scores["switch/leaf0"]
    assert kg.personalized_pagerank({}) == {}


def test_simulator_topology_scales_to_ten_thousand_gpus() -> None:
    topo = build_topology(nodes=1250, gpus=8, nodes_per_switch=16, job_nodes=64)
    kg = KnowledgeGraph.build(topo)
    stats = kg.stats()
    assert stats["gpu"] == 10_000 and stats["rank"] == 10_000 and stats["nic"] == 10_000
    assert kg.nodes_behind("switch/leaf00") == {f"node/n{i:04d}" for i in range(16)}


def test_kubernetes_labels_from_gfd_topograph_eks_and_gb200() -> None:
    topo = topology_from_node_labels(json.loads((FIXTURES / "k8s_nodes.json").read_text()))
    by_name = {n.name: n for n in topo.nodes}
    dgx = by_name["dgx-a-01"]
    assert len(dgx.gpus) == 8 and dgx.gpus[0].model == "NVIDIA-H100-80GB-HBM3"
    assert dgx.switch == "leaf-07" and dgx.labels["vigil.nvlink_domain"] == "nvl-a"
    eks = by_name["ip-10-1-22-14.us-east-2.compute.internal"]
    assert eks.switch == "nn-9c8d7e6f5a4b30221" and len(eks.gpus) == 8  # from status.capacity
    gb = by_name["gb200-r03-t05"]
    assert gb.rack == "r03" and gb.switch == "r03-leaf" and len(gb.gpus) == 4
    assert by_name["cpu-infra-01"].gpus == []
    switches = {s.name: s for s in topo.switches}
    assert switches["leaf-07"].uplinks == ["spine-1"] and switches["spine-1"].tier == "spine"
    kg = KnowledgeGraph.build(topo)
    assert kg.graph.has_edge("gpu/dgx-a-01/0", "nvlink/nvl-a") and kg.graph.has_edge("nvlink/nvl-a", "gpu/dgx-a-02/7")
    assert kg.graph.has_edge("switch/spine-1", "switch/leaf-07")


def test_kubernetes_labels_bad_input_is_one_clear_error() -> None:
    with pytest.raises(VigilInputError, match="NodeList"):
        topology_from_node_labels("not nodes")
    with pytest.raises(VigilInputError, match="gpu.count must be an integer"):
        topology_from_node_labels([{"name": "a", "labels": {"nvidia.com/gpu.count": "eight"}}])
    with pytest.raises(VigilInputError, match="item 0"):
        topology_from_node_labels([{"labels": {}}])


def test_nvidia_smi_topo_hgx_h100() -> None:
    reading = parse_nvidia_smi_topo((FIXTURES / "nvidia_smi_topo_hgx_h100.txt").read_text())
    assert reading.gpus == list(range(8))
    assert reading.links[("GPU0", "GPU5")] == "NV18"
    assert reading.links[("GPU2", "NIC2")] == "PXB" and reading.links[("GPU2", "NIC6")] == "SYS"
    assert reading.nvlink_domains() == {0: list(range(8))}
    assert reading.nearest_nics() == {g: f"mlx5_{g}" for g in range(8)}
    assert reading.numa_affinity[6] == "1"
    kg = KnowledgeGraph.build(build_topology(nodes=4, gpus=8), nvlink={"n000": reading})
    assert kg.graph.has_edge("gpu/n000/3", "nvlink/n000-0")
    assert kg.graph.edges["nic/n000/mlx5_3", "gpu/n000/3"]["rel"] == "rail"


def test_nvidia_smi_topo_pcie_box_without_nvlink() -> None:
    reading = parse_nvidia_smi_topo((FIXTURES / "nvidia_smi_topo_pcie_4gpu.txt").read_text())
    assert reading.nvlink_domains() == {}
    assert reading.nearest_nics() == {0: "mlx5_0", 1: "mlx5_0"}  # GPUs 2, 3 reach the NIC only over SYS


def test_nvidia_smi_topo_rejects_garbage() -> None:
    with pytest.raises(VigilInputError, match="no header"):
        parse_nvidia_smi_topo("hello\nworld\n")
    with pytest.raises(VigilInputError, match="line 2"):
        parse_nvidia_smi_topo("\tGPU0\tGPU1\nGPU0\t X \tBOGUS\n")


def test_nvml_readings_give_the_same_matrix_as_nvidia_smi() -> None:
    # HGX H100 as NVML reports it: 18 active links per GPU, NVLink P2P between all pairs through NVSwitch,
    # PCIe common ancestor SYS (50) across the two CPU sockets, NODE (40) within one
    reading = parse_nvidia_smi_topo((FIXTURES / "nvidia_smi_topo_hgx_h100.txt").read_text())
    nvml = nvml_topology([18] * 8, [[a != b for b in range(8)] for a in range(8)],
                         [[0 if a == b else 40 if a // 4 == b // 4 else 50 for b in range(8)] for a in range(8)])
    assert nvml.nvlink_domains() == reading.nvlink_domains()
    gpu_pairs = {k: v for k, v in reading.links.items() if k[0].startswith("GPU") and k[1].startswith("GPU")}
    assert nvml.links == gpu_pairs
    pcie = nvml_topology([0] * 4, [[False] * 4] * 4, [[0, 10, 50, 50], [10, 0, 50, 50], [50, 50, 0, 10],
                                                       [50, 50, 10, 0]])
    assert pcie.nvlink_domains() == {} and pcie.links[("GPU0", "GPU1")] == "PIX"
    with pytest.raises(VigilInputError, match="same GPUs"):
        nvml_topology([18, 18], [[False, True]], [[0, 50], [50, 0]])
