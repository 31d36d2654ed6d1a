"""InfiniBand / RoCE sysfs reading on a fake sysfs tree (the layout of /sys/class/infiniband)."""

from __future__ import annotations

from pathlib import Path

from tests.collect.conftest import frames
from vigil.detect.rules import RuleDetector
from vigil.knowledge.faults import fault_level
from vigil.model import FaultLevel, Nic, Node, Topology
from vigil.sources.collect.infiniband import InfinibandCollector


def make_port(
    root: Path,
    device: str,
    port: int = 1,
    state: str = "4: ACTIVE",
    rate: str = "400 Gb/sec (4X NDR)",
    link_layer: str = "InfiniBand",
    link_downed: int = 0,
    gid: str | None = None,
) -> Path:
    base = root / device / "ports" / str(port)
    (base / "counters").mkdir(parents=True, exist_ok=True)
    (base / "hw_counters").mkdir(exist_ok=True)
    (base / "state").write_text(state + "\n")
    (base / "phys_state").write_text("5: LinkUp\n" if "ACTIVE" in state else "3: Disabled\n")
    (base / "rate").write_text(rate + "\n")
    (base / "link_layer").write_text(link_layer + "\n")
    counters = {
        "port_rcv_data": 1000,
        "port_xmit_data": 250,
        "symbol_error": 0,
        "link_downed": link_downed,
        "port_rcv_errors": 2,
    }
    for name, value in counters.items():
        (base / "counters" / name).write_text(f"{value}\n")
    (base / "hw_counters" / "local_ack_timeout_err").write_text("9\n")
    if gid is not None:
        (base / "gids").mkdir(exist_ok=True)
        (base / "gids" / "0").write_text(gid + "\n")
    return base


def points(out) -> dict[tuple[str, str], float]:
    return {(p.metric, p.entity): p.value for p in out.points}


def test_counters_state_and_speed(tmp_path: Path) -> None:
    make_port(tmp_path, "mlx5_0")
    make_port(tmp_path, "mlx5_1", port=2, state="1: DOWN")
    out = InfinibandCollector(node="n01", root=tmp_path).collect(0.0)
    got = points(out)
    assert got[("vigil_nic_link_up", "nic/n01/mlx5_0")] == 1
    assert got[("vigil_nic_link_up", "nic/n01/mlx5_1:2")] == 0
    assert got[("vigil_nic_phys_link_up", "nic/n01/mlx5_1:2")] == 0
    assert got[("vigil_nic_speed_gbps", "nic/n01/mlx5_0")] == 400
    assert got[("vigil_nic_rx_bytes_total", "nic/n01/mlx5_0")] == 4000  # 4-byte words
    assert got[("vigil_nic_receive_errors_total", "nic/n01/mlx5_0")] == 2
    assert got[("vigil_nic_local_ack_timeouts_total", "nic/n01/mlx5_0")] == 9
    assert out.status == "2 InfiniBand / RoCE port(s)"


def test_absent_sysfs_says_so(tmp_path: Path) -> None:
    out = InfinibandCollector(node="n01", root=tmp_path / "missing").collect(0.0)
    assert out.points == [] and "absent" in out.status


def test_state_flaps_and_speed_are_recorded_not_judged_and_the_rules_judge_them_once(tmp_path: Path) -> None:
    port = make_port(tmp_path, "mlx5_0")
    collector = InfinibandCollector(node="n01", root=tmp_path)
    topology = Topology(nodes=[Node(name="n01", nics=[Nic(node="n01", name="mlx5_0", speed_gbps=400.0)])])
    rules = RuleDetector(topology)
    found: list[tuple[float, str]] = []

    def step(ts: float) -> dict[tuple[str, str], float]:
        out = collector.collect(ts)
        assert out.events == [], "a collector records; it does not judge"
        found.extend((ts, a.fault_type) for a in rules.update(frames(out, ts), out.events))
        return points(out)

    step(0.0)
    (port / "state").write_text("1: DOWN\n")
    assert step(1.0)[("vigil_nic_link_up", "nic/n01/mlx5_0")] == 0
    make_port(tmp_path, "mlx5_0", link_downed=3)  # back up, after the link went down three times
    assert step(2.0)[("vigil_nic_link_downed_total", "nic/n01/mlx5_0")] == 3
    (port / "rate").write_text("200 Gb/sec (4X HDR)\n")
    assert step(3.0)[("vigil_nic_speed_gbps", "nic/n01/mlx5_0")] == 200
    assert found == [(1.0, "link_down"), (2.0, "link_flap"), (3.0, "nic_speed_low")]
    assert all(a.level == fault_level(a.fault_type) for a in rules.active.values())


