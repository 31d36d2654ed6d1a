"""Kernel log reader: NVRM Xid lines and a few other kernel facts, decoded into events.

Three inputs, tried in this order by ``KernelLogSource.auto``:

- ``/dev/kmsg`` (needs root or CAP_SYSLOG; the DaemonSet mounts it): one record per ``read``,
  ``"<prio>,<seq>,<usec since boot>,<flags>;<message>"``, continuation lines start with a space;
- the journal (``journalctl -k -o json``), when /dev/kmsg cannot be read;
- a file (a dmesg capture, or a log a test appends to), tailed from where it was last read.

Lines from files may come in any of the usual dmesg shapes (``[Sun Feb 23 16:24:18 2025] ...``,
``[  123.456] ...``, ``kern  :warn  : 2025-01-21T04:41:44,285060+00:00 ...``, a kmsg record, syslog's
``Feb 23 16:24:18 host kernel: ...``). A line in none of them is counted, logged once, and still searched
for an Xid report, so a changed prefix never hides a GPU fault.

Xids are decoded with the catalogue in ``vigil.knowledge.xid``: fault level and action per code; an unknown
code is counted, logged once, and reported at the catalogue's CONTACT_SUPPORT level.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import psutil

from vigil.knowledge.signatures import signature_library
from vigil.knowledge.xid import parse_xid_line, xid_info
from vigil.model import Event, FaultLevel, gpu_id, nic_id, node_id
from vigil.sources.collect.base import Collection, ProblemLog, Source, default_node_name
from vigil.sources.collect.nvml import normalise_pci_bus
from vigil.sources.collect.rank_files import LOG_FILE_ATTR, LOG_OFFSET_ATTR
from vigil.sources.collect.tail import LogTail

KMSG = Path("/dev/kmsg")
MAX_RECORDS_PER_READ = 20_000
# A kernel log file is read the same bounded way: a huge file (its first read) is caught up over later reads.
KERNEL_FILE_LINES = MAX_RECORDS_PER_READ
KERNEL_FILE_BYTES = 8 * 1024 * 1024

_KMSG_RECORD = re.compile(r"^(?P<prio>\d+),(?P<seq>\d+),(?P<usec>\d+),[^;]*;(?P<msg>.*)$")
_DMESG_CTIME = re.compile(r"^\[(?P<when>[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4})\] ?(?P<msg>.*)$")
_DMESG_UPTIME = re.compile(r"^\[\s*(?P<up>\d+\.\d+)\] ?(?P<msg>.*)$")
_DMESG_ISO = re.compile(
    r"^(?:\w+\s*:\s*\w+\s*:\s*)?(?P<when>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:,\d+)?[+-]\d\d:\d\d) (?P<msg>.*)$"
)
_SYSLOG = re.compile(r"^(?P<when>[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d) \S+ kernel: (?:\[\s*\d+\.\d+\] )?(?P<msg>.*)$")

# THE log-signature library's kernel entries, where the decoder and log triage read the same lines.
_LIBRARY = {s.id: s.regex for s in signature_library()}

# Kernel messages other than Xids, as (pattern, signature, level): each becomes an Event of kind "kernel"
# with ``attrs.signature``, the vocabulary the rule detector (vigil/detect/rules.py KERNEL_FAULTS) reads.
KERNEL_PATTERNS: list[tuple[re.Pattern[str], str, FaultLevel]] = [
    (_LIBRARY["nvrm.fallen_off_bus"], "gpu_fallen_off_bus", FaultLevel.ISOLATE),
    (re.compile(r"SXid \(PCI:(?P<pci>[0-9a-fA-F:.]+)\): (?P<code>\d+)"), "nvswitch_sxid", FaultLevel.DEGRADED),
    # mce_notify_irq() prints this after logging any machine-check record, corrected ones included
    # (arch/x86/kernel/cpu/mce/core.c): on its own it is not an uncorrectable error
    (re.compile(r"mce: \[Hardware Error\]: Machine check events logged"), "mce_logged", FaultLevel.OBSERVE),
    (re.compile(r"mce: \[Hardware Error\]"), "mce", FaultLevel.DRAIN),
    (re.compile(r"[Rr]emounting filesystem read-only"), "fs_readonly", FaultLevel.DRAIN),
    (_LIBRARY["kernel.nic_link_down"], "mlx5_link_down", FaultLevel.ISOLATE),
    # the link coming back (mlx5e_update_carrier's netdev_info "Link up"): a link-down shortly before was a flap
    (re.compile(r"(?:mlx5_core|mlx4_core|bnxt_en|ice|i40e) (?P<nic_pci>[0-9a-fA-F:.]+)(?: [\w.\-]+)?: "
                r"(?:Link up|Link is Up|link up)"), "mlx5_link_up", FaultLevel.HEALTHY),
    (
        re.compile(r"mlx5_core (?P<nic_pci>[0-9a-fA-F:.]+): .*(?:health compromised|internal error|unrecoverable)"),
        "mlx5_health",
        FaultLevel.ISOLATE,
    ),
    # ib_core's add_roce_gid / del_roce_gid (drivers/infiniband/core/cache.c) log through dev_err on the IB device.
    (
        re.compile(r"infiniband (?P<ib_dev>\S+): \w+ GID (?:add|delete) failed"),
        "rnic_gid_error",
        FaultLevel.DRAIN,
    ),
    (_LIBRARY["kernel.oom_kill"], "oom_kill", FaultLevel.OBSERVE),
    (
        re.compile(r"segfault at \S+ ip \S+ sp \S+ error \d+ in (?P<lib>libnccl|libcuda|libcudart)"),
        "segfault",
        FaultLevel.OBSERVE,
    ),
]


@dataclass(frozen=True)
class KernelLine:
    ts: float
    message: str
    seq: int | None = None  # the kernel's sequence number of a /dev/kmsg record (one a record, per boot)


# Where a kernel line was read, in its event's attributes: the kernel's sequence number (/dev/kmsg), the journal's
# cursor, or the file and byte offset (``LOG_FILE_ATTR``, ``LOG_OFFSET_ATTR``, as for a rank's log line). The server
# keys a pushed event by all its fields (``vigil.faces.api.push_keys.event_key``): two equal lines the kernel logged
# within one tick of a stamp (a dmesg -T or syslog line stamps seconds) are two events, and the same line read again
# (an agent restarted, reading the ring buffer, the journal's lookback or the file again) is one.
KMSG_SEQ_ATTR = "kmsg_seq"
JOURNAL_CURSOR_ATTR = "journal_cursor"


BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
# The boot time a state directory's agents stamp kernel records with, for the boot it names.
BOOT_TIME_FILE = "boot-time"


def stable_boot_time(state_dir: Path | None, boot_id: Path | None = None) -> float:
    """The node's boot time for stamping kernel records (boot time + the record's time since boot), the same for
    every agent of this boot on ``state_dir``. The kernel's own figure (/proc/stat's btime, psutil's boot_time) is
    the wall clock less the time since boot, which moves a second either way as NTP steps or slews the clock: read
    again after a restart, the same record would get another time, and the server - which keys an event by all its
    fields - would store it twice. So the first agent of a boot writes what it read with the boot's id
    (``BOOT_TIME_FILE``) and every later one of that boot takes it from there; without a state directory it can
    write, the kernel's figure."""
    current = psutil.boot_time()
    if state_dir is None:
        return current
    path = state_dir / BOOT_TIME_FILE
    try:
        boot = (boot_id or BOOT_ID).read_text().strip()
    except OSError:
        return current
    try:
        saved_boot, saved_time = path.read_text().split()
        if saved_boot == boot:
            return float(saved_time)
    except (OSError, ValueError):
        pass
    partial = path.with_name(f"{BOOT_TIME_FILE}.{os.getpid()}")
    try:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        partial.write_text(f"{boot} {current!r}\n")
        os.replace(partial, path)
    except OSError:  # a full or read-only disk: no half-written file left behind, one per start
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
    return current


