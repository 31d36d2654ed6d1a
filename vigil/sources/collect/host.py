"""Host collector through psutil: CPU, load, memory, swap, root disk, disk and network I/O, processes."""

from __future__ import annotations

from pathlib import Path

import psutil

from vigil.model import node_id
from vigil.sources.collect.base import Collection, Source, default_node_name


class CpuMeter:
    """Node CPU busy ratio between two reads, from its own cpu_times snapshot.

    psutil.cpu_percent(interval=None) keeps one module-wide snapshot, so two callers (the host collector and
    the agent's load check) would each measure only since the other's call; each meter keeps its own.
    """

    def __init__(self) -> None:
        self._last = psutil.cpu_times()

    def ratio(self) -> float:
        now = psutil.cpu_times()
        last, self._last = self._last, now
        total = sum(now) - sum(last)
        idle = (now.idle + getattr(now, "iowait", 0.0)) - (last.idle + getattr(last, "iowait", 0.0))
        if total <= 0:
            return 0.0
        return min(1.0, max(0.0, 1.0 - idle / total))


class HostCollector(Source):
    """Node totals only: per-disk and per-interface series would multiply cardinality for little diagnosis
    value (the NICs that matter to training are read from sysfs by ``InfinibandCollector``)."""

    name = "host"
    kind = "host"

    def __init__(self, node: str | None = None, root: Path = Path("/")) -> None:
        super().__init__()
        self.node = node or default_node_name()
        self.root = root
        self.cpu = CpuMeter()

    def collect(self, now: float) -> Collection:
        out = Collection(status="psutil")
        entity = node_id(self.node)
        out.add("vigil_node_up", entity, 1)
        out.add("vigil_node_cpu_utilization_ratio", entity, self.cpu.ratio())
        out.add("vigil_node_cpus", entity, psutil.cpu_count())
        out.add("vigil_node_load1", entity, psutil.getloadavg()[0])
        memory = psutil.virtual_memory()
        out.add("vigil_node_memory_used_bytes", entity, memory.total - memory.available)
        out.add("vigil_node_memory_available_bytes", entity, memory.available)
        out.add("vigil_node_swap_used_bytes", entity, psutil.swap_memory().used)
        try:
            disk = psutil.disk_usage(str(self.root))
            out.add("vigil_node_root_disk_used_ratio", entity, disk.percent / 100.0)
        except OSError as err:
            self.problems.report("disk usage", f"{self.root}: {err}")
        out.add("vigil_node_filesystem_readonly", entity, self._root_readonly())
        io = psutil.disk_io_counters()
        if io is not None:
            out.add("vigil_node_disk_read_bytes_total", entity, io.read_bytes)
            out.add("vigil_node_disk_written_bytes_total", entity, io.write_bytes)
        net = psutil.net_io_counters()
        out.add("vigil_node_network_receive_bytes_total", entity, net.bytes_recv)
        out.add("vigil_node_network_transmit_bytes_total", entity, net.bytes_sent)
        out.add("vigil_node_network_errors_total", entity, net.errin + net.errout)
        out.add("vigil_node_processes", entity, len(psutil.pids()))
        out.add("vigil_node_uptime_seconds", entity, now - psutil.boot_time())
        out.add("vigil_node_fan_speed_min_rpm", entity, self._slowest_fan())
        return out

    @staticmethod
    def _slowest_fan() -> float | None:
        """The slowest fan the hwmon drivers expose (a failing fan slows first); None on VMs without fans."""
        fans = psutil.sensors_fans() if hasattr(psutil, "sensors_fans") else {}
        speeds = [fan.current for entries in fans.values() for fan in entries]
        return float(min(speeds)) if speeds else None

    def _root_readonly(self) -> int | None:
        """1 when the root filesystem is mounted read-only (ext4 remounts ro after I/O errors)."""
        mounts = {p.mountpoint: p for p in psutil.disk_partitions(all=True)}
        root = mounts.get(str(self.root))
        if root is None:
            return None
        return int("ro" in root.opts.split(","))
