"""Real-format inputs for the live path: dcgm-exporter pages and kernel-log lines as the machines write them.

The page has dcgm-exporter 3.x's shape (tests/fixtures/collect/dcgm_exporter_page.txt is a captured page):
HELP and TYPE lines, the gpu / UUID / pci_bus_id / device / modelName / Hostname / driver labels, counters
typed as counters. Only the values change between scrapes.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import psutil

FIELDS = [
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", 1980),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", 61),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", 551.2),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", 97),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", 61234),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.", 0),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Total number of single-bit volatile ECC errors.", 0),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors.", 0),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", 0),
]
HOT, COOL = 95.0, 60.0  # a GPU temperature above the rules' 87 C, and a healthy one


def pci_bus(gpu: int) -> str:
    return f"00000000:{0x18 + 0x12 * gpu:02X}:00.0"


def kernel_bus(gpu: int) -> str:
    """The PCI address as the NVIDIA driver prints it in an Xid line (domain:bus:device)."""
    return f"0000:{0x18 + 0x12 * gpu:02X}:00"


def dcgm_page(host: str, gpus: int = 4, dbe: dict[int, int] | None = None,
              readings: Mapping[str, Sequence[float]] | None = None, hostname: str | None = None) -> str:
    """``readings`` replace a field's value per GPU (a healthy cluster's temperatures and power vary);
    ``hostname`` is the Hostname label: dcgm-exporter's pod name in Kubernetes (the default), the machine's
    own name where it runs on the host (systemd, or a pod with host networking)."""
    hostname = f"dcgm-exporter-{host}" if hostname is None else hostname
    lines = []
    for name, kind, help_text, value in FIELDS:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        for gpu in range(gpus):
            v = (dbe or {}).get(gpu, 0) if name == "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL" else value
            if readings is not None and name in readings:
                v = readings[name][gpu]
            labels = (f'gpu="{gpu}",UUID="GPU-5a1f0c2e-1d2b-4b8e-9f00-{host}{gpu:08d}",pci_bus_id="{pci_bus(gpu)}",'
                      f'device="nvidia{gpu}",modelName="NVIDIA H100 80GB HBM3",Hostname="{hostname}",'
                      f'DCGM_FI_DRIVER_VERSION="550.54.15"')
            lines.append(f"{name}{{{labels}}} {v}")
    return "\n".join(lines) + "\n"


def xid_line(gpu: int, code: int = 79) -> str:
    """An Xid as `dmesg` prints it, stamped with the seconds since this machine booted."""
    uptime_s = time.time() - psutil.boot_time()
    return (f"[{uptime_s:12.6f}] NVRM: Xid (PCI:{kernel_bus(gpu)}): {code}, pid=0, name=, "
            "GPU has fallen off the bus.")
