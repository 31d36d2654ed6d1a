"""Kernel log reading: real NVRM captures, every dmesg shape, strange lines counted and never fatal."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import missing, require_binary
from vigil.model import FaultLevel
from vigil.sources.collect.kmsg import JournalReader, KernelLineParser, KernelLogSource, KmsgReader


def source(lines: list[str], gpu_index=None) -> KernelLogSource:
    pending = list(lines)

    def read() -> list[str]:
        batch = pending[:]
        pending.clear()
        return batch

    return KernelLogSource(read, node="n01", gpu_index=gpu_index, boot_time=1_000_000.0)


def test_real_xid_119_capture_gives_one_drain_event_per_xid(shared_data: Path) -> None:
    capture = shared_data / "xid" / "log_samples" / "gpud_testdata_dmesg-with-xid-119.log"
    lines = capture.read_text().splitlines()
    kernel = source(lines, gpu_index={"0000:9b:00": 4}.get)
    out = kernel.collect(2e9)
    xids = [e for e in out.events if e.kind == "xid"]
    assert len(xids) == sum("NVRM: Xid" in line for line in lines) == 5
    first = xids[0]
    assert first.entity == "gpu/n01/4"
    assert first.attrs["xid"] == 119 and first.attrs["pid"] == 2024380 and first.attrs["process"] == "nvidia-smi"
    assert first.level == FaultLevel.DRAIN and first.attrs["action"] == "drain"
    assert first.ts == pytest.approx(_local("Sun Feb 23 16:24:18 2025"))
    assert kernel.problems.total() == 0, kernel.problems.counts


def _local(text: str) -> float:
    import time

    return time.mktime(time.strptime(text, "%a %b %d %H:%M:%S %Y"))


def test_real_nccl_segfault_capture_in_iso_format(shared_data: Path) -> None:
    capture = shared_data / "xid" / "log_samples" / "gpud_testdata_nccl_dmesg.decode.iso.log"
    kernel = source(capture.read_text().splitlines())
    out = kernel.collect(2e9)
    assert [(e.kind, e.attrs["signature"]) for e in out.events] == [("kernel", "segfault")] * 2
    assert out.events[0].ts == pytest.approx(1737434504.285060)
    assert kernel.problems.total() == 0


@pytest.mark.parametrize(
    "line, ts",
    [
        (
            "4,1203,5000000,-;NVRM: Xid (PCI:0000:18:00): 79, pid=0, name=, GPU has fallen off the bus.",
            1_000_005.0,
        ),
        (
            "[ 5.000000] NVRM: Xid (PCI:0000:18:00): 79, pid=0, name=, GPU has fallen off the bus.",
            1_000_005.0,
        ),
        (
            "kern  :err   : 2025-01-21T04:41:44,000000+00:00 "
            "NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.",
            1737434504.0,
        ),
    ],
)
def test_every_dmesg_shape_decodes_to_the_same_event(line: str, ts: float) -> None:
    kernel = source([line], gpu_index={"0000:18:00": 0}.get)
    [event] = kernel.collect(2e9).events
    assert (event.kind, event.entity, event.level, event.attrs["xid"]) == (
        "xid",
        "gpu/n01/0",
        FaultLevel.ISOLATE,
        79,
    )
    assert event.ts == pytest.approx(ts)


def test_unknown_xid_is_counted_logged_once_and_still_reported(caplog) -> None:
    caplog.set_level(logging.WARNING)
    line = "[ 7.0] NVRM: Xid (PCI:0000:18:00): 999, pid=12, name=python, something new"
    kernel = source([line, line, line])
    events = kernel.collect(2e9).events
    assert len(events) == 3 and all(e.attrs["known"] is False for e in events)
    assert events[0].level == FaultLevel.DRAIN and events[0].entity == "node/n01"
    assert kernel.problems.counts["unknown Xid"] == 3
    assert sum("unknown Xid" in r.message for r in caplog.records) == 1


def test_unexpected_line_formats_are_counted_and_xids_still_found(caplog) -> None:
    caplog.set_level(logging.WARNING)
    kernel = source(
        [
            "<<garbage>> \x00\xff",
            "2025/01/21 04:41:44 myhost NVRM: Xid (PCI:0000:18:00): 48, pid=7, name=python, DBE",
            "NVRM: Xid (PCI:0000:18:00): not-a-number",
            "",
            "x" * 100_000,
        ]
    )
    events = kernel.collect(123.0).events
    assert [(e.attrs["xid"], e.level, e.ts) for e in events] == [(48, FaultLevel.ISOLATE, 123.0)]
    assert kernel.problems.counts["unexpected line format"] == 4
    assert kernel.problems.counts["malformed Xid line"] == 1
    assert sum("unexpected line format" in r.message for r in caplog.records) == 1


@pytest.mark.parametrize(
    "message, signature, level",
    [
        ("NVRM: GPU at PCI:0000:18:00: GPU has fallen off the bus.", "gpu_fallen_off_bus", FaultLevel.ISOLATE),
        ("mce: [Hardware Error]: CPU 12: Machine Check Exception: 5 Bank 7: be00000000800400", "mce", FaultLevel.DRAIN),
        ("mce: [Hardware Error]: Machine check events logged", "mce_logged", FaultLevel.OBSERVE),
        ("mlx5_core 0000:0c:00.0 ens1f0np0: Link down", "mlx5_link_down", FaultLevel.ISOLATE),
        ("mlx5_core 0000:0c:00.0 ens1f0np0: Link up", "mlx5_link_up", FaultLevel.HEALTHY),
        ("mlx5_core 0000:0c:00.0: poll_health: device's health compromised", "mlx5_health", FaultLevel.ISOLATE),
        ("EXT4-fs (nvme0n1p1): Remounting filesystem read-only", "fs_readonly", FaultLevel.DRAIN),
        ("Out of memory: Killed process 1234 (python) total-vm:1kB", "oom_kill", FaultLevel.OBSERVE),
        (
            "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress",
            "nvswitch_sxid",
            FaultLevel.DEGRADED,
        ),
    ],
)
def test_other_kernel_faults_carry_the_rule_detectors_signatures(
    message: str, signature: str, level: FaultLevel
) -> None:
    [event] = source([f"[ 1.0] {message}"]).collect(0.0).events
    assert (event.kind, event.attrs["signature"], event.level) == ("kernel", signature, level)


def test_ordinary_kernel_lines_give_no_event() -> None:
    kernel = source(["[ 1.0] NVRM: GPU4 RPC history (CPU -> GSP):", "[ 2.0] usb 1-1: new device"])
    assert kernel.collect(0.0).events == []
    assert kernel.problems.total() == 0


def test_file_tail_reads_appended_lines_and_partial_lines_later(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("[ 1.0] NVRM: Xid (PCI:0000:18:00): 13, pid=5, name=python, Graphics Exception\n[ 2.0] NVRM: Xi")
    kernel = KernelLogSource.from_file(log, node="n01", boot_time=0.0)
    assert [e.attrs["xid"] for e in kernel.collect(0.0).events] == [13]
    with log.open("a") as fh:
        fh.write("d (PCI:0000:18:00): 31, pid=5, name=python, MMU Fault\n")
    assert [e.attrs["xid"] for e in kernel.collect(0.0).events] == [31]
    assert kernel.collect(0.0).events == []
    log.unlink()
    assert kernel.collect(0.0).events == [] and kernel.problems.counts["missing file"] == 1


def test_journal_json_entries_keep_their_time_and_bad_entries_are_counted() -> None:
    journal = JournalReader()
    from vigil.sources.collect.base import ProblemLog

    journal.problems = ProblemLog("journal")
    output = "\n".join(
        [
            json.dumps(
                {
                    "__REALTIME_TIMESTAMP": "1737434504285060",
                    "__CURSOR": "c1",
                    "MESSAGE": "NVRM: Xid (PCI:0000:18:00): 94, pid=1, name=python, Contained ECC error",
                }
            ),
            "{not json",
            json.dumps(
                {
                    "__REALTIME_TIMESTAMP": "1737434505000000",
                    "__CURSOR": "c2",
                    "MESSAGE": list(b"NVRM: Xid (PCI:0000:18:00): 95, pid=1, name=python, \xffUncontained"),
                }
            ),
        ]
    )
    lines = journal.parse(output)
    assert journal.problems.counts["bad journal entry"] == 1 and journal._cursor == "c2"
    kernel = source(lines)
    events = kernel.collect(0.0).events
    assert [(e.attrs["xid"], round(e.ts, 3)) for e in events] == [(94, 1737434504.285), (95, 1737434505.0)]


def test_real_dev_kmsg_reads_records_without_blocking() -> None:
    if not os.access("/dev/kmsg", os.R_OK):
        missing("/dev/kmsg is not readable here")
    reader = KmsgReader()
    records = reader.read()
    assert records and all(KernelLineParser(0.0).parse(r, 0.0) is not None for r in records)
    last_seq = int(records[-1].split(",")[1])
    # the second read returns only records written since (usually none): never the same ones again
    assert all(int(r.split(",")[1]) > last_seq for r in reader.read())
    reader.close()


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_any_kernel_line_decodes_without_raising(line: str) -> None:
    kernel = source([])
    event = kernel.decode(line, 1.0)
    assert event is None or event.entity.startswith(("node/n01", "gpu/n01/"))
    xid_line = kernel.decode(f"[ 1.0] NVRM: Xid (PCI:0000:18:00): {line}", 1.0)
    assert xid_line is None or xid_line.kind == "xid"


def test_real_journalctl_is_used_only_when_it_holds_kernel_messages() -> None:
    import subprocess

    journalctl = require_binary("journalctl")
    done = subprocess.run(
        [journalctl, "-k", "-n", "1", "-o", "json", "--no-pager", "-q"], capture_output=True, timeout=30, check=False
    )
    assert JournalReader.works() == (done.returncode == 0 and bool(done.stdout.strip()))
    journal = JournalReader(lookback_s=60)
    assert all(isinstance(line, str) for line in journal.read())
