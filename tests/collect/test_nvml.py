"""NVML collector logic on a fake pynvml (no GPU on this machine; the real calls run on GPU nodes)."""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest

from tests.collect.conftest import frames
from tests.collect.fake_nvml import FakeGpu, FakeNvml
from tests.run.pages import dcgm_page
from vigil.detect.rules import RuleDetector
from vigil.knowledge.faults import fault_level
from vigil.model import FaultLevel, Gpu, Node, Topology
from vigil.sources.collect.nvml import NvmlCollector, normalise_pci_bus


def values(collection, entity: str) -> dict[str, float]:
    return {p.metric: p.value for p in collection.points if p.entity == entity}


def test_reads_every_field_under_dcgm_names() -> None:
    nvml = FakeNvml([FakeGpu(), FakeGpu(bus_id="00000000:2A:00.0", temp=70, sbe=0)])
    collector = NvmlCollector(node="n01", nvml=nvml)
    out = collector.collect(1000.0)
    gpu0 = values(out, "gpu/n01/0")
    assert gpu0["DCGM_FI_DEV_GPU_UTIL"] == 87
    assert gpu0["DCGM_FI_DEV_FB_USED"] == 60 * 1024  # MiB, as dcgm-exporter reports
    assert gpu0["DCGM_FI_DEV_POWER_USAGE"] == 550.0  # W from mW
    assert gpu0["DCGM_FI_DEV_SM_CLOCK"] == 1980 and gpu0["DCGM_FI_DEV_MEM_CLOCK"] == 2619
    assert gpu0["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"] == 3
    assert gpu0["DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"] == 2
    assert gpu0["DCGM_FI_DEV_PCIE_LINK_WIDTH"] == 16
    assert gpu0["vigil_gpu_nvlink_links_up"] == 18 and gpu0["vigil_gpu_nvlink_links_down"] == 0
    assert gpu0["vigil_gpu_recovery_action"] == 0
    assert values(out, "gpu/n01/1")["DCGM_FI_DEV_GPU_TEMP"] == 70
    assert values(out, "node/n01")["vigil_node_gpus"] == 2
    assert collector.pci_to_index == {"0000:18:00": 0, "0000:2a:00": 1}
    assert out.events == [] and collector.problems.total() == 0