class KernelLineParser:
    """Splits a raw kernel log line into (time, message), whatever dmesg shape it came in."""

    def __init__(self, boot_time: float | None = None) -> None:
        self.boot_time = psutil.boot_time() if boot_time is None else boot_time

    def parse(self, line: str, now: float) -> KernelLine | None:
        line = line.rstrip("\n")
        if m := _KMSG_RECORD.match(line):
            return KernelLine(self.boot_time + int(m["usec"]) / 1e6, m["msg"], int(m["seq"]))
        if m := _DMESG_CTIME.match(line):
            return KernelLine(_parse_time(m["when"], "%a %b %d %H:%M:%S %Y", now), m["msg"])
        if m := _DMESG_UPTIME.match(line):
            return KernelLine(self.boot_time + float(m["up"]), m["msg"])
        if m := _DMESG_ISO.match(line):
            return KernelLine(_parse_iso(m["when"], now), m["msg"])
        if m := _SYSLOG.match(line):
            year = time.gmtime(now).tm_year
            return KernelLine(_parse_time(f"{year} {m['when']}", "%Y %b %d %H:%M:%S", now), m["msg"])
        return None


def _parse_time(text: str, fmt: str, default: float) -> float:
    try:
        # dmesg -T prints local time; agents run with TZ=UTC in the DaemonSet and systemd unit.
        return time.mktime(time.strptime(" ".join(text.split()), fmt))
    except ValueError:
        return default


