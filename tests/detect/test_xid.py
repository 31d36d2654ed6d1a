from __future__ import annotations

import csv
from pathlib import Path

from vigil.knowledge.xid import build_xid_table, known_xids, parse_xid_line, xid_info
from vigil.model import ActionKind, FaultLevel

REPO = Path(__file__).resolve().parents[2]


def test_shipped_table_matches_the_catalogue(shared_data: Path) -> None:
    rebuilt = build_xid_table(shared_data / "xid" / "xid_catalog.csv")
    shipped = list(csv.DictReader((REPO / "vigil" / "knowledge" / "data" / "xid_levels.csv").open(newline="")))
    assert shipped == rebuilt
    assert len(known_xids()) == len(rebuilt) >= 170


def test_every_catalogue_code_has_a_level_and_action(shared_data: Path) -> None:
    for row in csv.DictReader((shared_data / "xid" / "xid_catalog.csv").open(newline="")):
        info = xid_info(int(row["xid"]))
        assert info.known
        assert info.level in FaultLevel and info.action in ActionKind


def test_levels_of_well_known_codes() -> None:
    assert xid_info(48).level is FaultLevel.ISOLATE  # double-bit ECC
    assert xid_info(79).level is FaultLevel.ISOLATE  # fallen off the bus
    assert xid_info(119).level is FaultLevel.DRAIN  # GSP RPC timeout: reset needed
    assert xid_info(13).level is FaultLevel.OBSERVE  # graphics exception: usually the application
    assert xid_info(79).action is ActionKind.CORDON


def test_unknown_xid_is_marked_and_drained() -> None:
    info = xid_info(9999)
    assert not info.known
    assert info.level is FaultLevel.DRAIN


def test_parse_real_dmesg_lines(shared_data: Path) -> None:
    text = (shared_data / "xid" / "log_samples" / "gpud_testdata_dmesg-with-xid-119.log").read_text()
    parsed = [p for p in map(parse_xid_line, text.splitlines()) if p]
    assert parsed, "the sample holds Xid 119 lines"
    first = parsed[0]
    assert (first.pci_bus, first.xid, first.pid, first.process) == ("0000:9b:00", 119, 2024380, "nvidia-smi")
    assert first.message.startswith("Timeout after 6s")


def test_parse_rejects_other_lines() -> None:
    assert parse_xid_line("NVRM: loading NVIDIA UNIX x86_64 Kernel Module") is None
    assert parse_xid_line("\x00\xff garbage Xid (PCI:") is None
    line = parse_xid_line(
        "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.")
    assert line is not None and line.xid == 79 and line.pid is None