def test_a_vanished_device_is_an_observation_the_rules_level(tmp_path: Path) -> None:
    make_port(tmp_path, "mlx5_0")
    collector = InfinibandCollector(node="n01", root=tmp_path)
    assert collector.collect(0.0).events == []
    for path in sorted(tmp_path.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    tmp_path.mkdir(exist_ok=True)
    [lost] = collector.collect(1.0).events
    assert (lost.kind, lost.level, lost.entity) == ("nic_lost", FaultLevel.OBSERVE, "nic/n01/mlx5_0")
    assert collector.collect(2.0).events == []
    topology = Topology(nodes=[Node(name="n01", nics=[Nic(node="n01", name="mlx5_0")])])
    [anomaly] = RuleDetector(topology).update([], [lost])
    assert (anomaly.entity, anomaly.fault_type) == ("nic/n01/mlx5_0", "nic_lost")
    assert anomaly.level == fault_level("nic_lost")


def test_roce_port_without_gid_is_reported_once(tmp_path: Path) -> None:
    make_port(tmp_path, "mlx5_0", link_layer="Ethernet", gid="0000:0000:0000:0000:0000:0000:0000:0000")
    make_port(tmp_path, "mlx5_1", link_layer="Ethernet", gid="fe80:0000:0000:0000:0a88:66ff:fe01:0203")
    collector = InfinibandCollector(node="n01", root=tmp_path)
    events = collector.collect(0.0).events
    assert [(e.kind, e.entity) for e in events] == [("rnic_gid_error", "nic/n01/mlx5_0")]
    assert collector.collect(1.0).events == []


def test_garbage_sysfs_values_are_counted(tmp_path: Path) -> None:
    port = make_port(tmp_path, "mlx5_0")
    (port / "counters" / "symbol_error").write_text("N/A\n")
    collector = InfinibandCollector(node="n01", root=tmp_path)
    got = points(collector.collect(0.0))
    assert ("vigil_nic_symbol_errors_total", "nic/n01/mlx5_0") not in got
    assert collector.problems.counts["bad sysfs value"] == 1


def test_mlx5_kernel_messages_land_on_the_nic_found_through_the_device_link(tmp_path: Path) -> None:
    from vigil.sources.collect.kmsg import KernelLogSource

    pci_tree = tmp_path / "devices" / "pci0000:00"
    for index, pci in enumerate(("0000:0c:00.0", "0000:0d:00.0")):
        (pci_tree / pci).mkdir(parents=True)
        make_port(tmp_path / "ib", f"mlx5_{index}")
        (tmp_path / "ib" / f"mlx5_{index}" / "device").symlink_to(pci_tree / pci)
    collector = InfinibandCollector(node="n01", root=tmp_path / "ib")
    lines = [
        "[ 3.0] mlx5_core 0000:0d:00.0 ens2f0np0: Link down",
        "[ 4.0] mlx5_core 0000:0c:00.0: poll_health: device's health compromised",
        "[ 5.0] mlx5_core 0000:99:00.0 ens9: Link down",
    ]
    kernel = KernelLogSource(lambda: lines, node="n01", nic_name=collector.device_of_pci, boot_time=0.0)
    events = kernel.collect(0.0).events
    assert [(e.entity, e.attrs["signature"]) for e in events] == [
        ("nic/n01/mlx5_1", "mlx5_link_down"),
        ("nic/n01/mlx5_0", "mlx5_health"),
        ("node/n01", "mlx5_link_down"),
    ]