def test_no_driver_reports_no_gpu_and_does_not_raise() -> None:
    collector = NvmlCollector(node="n01", nvml=FakeNvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    out = collector.collect(0.0)
    assert out.status.startswith("no GPU")
    assert values(out, "node/n01") == {"vigil_node_gpus": 0}
    assert not collector.available


def test_real_pynvml_without_driver_says_no_gpu() -> None:
    out = NvmlCollector(node="n01").collect(0.0)
    assert out.status.startswith("no GPU"), out.status


def test_pcie_width_and_row_remap_failure_are_recorded_for_the_rules_to_judge() -> None:
    gpu = FakeGpu(width=8, remap=(0, 5, 0, 1))
    fine = FakeGpu(bus_id="00000000:2A:00.0", gen=1)  # a lower generation alone is power saving
    collector = NvmlCollector(node="n01", nvml=FakeNvml([gpu, fine]), health_every=1)
    out = collector.collect(1.0)
    assert out.events == [], "a collector records; it does not judge"
    gpu0 = values(out, "gpu/n01/0")
    assert (gpu0["DCGM_FI_DEV_PCIE_LINK_WIDTH"], gpu0["DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH"]) == (8, 16)
    assert gpu0["DCGM_FI_DEV_ROW_REMAP_FAILURE"] == 1
    topology = Topology(nodes=[Node(name="n01", gpus=[Gpu(node="n01", index=0), Gpu(node="n01", index=1)])])
    rules = RuleDetector(topology)
    found = rules.update(frames(out, 1.0), out.events)
    assert sorted((a.entity, a.fault_type, a.level) for a in found) == [
        ("gpu/n01/0", "gpu_pcie_width_low", fault_level("gpu_pcie_width_low")),
        ("gpu/n01/0", "gpu_row_remap_failure", fault_level("gpu_row_remap_failure"))]
    gpu.width = 16
    out = collector.collect(2.0)
    assert out.events == [] and rules.update(frames(out, 2.0), out.events) == []


def test_a_recovery_action_change_is_reported_decoded_and_unjudged() -> None:
    gpu = FakeGpu(recovery_action=0)
    collector = NvmlCollector(node="n01", nvml=FakeNvml([gpu]), health_every=1)
    assert collector.collect(1.0).events == []
    gpu.recovery_action = pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET
    [event] = collector.collect(2.0).events
    assert (event.kind, event.attrs["action"], event.level) == ("gpu_recovery_action", "DRAIN_AND_RESET",
                                                                FaultLevel.OBSERVE)
    assert collector.collect(3.0).events == []


def test_nvlink_down_and_errors_are_summed_over_links() -> None:
    gpu = FakeGpu(nvlinks=[1, 1, 0, 1], nvlink_errors=7)
    out = NvmlCollector(node="n01", nvml=FakeNvml([gpu])).collect(1.0)
    gpu0 = values(out, "gpu/n01/0")
    assert gpu0["vigil_gpu_nvlink_links_down"] == 1 and gpu0["vigil_gpu_nvlink_links_up"] == 3
    assert gpu0["DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"] == 28


def test_unsupported_fields_are_skipped_silently_and_pre_ampere_uses_retired_pages() -> None:
    gpu = FakeGpu(
        remap=None,
        unsupported={"nvmlDeviceGetTotalEccErrors"},
        retired={pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR: [0x1000, 0x2000]},
    )
    collector = NvmlCollector(node="n01", nvml=FakeNvml([gpu]))
    gpu0 = values(collector.collect(1.0), "gpu/n01/0")
    assert "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL" not in gpu0
    assert gpu0["DCGM_FI_DEV_RETIRED_DBE"] == 2 and gpu0["DCGM_FI_DEV_RETIRED_PENDING"] == 0
    assert collector.problems.total() == 0


def test_other_nvml_errors_are_counted_once_logged(caplog) -> None:
    nvml = FakeNvml([FakeGpu()])

    def lost(_handle: int) -> int:
        raise nvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    nvml.nvmlDeviceGetPowerUsage = lost  # type: ignore[method-assign]
    collector = NvmlCollector(node="n01", nvml=nvml)
    for t in range(3):
        collector.collect(float(t))
    assert collector.problems.counts["nvmlDeviceGetPowerUsage"] == 3
    assert sum("nvmlDeviceGetPowerUsage" in r.message for r in caplog.records) == 1


def test_shutdown_on_close() -> None:
    nvml = FakeNvml()
    collector = NvmlCollector(node="n01", nvml=nvml)
    collector.collect(0.0)
    collector.close()
    assert nvml.shutdown


def test_pci_bus_ids_from_nvml_and_kernel_agree() -> None:
    assert normalise_pci_bus("00000000:9B:00.0") == normalise_pci_bus("0000:9b:00") == "0000:9b:00"


def test_health_counters_are_read_every_nth_collect_and_repeated_in_between() -> None:
    gpu = FakeGpu(nvlinks=[1] * 18, sbe=3)
    nvml = FakeNvml([gpu])
    collector = NvmlCollector(node="n01", nvml=nvml, health_every=3)
    seen = []
    for t in range(7):
        nvml.calls.clear()
        out = collector.collect(float(t))
        seen.append((nvml.calls.count("nvmlDeviceGetNvLinkErrorCounter"), values(out, "gpu/n01/0")))
        gpu.sbe += 1
    assert [calls for calls, _ in seen] == [72, 0, 0, 72, 0, 0, 72]  # 18 links x 4 counters
    assert [v["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"] for _, v in seen] == [3, 3, 3, 6, 6, 6, 9]
    assert all(v["DCGM_FI_DEV_GPU_UTIL"] == 87 and v["vigil_gpu_nvlink_links_up"] == 18 for _, v in seen)


HGX_BUSES = ["00000000:18:00.0", "00000000:2A:00.0", "00000000:3A:00.0", "00000000:5D:00.0",
             "00000000:9A:00.0", "00000000:AB:00.0", "00000000:BA:00.0", "00000000:DB:00.0"]
NVSWITCHES = ["00000000:05:00.0", "00000000:06:00.0", "00000000:07:00.0", "00000000:08:00.0"]
TOPO = Path(__file__).resolve().parents[1] / "fixtures" / "diagnose"


def test_inventory_names_each_gpu_and_its_nvlink_peers_through_nvswitches() -> None:
    # HGX H100: each GPU's 18 links go to the board's four NVSwitches, never straight to another GPU.
    remote = [(NVSWITCHES[link % 4], pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH) for link in range(18)]
    gpus = [FakeGpu(bus_id=bus, uuid=f"GPU-{i:08d}-aaaa-bbbb-cccc-000000000000", nvlink_remote=remote)
            for i, bus in enumerate(HGX_BUSES)]
    gpus[7].nvlinks = [0] * 18  # all of GPU 7's links down: it reaches no one, and no one reaches it
    collector = NvmlCollector(node="n01", nvml=FakeNvml(gpus), topo_reader=lambda: pytest.fail("NVML answered"))
    collector.collect(0.0)
    assert collector.gpus[0] == Gpu(node="n01", index=0, uuid="GPU-00000000-aaaa-bbbb-cccc-000000000000",
                                    model="NVIDIA H100 80GB HBM3", pci_bus_id="00000000:18:00.0",
                                    nvlink_peers=[1, 2, 3, 4, 5, 6])
    assert collector.gpus[7].nvlink_peers == []
    assert collector.problems.total() == 0


def test_nvlink_bridges_pair_gpus_directly() -> None:
    # Four PCIe cards, NVLink bridges between 0-1 and 2-3: each link's far end is the other GPU.
    gpu_type = pynvml.NVML_NVLINK_DEVICE_TYPE_GPU
    pairs = {0: 1, 1: 0, 2: 3, 3: 2}
    gpus = [FakeGpu(bus_id=HGX_BUSES[i], nvlinks=[1] * 4, nvlink_remote=[(HGX_BUSES[pairs[i]], gpu_type)] * 4)
            for i in range(4)]
    collector = NvmlCollector(node="n01", nvml=FakeNvml(gpus))
    collector.collect(0.0)
    assert {i: g.nvlink_peers for i, g in collector.gpus.items()} == {0: [1], 1: [0], 2: [3], 3: [2]}


@pytest.mark.parametrize(("fixture", "expected"), [
    ("nvidia_smi_topo_hgx_h100.txt", {i: [j for j in range(8) if j != i] for i in range(8)}),
    ("nvidia_smi_topo_pcie_4gpu.txt", {i: [] for i in range(4)}),
])
def test_without_remote_ends_in_nvml_the_peers_come_from_nvidia_smi_topo(fixture: str, expected: dict) -> None:
    text = (TOPO / fixture).read_text()
    gpus = [FakeGpu(bus_id=HGX_BUSES[i]) for i in range(len(expected))]
    collector = NvmlCollector(node="n01", nvml=FakeNvml(gpus), topo_reader=lambda: text)
    collector.collect(0.0)
    assert {i: g.nvlink_peers for i, g in collector.gpus.items()} == expected


def test_unreadable_topo_output_is_a_counted_problem_and_no_peers() -> None:
    collector = NvmlCollector(node="n01", nvml=FakeNvml([FakeGpu()]), topo_reader=lambda: "hello\n")
    collector.collect(0.0)
    assert collector.gpus[0].nvlink_peers == []
    assert collector.problems.counts["nvidia-smi topo -m"] == 1


def test_the_agent_registers_nvml_peers_beside_what_dcgm_exporter_names() -> None:
    from tests.collect.conftest import fast_settings
    from vigil.sources.collect.agent import Agent
    from vigil.sources.collect.dcgm import DcgmExporterScraper

    remote = [(NVSWITCHES[0], pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH)]
    gpus = [FakeGpu(bus_id=HGX_BUSES[i], uuid="", nvlinks=[1], nvlink_remote=remote) for i in range(2)]
    nvml = NvmlCollector(node="n01", nvml=FakeNvml(gpus))
    dcgm = DcgmExporterScraper("http://unused", node="n01")
    dcgm.parse_page(dcgm_page("n01", gpus=2), 0.0)
    agent = Agent([nvml, dcgm], fast_settings(), cpu_ratio=lambda: 0.1)
    nvml.collect(0.0)
    inventory = agent.inventory()
    # NVML had no UUID here; dcgm-exporter's label fills it; the peers are NVML's.
    assert [(g.index, g.nvlink_peers, g.uuid == dcgm.gpus[g.index].uuid != "") for g in inventory.gpus] == [
        (0, [1], True), (1, [0], True)]