def _parse_iso(text: str, default: float) -> float:
    try:
        return datetime.fromisoformat(text.replace(",", ".")).timestamp()
    except ValueError:
        return default


class KernelLogSource(Source):
    """Reads new kernel log lines on every ``collect`` and turns Xids and known faults into events."""

    name = "kernel"
    kind = "kernel"

    def __init__(
        self,
        lines: Callable[[], Iterable[str]],
        node: str | None = None,
        gpu_index: Callable[[str], int | None] | None = None,
        nic_name: Callable[[str], str | None] | None = None,
        origin: str = "kernel log",
        boot_time: float | None = None,
        positions: Callable[[], list[dict[str, object]]] | None = None,
    ) -> None:
        super().__init__()
        self.node = node or default_node_name()
        self._lines = lines
        # where each line of the last read was read (attributes of its event), when the input says
        self._positions = positions
        self._gpu_index = gpu_index or (lambda _bus: None)
        self._nic_name = nic_name or (lambda _bus: None)
        self.origin = origin
        self.parser = KernelLineParser(boot_time)
        self.lines_read = 0
        self.xids = 0
        # Records older than this are history the agent already reported before a restart.
        self.not_before = 0.0
        self._closer: Callable[[], None] | None = None
        # Whether the last read reached its input (a kernel log file that does not exist is down, not quiet).
        self.reader_up: Callable[[], bool] = lambda: True

    # ---------------------------------------------------------------- inputs

    @classmethod
    def from_kmsg(cls, path: Path = KMSG, lookback_s: float = 3600.0, **kwargs: object) -> KernelLogSource:
        reader = KmsgReader(path)
        source = cls(reader.read, origin=str(path), **kwargs)  # type: ignore[arg-type]
        source.not_before = time.time() - lookback_s
        reader.problems = source.problems
        source._closer = reader.close
        return source

    @classmethod
    def from_file(cls, path: Path, **kwargs: object) -> KernelLogSource:
        tail = LogTail(path, max_lines=KERNEL_FILE_LINES, max_bytes=KERNEL_FILE_BYTES)

        def positions() -> list[dict[str, object]]:
            return [{LOG_FILE_ATTR: str(path), LOG_OFFSET_ATTR: offset} for offset in tail.line_offsets]

        source = cls(tail.read, origin=str(path), positions=positions, **kwargs)  # type: ignore[arg-type]
        tail.problems = source.problems
        source.reader_up = lambda: tail.present
        return source

    @classmethod
    def from_journal(cls, lookback_s: float = 3600.0, **kwargs: object) -> KernelLogSource:
        journal = JournalReader(lookback_s)
        source = cls(journal.read, origin="journal", positions=journal.positions, **kwargs)  # type: ignore[arg-type]
        journal.problems = source.problems
        return source

    @classmethod
    def auto(cls, **kwargs: object) -> KernelLogSource | None:
        """/dev/kmsg if readable, else the journal if journalctl runs, else None (the agent says so)."""
        if os.access(KMSG, os.R_OK):
            return cls.from_kmsg(**kwargs)  # type: ignore[arg-type]
        if JournalReader.works():
            return cls.from_journal(**kwargs)  # type: ignore[arg-type]
        return None

    def close(self) -> None:
        if self._closer is not None:
            self._closer()

    # ---------------------------------------------------------------- decoding

    def collect(self, now: float) -> Collection:
        out = Collection(status=f"reading {self.origin}")
        lines = list(self._lines())
        where = self._positions() if self._positions is not None else []
        for i, raw in enumerate(lines):
            self.lines_read += 1
            event = self.decode(raw, now)
            if event is not None and event.ts >= self.not_before:
                if i < len(where):
                    event.attrs.update(where[i])
                out.events.append(event)
        out.add("vigil_agent_kernel_lines_total", node_id(self.node), self.lines_read)
        out.add("vigil_agent_kernel_xids_total", node_id(self.node), self.xids)
        if not self.reader_up():
            out.up, out.status = False, f"{self.origin} cannot be read"
        return out

    def decode(self, raw: str, now: float) -> Event | None:
        """The event a kernel line reports, or None; never raises on a strange line."""
        parsed = self.parser.parse(raw, now)
        if parsed is None:
            if raw.strip():
                self.problems.report("unexpected line format", raw.strip())
            parsed = KernelLine(now, raw.strip())
        event = self._decode(parsed)
        if event is not None and parsed.seq is not None:
            event.attrs[KMSG_SEQ_ATTR] = parsed.seq
        return event

    def _decode(self, parsed: KernelLine) -> Event | None:
        message = parsed.message
        if "Xid" in message and "SXid" not in message:
            return self._xid_event(parsed, message)
        for pattern, signature, level in KERNEL_PATTERNS:
            match = pattern.search(message)
            if match:
                groups = match.groupdict()
                pci = groups.get("pci") or groups.get("nic_pci")
                attrs: dict[str, object] = {"signature": signature}
                if pci:
                    attrs["pci_bus"] = pci
                if groups.get("ib_dev"):
                    entity = nic_id(self.node, groups["ib_dev"])
                elif groups.get("nic_pci"):
                    entity = self._nic_entity(groups["nic_pci"])
                else:
                    entity = self._entity(pci)
                return Event(
                    ts=parsed.ts,
                    entity=entity,
                    kind="kernel",
                    source="kernel",
                    level=level,
                    message=message[:8192],
                    attrs=attrs,
                )
        return None

    def _xid_event(self, parsed: KernelLine, message: str) -> Event | None:
        xid = parse_xid_line(message)
        if xid is None:
            if "NVRM: Xid" in message:
                self.problems.report("malformed Xid line", message)
            return None
        self.xids += 1
        info = xid_info(xid.xid)
        if not info.known:
            self.problems.report("unknown Xid", f"Xid {xid.xid} is not in the catalogue: {message}")
        return Event(
            ts=parsed.ts,
            entity=self._entity(xid.pci_bus),
            kind="xid",
            source="kernel",
            level=info.level,
            message=message[:8192],
            attrs={
                "xid": xid.xid,
                "mnemonic": info.mnemonic,
                "bucket": info.bucket,
                "action": info.action.value,
                "pci_bus": xid.pci_bus,
                "pid": xid.pid,
                "process": xid.process,
                "known": info.known,
            },
        )

    def _nic_entity(self, pci: str) -> str:
        name = self._nic_name(pci.lower())
        return nic_id(self.node, name) if name else node_id(self.node)

    def _entity(self, pci: str | None) -> str:
        if pci:
            index = self._gpu_index(normalise_pci_bus(pci))
            if index is not None:
                return gpu_id(self.node, index)
        return node_id(self.node)


