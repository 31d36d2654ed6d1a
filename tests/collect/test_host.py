"""Host collector on this machine's real /proc through psutil."""

from __future__ import annotations

from vigil.sources.collect.host import CpuMeter, HostCollector


def test_host_metrics_are_plausible() -> None:
    out = HostCollector(node="n01").collect(1e10)
    got = {p.metric: p.value for p in out.points}
    assert {p.entity for p in out.points} == {"node/n01"}
    assert 0.0 <= got["vigil_node_cpu_utilization_ratio"] <= 1.0
    assert got["vigil_node_memory_used_bytes"] > 0 and got["vigil_node_memory_available_bytes"] > 0
    assert got["vigil_node_processes"] >= 1
    assert got["vigil_node_up"] == 1
    assert got["vigil_node_filesystem_readonly"] in (0.0, 1.0)


def test_cpu_meter_sees_a_busy_loop() -> None:
    import time

    meter = CpuMeter()
    end = time.monotonic() + 0.3
    while time.monotonic() < end:
        pass
    # at least this process's share of the machine's cores was busy
    import psutil

    assert meter.ratio() >= 0.5 / psutil.cpu_count()


def test_fan_speed_is_the_slowest_hwmon_fan(monkeypatch) -> None:
    from collections import namedtuple

    import psutil

    fan = namedtuple("fan", "label current")
    monkeypatch.setattr(psutil, "sensors_fans", lambda: {"dell_smm": [fan("", 9000), fan("", 1200)]})
    got = {p.metric: p.value for p in HostCollector(node="n01").collect(1e10).points}
    assert got["vigil_node_fan_speed_min_rpm"] == 1200
    monkeypatch.setattr(psutil, "sensors_fans", lambda: {})
    got = {p.metric: p.value for p in HostCollector(node="n01").collect(1e10).points}
    assert "vigil_node_fan_speed_min_rpm" not in got
