"""THE Xid table: every Xid code -> mnemonic, NVIDIA's immediate-action bucket, a Vigil fault level and action,
and the fault type the code means.

Two data files, each fact once: ``data/xid_levels.csv`` is derived from NVIDIA's Xid catalogue (as published by
leptonai/gpud, Apache-2.0) by ``build_xid_table``; ``python -m vigil.knowledge.xid CATALOG.csv`` regenerates it
and a test checks the shipped table against the catalogue in ../shared/data/xid. ``data/xid_faults.yaml``
names the fault type of the codes whose meaning is specific, each with the catalogue text that decides it.

The bucket -> level mapping follows NVSentinel's reading of the catalogue (RESTART_APP / IGNORE touch only the
application; RESET_GPU and the Xid-48 workflow need a component reset) and is sharpened where data can be
wrong or the device is gone (ISOLATE) - see docs/fault-levels.md.
"""

from __future__ import annotations

import csv
import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from vigil.knowledge.files import data_dir, read_data
from vigil.model import ActionKind, FaultLevel, VigilInputError

BUCKET_LEVELS: dict[str, FaultLevel] = {
    "": FaultLevel.OBSERVE,
    "IGNORE": FaultLevel.OBSERVE,
    "RESTART_APP": FaultLevel.OBSERVE,
    "CHECK_UVM": FaultLevel.OBSERVE,
    "UPDATE_SWFW": FaultLevel.OBSERVE,
    "CHECK_MECHANICALS": FaultLevel.DEGRADED,
    "RESET_GPU": FaultLevel.DRAIN,
    "RESTART_VM": FaultLevel.DRAIN,
    "RESTART_FM": FaultLevel.DRAIN,
    "RESET_FABRIC": FaultLevel.DRAIN,
    "WORKFLOW_NVLINK_ERR": FaultLevel.DRAIN,
    "WORKFLOW_NVLINK5_ERR": FaultLevel.DRAIN,
    "WORKFLOW_XID_45": FaultLevel.OBSERVE,
    "XID_154": FaultLevel.DRAIN,
    "CONTACT_SUPPORT": FaultLevel.DRAIN,
    "WORKFLOW_XID_48": FaultLevel.ISOLATE,
    "RESTART_BM": FaultLevel.ISOLATE,
}

# Codes whose data may already be wrong or whose device is gone: stop using the GPU now.
ISOLATE_CODES = {48, 64, 79, 95, 140}
# Codes the catalogue files under IGNORE but that need attention: pending row remap (63) needs a reset;
# an SBE interrupt storm (92) predicts a DBE.
LEVEL_OVERRIDES = {63: FaultLevel.DRAIN, 92: FaultLevel.DEGRADED}

LEVEL_ACTIONS: dict[FaultLevel, ActionKind] = {
    FaultLevel.HEALTHY: ActionKind.ALERT,
    FaultLevel.OBSERVE: ActionKind.ALERT,
    FaultLevel.DEGRADED: ActionKind.RUN_DIAGNOSTICS,
    FaultLevel.DRAIN: ActionKind.DRAIN,
    FaultLevel.ISOLATE: ActionKind.CORDON,
}

_FIELDS = ["xid", "mnemonic", "bucket", "level", "action", "description"]


@dataclass(frozen=True)
class XidInfo:
    code: int
    mnemonic: str
    description: str
    bucket: str
    level: FaultLevel
    action: ActionKind
    fault: str
    known: bool = True