class KmsgReader:
    """Non-blocking reader of /dev/kmsg: every ``read`` returns the records written since the last one."""

    def __init__(self, path: Path = KMSG) -> None:
        self.path = path
        self.problems: ProblemLog | None = None
        self._fd: int | None = None

    def read(self) -> list[str]:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        records: list[str] = []
        while len(records) < MAX_RECORDS_PER_READ:
            try:
                data = os.read(self._fd, 8192)
            except BlockingIOError:
                break
            except OSError as err:
                if err.errno == errno.EPIPE:
                    # The ring buffer wrapped past us: records were overwritten before we read them.
                    if self.problems is not None:
                        self.problems.report("kernel records lost", "the kmsg ring buffer overwrote unread records")
                    continue
                raise
            if not data:
                break
            # A record is one line plus continuation lines (" KEY=value") that carry device metadata.
            records.append(data.decode("utf-8", "replace").split("\n", 1)[0])
        return records

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class JournalReader:
    """Kernel messages from the systemd journal, resumed from the last cursor."""

    def __init__(self, lookback_s: float = 3600.0) -> None:
        self.lookback_s = lookback_s
        self.problems: ProblemLog | None = None
        self._cursor: str | None = None
        self._read_cursors: list[str] = []  # each line's of the last read: its position in the journal

    @staticmethod
    def works() -> bool:
        """True when journalctl runs and holds kernel messages (a container often has the tool, no journal)."""
        try:
            done = subprocess.run(
                ["journalctl", "-k", "-n", "1", "-o", "json", "--no-pager", "-q"],
                capture_output=True,
                timeout=5,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
        return done.returncode == 0 and bool(done.stdout.strip())

    def read(self) -> list[str]:
        args = ["journalctl", "-k", "-o", "json", "--no-pager", "-q"]
        args += [f"--after-cursor={self._cursor}"] if self._cursor else [f"--since=-{int(self.lookback_s)}s"]
        done = subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)
        return self.parse(done.stdout)

    def positions(self) -> list[dict[str, object]]:
        """The journal cursor of each line the last ``parse`` returned (an entry without one: no position)."""
        return [{JOURNAL_CURSOR_ATTR: c} if c else {} for c in self._read_cursors]

    def parse(self, output: str) -> list[str]:
        """journalctl JSON lines -> kmsg-style records (so the time survives); bad lines are counted."""
        lines = []
        self._read_cursors = []
        for row in output.splitlines():
            try:
                entry = json.loads(row)
                usec = int(entry["__REALTIME_TIMESTAMP"])
                message = entry["MESSAGE"]
                cursor = entry.get("__CURSOR")
                self._cursor = cursor or self._cursor
            except (ValueError, KeyError, TypeError) as err:
                if self.problems is not None:
                    self.problems.report("bad journal entry", f"{row[:120]!r}: {err}")
                continue
            if isinstance(message, list):
                # The journal stores non-UTF-8 messages as a list of byte values.
                message = bytes(message).decode("utf-8", "replace")
            iso = datetime.fromtimestamp(usec / 1e6).astimezone().isoformat()
            lines.append(f"{iso.replace('.', ',')} {message}")
            self._read_cursors.append(cursor if isinstance(cursor, str) else "")
        return lines
