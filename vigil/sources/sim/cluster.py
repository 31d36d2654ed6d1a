"""The simulated cluster's shape: nodes x GPUs, racks with one leaf switch each, spines, NICs, jobs."""

from __future__ import annotations

from vigil.model import Gpu, Job, Nic, Node, Switch, Topology

# PCI bus ids of the eight GPUs of a typical HGX H100 board, in nvidia-smi order.
HGX_PCI_BUS_IDS = [
    "0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0",
    "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0",
]
GPU_MODEL = "NVIDIA H100 80GB HBM3"


def nic_pci_bus_id(index: int) -> str:
    """The PCI address of a node's ``index``-th NIC (one ConnectX per GPU, on the bus after its GPU's switch)."""
    return f"0000:{0x19 + 0x10 * (index % 14):02x}:00.0"


def node_name(index: int, total: int) -> str:
    width = max(3, len(str(total - 1)))
    return f"n{index:0{width}d}"


def build_topology(
    nodes: int = 16,
    gpus: int = 8,
    nodes_per_switch: int = 4,
    leaves_per_spine: int = 32,
    job_nodes: int | None = None,
    cluster: str = "sim",
) -> Topology:
    """A cluster of ``nodes`` x ``gpus``: one rack and one leaf switch per ``nodes_per_switch`` nodes,
    one NIC per GPU (rail-style naming mlx5_<i>), every GPU of a node NVLink peer of the others (an HGX
    board's NVSwitches, as the agents' NVML inventory reports them), and jobs of ``job_nodes`` nodes each
    covering the cluster."""
    if nodes < 1 or gpus < 1 or nodes_per_switch < 1:
        raise ValueError("nodes, gpus and nodes_per_switch must be >= 1")
    leaves = (nodes + nodes_per_switch - 1) // nodes_per_switch
    spines = max(1, (leaves + leaves_per_spine - 1) // leaves_per_spine)
    switches = [Switch(name=f"spine{s:02d}", tier="spine") for s in range(spines)]
    width = max(2, len(str(leaves - 1)))
    for k in range(leaves):
        switches.append(Switch(name=f"leaf{k:0{width}d}", tier="leaf", uplinks=[f"spine{k % spines:02d}"]))
    node_list = []
    for i in range(nodes):
        name = node_name(i, nodes)
        leaf = f"leaf{i // nodes_per_switch:0{width}d}"
        node_list.append(Node(
            name=name,
            rack=f"rack{i // nodes_per_switch:0{width}d}",
            switch=leaf,
            gpus=[Gpu(node=name, index=g, uuid=f"GPU-{i:05d}{g:02d}-5e1f-4c2a-9d3b-{i * gpus + g:012x}",
                      model=GPU_MODEL, pci_bus_id=HGX_PCI_BUS_IDS[g % len(HGX_PCI_BUS_IDS)],
                      nvlink_peers=[h for h in range(gpus) if h != g])
                  for g in range(gpus)],
            nics=[Nic(node=name, name=f"mlx5_{g}", switch=leaf, pci_bus_id=nic_pci_bus_id(g)) for g in range(gpus)],
            labels={"nvidia.com/gpu.product": GPU_MODEL.replace(" ", "-"), "vigil.dev/switch": leaf},
        ))
    size = job_nodes or max(1, min(64, nodes // 2 if nodes >= 2 else 1))
    jobs = []
    for j, first in enumerate(range(0, nodes, size)):
        members = node_list[first:first + size]
        jobs.append(Job(id=f"j{j:02d}", name=f"pretrain-{j:02d}",
                        placement=[gpu.id for node in members for gpu in node.gpus]))
    return Topology(cluster=cluster, nodes=node_list, switches=switches, jobs=jobs)
