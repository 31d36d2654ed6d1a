"""A node's GPU interconnect: the ``nvidia-smi topo -m`` matrix, NVML's view of it, and each GPU's NVLink peers.

The agent records each GPU's NVLink peers in its inventory (``Gpu.nvlink_peers``): the GPUs of the same node it
reaches over NVLink, directly or through the node's NVSwitches. NVML gives them per link: an active link's
remote end (``nvmlDeviceGetNvLinkRemotePciInfo``, the C ``_v2`` call) is either another GPU, known by its PCI
bus id, or an NVSwitch, shared by every GPU cabled to it (``nvmlDeviceGetNvLinkRemoteDeviceType``). Where the
driver's NVML lacks those calls, ``nvidia-smi topo -m`` says the same with ``NV#`` cells.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field

from vigil.model import VigilInputError


@dataclass
class NvTopology:
    """The connection matrix of ``nvidia-smi topo -m``: link type between every pair of devices."""

    gpus: list[int]
    nics: dict[str, str]  # NIC0 -> mlx5_0
    links: dict[tuple[str, str], str]  # ("GPU0", "GPU1") -> "NV18"
    cpu_affinity: dict[int, str] = field(default_factory=dict)
    numa_affinity: dict[int, str] = field(default_factory=dict)

    def nvlink_domains(self) -> dict[int, list[int]]:
        """Connected groups of GPUs over NV# links (one group per NVSwitch / NVLink mesh)."""
        peers = self.nvlink_peers()
        seen: set[int] = set()
        groups = []
        for gpu in self.gpus:  # connected components, without networkx (the node agent does not ship it)
            if gpu in seen:
                continue
            group, frontier = {gpu}, [gpu]
            while frontier:
                for peer in peers.get(frontier.pop(), []):
                    if peer not in group:
                        group.add(peer)
                        frontier.append(peer)
            seen |= group
            if len(group) > 1:
                groups.append(sorted(group))
        return {i: members for i, members in enumerate(sorted(groups))}

    def nvlink_peers(self) -> dict[int, list[int]]:
        """Each GPU's NVLink peers: the GPUs its row marks ``NV#``."""
        return {gpu: sorted(int(b[3:]) for (a, b), link in self.links.items()
                            if a == f"GPU{gpu}" and b.startswith("GPU") and link.startswith("NV")) for gpu in self.gpus}

    def nearest_nics(self) -> dict[int, str]:
        """Each GPU's closest NIC by PCIe distance (PIX < PXB < PHB < NODE < SYS); ties keep the first NIC."""
        rank = {"PIX": 0, "PXB": 1, "PHB": 2, "NODE": 3, "SYS": 4}
        nearest = {}
        for gpu in self.gpus:
            best: tuple[int, str] | None = None
            for label, name in self.nics.items():
                link = self.links.get((f"GPU{gpu}", label), "SYS")
                score = rank.get(link, 5)
                if best is None or score < best[0]:
                    best = (score, name)
            if best is not None and best[0] <= rank["PHB"]:
                nearest[gpu] = best[1]
        return nearest


_LINK = re.compile(r"^(X|SYS|NODE|PHB|PXB|PIX|NV\d+|SOC|PXH)$")


