"""InfiniBand / RoCE NICs from sysfs (``/sys/class/infiniband``): link state, speed, port and hw counters.

Layout read (the kernel's ib_core ABI, same for InfiniBand and RoCE devices)::

    <root>/<device>/ports/<port>/state          "4: ACTIVE"
    <root>/<device>/ports/<port>/phys_state     "5: LinkUp"
    <root>/<device>/ports/<port>/rate           "400 Gb/sec (4X NDR)"
    <root>/<device>/ports/<port>/link_layer     "InfiniBand" | "Ethernet" (RoCE)
    <root>/<device>/ports/<port>/counters/*     IB port counters (port_rcv_data is in 4-byte words)
    <root>/<device>/ports/<port>/hw_counters/*  driver counters (RoCE retransmits, ACK timeouts, CNPs)
    <root>/<device>/ports/<port>/gids/<n>       RoCE GID table

The root is a constructor argument, so tests run against a fake tree under a temporary directory.
The collector records what sysfs says and judges nothing: port state, rate and counters are metrics (a
down link, a flap, a rate below the NIC's rated speed are the rules' findings, judged once in
``vigil.detect.rules``). Two observations have no metric and are events: a device that disappears from sysfs
(``nic_lost``) and a RoCE port whose GID table holds no usable GID (``rnic_gid_error``); their level is the
fault catalogue's, not the collector's.
"""

from __future__ import annotations

import re
from pathlib import Path

from vigil.model import Event, nic_id
from vigil.sources.collect.base import Collection, Source, default_node_name

SYSFS_ROOT = Path("/sys/class/infiniband")

PORT_COUNTERS = {
    "symbol_error": "vigil_nic_symbol_errors_total",
    "link_downed": "vigil_nic_link_downed_total",
    "link_error_recovery": "vigil_nic_link_error_recovery_total",
    "port_rcv_errors": "vigil_nic_receive_errors_total",
    "port_xmit_discards": "vigil_nic_transmit_discards_total",
    "local_link_integrity_errors": "vigil_nic_link_integrity_errors_total",
    "excessive_buffer_overrun_errors": "vigil_nic_buffer_overrun_errors_total",
    "port_xmit_wait": "vigil_nic_transmit_wait_total",
}
# Counted in 4-byte words by the IB spec; exposed in bytes.
WORD_COUNTERS = {
    "port_rcv_data": "vigil_nic_rx_bytes_total",
    "port_xmit_data": "vigil_nic_tx_bytes_total",
}
HW_COUNTERS = {
    "out_of_sequence": "vigil_nic_out_of_sequence_total",
    "packet_seq_err": "vigil_nic_packet_sequence_errors_total",
    "local_ack_timeout_err": "vigil_nic_local_ack_timeouts_total",
    "rnr_nak_retry_err": "vigil_nic_rnr_nak_retry_errors_total",
    "np_cnp_sent": "vigil_nic_cnp_sent_total",
    "rp_cnp_handled": "vigil_nic_cnp_handled_total",
    "np_ecn_marked_roce_packets": "vigil_nic_ecn_marked_packets_total",
}
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec")
_ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


class InfinibandCollector(Source):
    name = "infiniband"
    kind = "network"

    def __init__(self, node: str | None = None, root: Path = SYSFS_ROOT) -> None:
        super().__init__()
        self.node = node or default_node_name()
        self.root = root
        self._ports: set[str] = set()
        self._gid_missing: set[str] = set()

    def device_of_pci(self, pci: str) -> str | None:
        """The IB device (``mlx5_3``) whose PCI function is ``pci`` (``0000:0c:00.0``), from the ``device`` link;
        lets the kernel log name the NIC of an mlx5 message."""
        if not self.present():
            return None
        for device in self.root.iterdir():
            try:
                if (device / "device").resolve().name.lower() == pci:
                    return device.name
            except OSError:
                continue
        return None

    def present(self) -> bool:
        return self.root.is_dir()

    def collect(self, now: float) -> Collection:
        out = Collection()
        if not self.present():
            out.status = f"no InfiniBand / RoCE devices ({self.root} absent)"
            return out
        seen: set[str] = set()
        for device in sorted(p for p in self.root.iterdir() if (p / "ports").is_dir()):
            for port in sorted((device / "ports").iterdir(), key=lambda p: p.name):
                name = device.name if port.name == "1" else f"{device.name}:{port.name}"
                seen.add(name)
                self._collect_port(out, now, name, port)
        for lost in sorted(self._ports - seen):
            out.events.append(
                Event(
                    ts=now,
                    entity=nic_id(self.node, lost),
                    kind="nic_lost",
                    source="sysfs",
                    message=f"{lost} disappeared from {self.root}",
                )
            )
        self._ports = seen
        out.status = f"{len(seen)} InfiniBand / RoCE port(s)"
        return out

    def _read(self, path: Path) -> str | None:
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            return None
        except OSError as err:
            # Some counters are unreadable on some firmware (EINVAL); count it rather than stop the port.
            self.problems.report("unreadable sysfs file", f"{path}: {err}")
            return None

    def _number(self, path: Path) -> int | None:
        text = self._read(path)
        if text is None:
            return None
        try:
            return int(text.split(":")[0])
        except ValueError:
            self.problems.report("bad sysfs value", f"{path}: {text[:60]!r}")
            return None

    def _collect_port(self, out: Collection, now: float, name: str, port: Path) -> None:
        entity = nic_id(self.node, name)
        state = self._number(port / "state")
        phys = self._number(port / "phys_state")
        up = state == 4  # IB_PORT_ACTIVE
        out.add("vigil_nic_link_up", entity, None if state is None else int(up))
        out.add("vigil_nic_phys_link_up", entity, None if phys is None else int(phys == 5))  # LinkUp
        rate_text = self._read(port / "rate") or ""
        rate_match = _RATE.match(rate_text)
        rate = float(rate_match.group(1)) if rate_match else None
        out.add("vigil_nic_speed_gbps", entity, rate)
        for file, metric in PORT_COUNTERS.items():
            out.add(metric, entity, self._number(port / "counters" / file))
        for file, metric in WORD_COUNTERS.items():
            words = self._number(port / "counters" / file)
            out.add(metric, entity, None if words is None else words * 4)
        for file, metric in HW_COUNTERS.items():
            out.add(metric, entity, self._number(port / "hw_counters" / file))
        self._gid_event(out, now, name, entity, port, up)

    def _gid_event(self, out: Collection, now: float, name: str, entity: str, port: Path, up: bool) -> None:
        gid_missing = up and self._read(port / "link_layer") == "Ethernet" and not self._has_gid(port)
        if not gid_missing:
            self._gid_missing.discard(name)
        elif name not in self._gid_missing:
            self._gid_missing.add(name)
            out.events.append(
                Event(
                    ts=now,
                    entity=entity,
                    kind="rnic_gid_error",
                    source="sysfs",
                    message=f"RoCE port {name} has no usable GID",
                )
            )

    def _has_gid(self, port: Path) -> bool:
        gids = port / "gids"
        if not gids.is_dir():
            return False
        return any((self._read(g) or _ZERO_GID) != _ZERO_GID for g in gids.iterdir())