class XidFault(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    fault: str
    why: str


class XidFaultMap(BaseModel):
    """``data/xid_faults.yaml``: the specific codes, and the fault of every other code by its level."""

    model_config = ConfigDict(extra="forbid")

    version: int
    default: str
    application: str
    faults: dict[int, XidFault]

    def fault_of(self, code: int, level: FaultLevel) -> str:
        specific = self.faults.get(code)
        if specific is not None:
            return specific.fault
        return self.application if level <= FaultLevel.OBSERVE else self.default


def level_for(code: int, bucket: str) -> FaultLevel:
    if code in ISOLATE_CODES:
        return FaultLevel.ISOLATE
    if code in LEVEL_OVERRIDES:
        return LEVEL_OVERRIDES[code]
    return BUCKET_LEVELS.get(bucket, FaultLevel.DRAIN)


def build_xid_table(catalog_csv: Path) -> list[dict[str, str]]:
    """Derive Vigil's table from NVIDIA's catalogue (columns xid, mnemonic, description, immediate_action)."""
    try:
        rows = list(csv.DictReader(catalog_csv.open(newline="")))
    except FileNotFoundError:
        raise VigilInputError(f"Xid catalogue {catalog_csv} does not exist") from None
    table = []
    for row in rows:
        try:
            code = int(row["xid"])
        except (KeyError, ValueError):
            raise VigilInputError(f"Xid catalogue {catalog_csv}: bad xid value {row.get('xid')!r}") from None
        bucket = (row.get("immediate_action") or "").strip()
        level = level_for(code, bucket)
        description = (row.get("description") or "").strip()
        if description in ("", "Unused"):
            description = (row.get("r555_name") or description).strip()
        table.append({
            "xid": str(code),
            "mnemonic": " ".join((row.get("mnemonic") or "").split()),
            "bucket": bucket,
            "level": level.label,
            "action": LEVEL_ACTIONS[level].value,
            "description": " ".join(description.split()),
        })
    return table


@lru_cache(maxsize=1)
def xid_fault_map() -> XidFaultMap:
    return read_data(data_dir() / "xid_faults.yaml", XidFaultMap, "Xid fault table")


@lru_cache(maxsize=1)
def _table() -> dict[int, XidInfo]:
    faults = xid_fault_map()
    text = (data_dir() / "xid_levels.csv").read_text()
    table = {}
    for row in csv.DictReader(text.splitlines()):
        code = int(row["xid"])
        level = FaultLevel.parse(row["level"])
        table[code] = XidInfo(code, row["mnemonic"], row["description"], row["bucket"], level,
                              ActionKind(row["action"]), faults.fault_of(code, level))
    return table


def xid_info(code: int) -> XidInfo:
    """Decode an Xid; an unknown code is treated as CONTACT_SUPPORT (drain) and marked ``known=False``."""
    info = _table().get(code)
    if info is not None:
        return info
    return XidInfo(code, "UNKNOWN_XID", f"Xid {code} is not in the catalogue", "CONTACT_SUPPORT",
                   FaultLevel.DRAIN, ActionKind.DRAIN, xid_fault_map().default, known=False)


def known_xids() -> list[int]:
    return sorted(_table())


def xid_codes_of(fault: str) -> list[int]:
    """The catalogue's codes that mean ``fault``."""
    return sorted(code for code, info in _table().items() if info.fault == fault)


@dataclass(frozen=True)
class XidLine:
    pci_bus: str
    xid: int
    pid: int | None
    process: str | None
    message: str


_XID_LINE = re.compile(
    r"NVRM: Xid \(PCI:(?P<pci>[0-9A-Fa-f:.]+)\): (?P<xid>\d+),"
    r"(?: pid=(?P<pid>'?[^,']*'?|\d+),)?(?: name=(?P<name>[^,]*),)?\s*(?P<msg>.*)$"
)


def parse_xid_line(line: str) -> XidLine | None:
    """Parse an NVRM Xid kernel line (dmesg / kmsg / journal); None if the line is not an Xid report."""
    match = _XID_LINE.search(line)
    if match is None:
        return None
    pid_text = (match.group("pid") or "").strip("'")
    return XidLine(
        pci_bus=match.group("pci"),
        xid=int(match.group("xid")),
        pid=int(pid_text) if pid_text.isdigit() else None,
        process=match.group("name"),
        message=match.group("msg").strip(),
    )


def _write_table(catalog_csv: Path, out: Path) -> None:
    with out.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=_FIELDS)
        writer.writeheader()
        writer.writerows(build_xid_table(catalog_csv))


if __name__ == "__main__":
    _write_table(Path(sys.argv[1]), Path(__file__).resolve().parent / "data" / "xid_levels.csv")