def parse_nvidia_smi_topo(text: str) -> NvTopology:
    """Parse ``nvidia-smi topo -m`` output; raises VigilInputError naming the line that does not fit."""
    lines = [line.rstrip() for line in text.splitlines()]
    header_at = next((i for i, line in enumerate(lines) if re.match(r"^\s+GPU0\b", line)), None)
    if header_at is None:
        raise VigilInputError("nvidia-smi topo -m output: no header line starting with GPU0")
    columns = lines[header_at].split("\t") if "\t" in lines[header_at] else lines[header_at].split()
    columns = [c.strip() for c in columns if c.strip()]
    devices = [c for c in columns if re.match(r"^(GPU|NIC|mlx)\w*$", c)]
    links: dict[tuple[str, str], str] = {}
    gpus: list[int] = []
    cpu_affinity: dict[int, str] = {}
    numa_affinity: dict[int, str] = {}
    for offset, line in enumerate(lines[header_at + 1:], start=header_at + 2):
        if not line.strip() or line.strip().startswith("Legend"):
            break
        cells = [c.strip() for c in (line.split("\t") if "\t" in line else line.split())]
        cells = [c for c in cells if c != ""]
        row = cells[0]
        values = cells[1:1 + len(devices)]
        if len(values) < len(devices) or not all(_LINK.match(v) for v in values):
            raise VigilInputError(f"nvidia-smi topo -m output line {offset}: expected {len(devices)} link "
                                  f"types (X, NV#, PIX, PXB, PHB, NODE, SYS) after {row!r}")
        for device, value in zip(devices, values, strict=True):
            if value != "X":
                links[(row, device)] = value
        if row.startswith("GPU"):
            index = int(row[3:])
            gpus.append(index)
            rest = cells[1 + len(devices):]
            if rest:
                cpu_affinity[index] = rest[0]
            if len(rest) > 1:
                numa_affinity[index] = rest[1]
    nics = {}
    for line in lines:
        match = re.match(r"^\s*(NIC\d+):\s*(\S+)\s*$", line)
        if match:
            nics[match.group(1)] = match.group(2)
    for device in devices:
        if device.startswith("NIC") and device not in nics:
            nics[device] = device.lower()
        elif device.startswith("mlx"):
            nics[device] = device
    if not gpus:
        raise VigilInputError("nvidia-smi topo -m output: no GPU rows")
    return NvTopology(gpus=gpus, nics=nics, links=links, cpu_affinity=cpu_affinity, numa_affinity=numa_affinity)


# NVML's nvmlGpuTopologyLevel_t -> the nvidia-smi topo -m link names.
NVML_LEVELS = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


def nvml_topology(nvlinks: Sequence[int], nvlink_p2p: Sequence[Sequence[bool]],
                  ancestor: Sequence[Sequence[int]]) -> NvTopology:
    """The ``topo -m`` matrix from NVML readings: each GPU's active NVLink count, whether each GPU pair can
    use NVLink peer-to-peer (direct or through NVSwitch), and each pair's PCIe common-ancestor level."""
    count = len(nvlinks)
    if len(nvlink_p2p) != count or len(ancestor) != count:
        raise VigilInputError("NVML topology: nvlinks, nvlink_p2p and ancestor must cover the same GPUs")
    links: dict[tuple[str, str], str] = {}
    for a in range(count):
        for b in range(count):
            if a == b:
                continue
            if nvlink_p2p[a][b] and nvlinks[a] > 0:
                links[(f"GPU{a}", f"GPU{b}")] = f"NV{nvlinks[a]}"
            else:
                links[(f"GPU{a}", f"GPU{b}")] = NVML_LEVELS.get(int(ancestor[a][b]), "SYS")
    return NvTopology(gpus=list(range(count)), nics={}, links=links)


def read_nvml_topology() -> NvTopology:  # pragma: no cover - needs an NVIDIA driver
    """Read the NVLink / PCIe topology of this host's GPUs through NVML (pynvml)."""
    import pynvml

    pynvml.nvmlInit()
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        nvlinks = []
        for handle in handles:
            active = 0
            for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
                try:
                    active += pynvml.nvmlDeviceGetNvLinkState(handle, link) == pynvml.NVML_FEATURE_ENABLED
                except pynvml.NVMLError:
                    break
            nvlinks.append(active)
        p2p = [[a is not b and pynvml.nvmlDeviceGetP2PStatus(a, b, pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
                == pynvml.NVML_P2P_STATUS_OK for b in handles] for a in handles]
        ancestor = [[0 if a is b else int(pynvml.nvmlDeviceGetTopologyCommonAncestor(a, b)) for b in handles]
                    for a in handles]
        return nvml_topology(nvlinks, p2p, ancestor)
    finally:
        pynvml.nvmlShutdown()


def read_nvidia_smi_topo(timeout_s: float = 10.0) -> str | None:
    """``nvidia-smi topo -m`` on this host, or None where nvidia-smi is absent or fails."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return None
    try:
        done = subprocess.run([binary, "topo", "-m"], capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None

