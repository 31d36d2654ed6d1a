"""Read PyTorch Flight Recorder dumps (pickle or JSON, format 2.3 to 2.10) and diagnose them.

Entries are turned into the probe's op records so the same consensus matching runs on both. Gloo dumps
(torch >= 2.13 with TORCH_FR_BUFFER_SIZE) differ from NCCL ones: ``pg_config`` is keyed by an empty
name while entries say ``("0", "default_pg")``, and states stay ``scheduled``; completion is read from
``pg_status`` instead. Pickles are read with an unpickler that refuses every class, so a hostile
dump cannot run code.
"""

from __future__ import annotations

import ast
import io
import json
import pickle
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vigil.detect.collectives import CollectiveFinding, match_collectives
from vigil.diagnose.hang import HangDiagnosis, HangKind, Verdict
from vigil.model import Evidence, VigilInputError, rank_id
from vigil.sources.probe.records import COLLECTIVE, P2P, OpRecord
from vigil.store.safe_pickle import PICKLE_ERRORS, DataOnlyUnpickler

SUPPORTED_VERSIONS = ((2, 3), (2, 10))
_RANK_SUFFIX = re.compile(r"(\d+)(\.json|\.pkl|\.pickle)?$")


@dataclass
class FRDump:
    rank: int
    path: Path
    version: str
    entries: list[dict[str, Any]]
    pg_config: dict[str, Any]
    pg_status: dict[str, Any] = field(default_factory=dict)


def _version_ok(version: str) -> bool:
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        return False
    return SUPPORTED_VERSIONS[0] <= (major, minor) <= SUPPORTED_VERSIONS[1]


def read_dump(path: Path) -> FRDump:
    """One rank's dump; the rank is the trailing number of the file name."""
    match = _RANK_SUFFIX.search(path.name)
    if match is None:
        raise VigilInputError(f"FR dump {path}: file name must end with the rank number (e.g. rank_3)")
    raw = path.read_bytes()
    try:
        data = json.loads(raw) if raw[:1] in (b"{", b"[") else DataOnlyUnpickler(io.BytesIO(raw)).load()
    except (*PICKLE_ERRORS, UnicodeDecodeError) as err:
        raise VigilInputError(f"FR dump {path} is corrupt or not a Flight Recorder dump: {err}") from None
    if not isinstance(data, dict):
        raise VigilInputError(f"FR dump {path}: expected a dict at the top level")
    for key in ("version", "entries"):
        if key not in data:
            raise VigilInputError(f"FR dump {path}: missing field {key!r}")
    version = str(data["version"])
    if not _version_ok(version):
        raise VigilInputError(f"FR dump {path}: format version {version!r} is not supported (2.3 to 2.10)")
    if not isinstance(data["entries"], list):
        raise VigilInputError(f"FR dump {path}: field 'entries' must be a list")
    return FRDump(
        rank=int(match.group(1)),
        path=path,
        version=version,
        entries=data["entries"],
        pg_config=data.get("pg_config") or {},
        pg_status=data.get("pg_status") or {},
    )


def read_dir(directory: Path) -> dict[int, FRDump]:
    if not directory.is_dir():
        raise VigilInputError(f"{directory} is not a directory of FR dumps")
    files = [p for p in sorted(directory.iterdir()) if p.is_file() and not p.name.startswith(".")]
    dumps: dict[int, FRDump] = {}
    for path in files:
        if _RANK_SUFFIX.search(path.name) is None:
            continue
        dump = read_dump(path)
        if dump.rank in dumps:
            raise VigilInputError(f"FR dumps {dumps[dump.rank].path.name} and {path.name} are both rank {dump.rank}")
        dumps[dump.rank] = dump
    if not dumps:
        raise VigilInputError(f"{directory} holds no Flight Recorder dumps (files named <prefix><rank>)")
    return dumps


def _parse_ranks(value: Any) -> list[int]:
    if isinstance(value, list):
        return [int(v) for v in value]
    if isinstance(value, str):
        parsed = ast.literal_eval(value) if value.strip() else []
        return [int(v) for v in parsed]
    return []


def _group_members(dump: FRDump, name: str, desc: str) -> list[int]:
    """Members of a process group; tolerant of gloo's empty pg_config keys."""
    config = dump.pg_config.get(name)
    if config is None:
        by_desc = [c for c in dump.pg_config.values() if isinstance(c, dict) and c.get("desc") == desc]
        candidates = by_desc or [c for c in dump.pg_config.values() if isinstance(c, dict)]
        config = candidates[0] if len(candidates) == 1 else None
    if not isinstance(config, dict):
        return []
    try:
        return _parse_ranks(config.get("ranks", []))
    except (ValueError, SyntaxError):
        raise VigilInputError(f"FR dump {dump.path}: pg_config ranks of group {name!r} are unreadable") from None


def _last_entry_per_group(dump: FRDump) -> dict[str, int]:
    last: dict[str, int] = {}
    for index, entry in enumerate(dump.entries):
        if isinstance(entry, dict):
            last[str(entry.get("pg_id", ""))] = index
    return last


def to_op_records(dump: FRDump) -> list[OpRecord]:
    """Entries as op records. Where the dump gives no state (gloo keeps every entry "scheduled"), ops
    of a group run in order, so only its last entry can still be pending, and only if ``pg_status``
    says something is (its counters also count p2p ops, so they cannot be matched to seq ids)."""
    records = []
    last_in_group = _last_entry_per_group(dump)
    for index, entry in enumerate(dump.entries):
        try:
            group_name, desc = (list(entry.get("process_group") or ["0", ""]) + ["", ""])[:2]
            group_key = str(entry.get("pg_id", group_name))
            is_p2p = bool(entry.get("is_p2p", False))
            profiling = str(entry.get("profiling_name", "?"))
            op = profiling.split(":", 1)[-1].split(" ")[0]
            status = dump.pg_status.get(group_key, {})
            seq = int(entry["p2p_seq_id"] if is_p2p else entry["collective_seq_id"])
            pending = int(status.get("last_enqueued_collective", -1)) > int(
                status.get("last_completed_collective", -1)
            )
            state = str(entry.get("state", "scheduled"))
            completed_ns = entry.get("time_discovered_completed_ns")
            superseded = index != last_in_group.get(group_key) or not pending
            if state != "completed" and (completed_ns or (superseded and not entry.get("time_discovered_started_ns"))):
                state = "completed"
            records.append(
                OpRecord(
                    record_id=int(entry.get("record_id", index)),
                    group=str(group_name),
                    group_ranks=_group_members(dump, str(group_name), str(desc)),
                    kind=P2P if is_p2p else COLLECTIVE,
                    seq=seq,
                    op=op,
                    sizes=[list(s) for s in entry.get("input_sizes", [])],
                    dtypes=[str(d) for d in entry.get("input_dtypes", [])],
                    state=state,
                    t_start=int(entry.get("time_created_ns", 0)) / 1e9,
                    t_end=int(completed_ns) / 1e9 if completed_ns else None,
                    timeout_s=int(entry.get("timeout_ms", 0)) / 1000 or None,
                    thread=str(entry.get("thread_name", "")),
                )
            )
        except (KeyError, TypeError, ValueError) as err:
            raise VigilInputError(f"FR dump {dump.path}: entry #{index} is malformed ({err})") from None
    return records


def diagnose_dumps(directory: Path, world_size: int | None = None) -> HangDiagnosis:
    """Consensus verdict from FR dumps alone: who never joined, whose signature differs."""
    dumps = read_dir(directory)
    ops = {rank: to_op_records(dump) for rank, dump in dumps.items()}
    members = {r for records in ops.values() for op in records for r in op.group_ranks}
    world = world_size or max(len(members), max(dumps) + 1)
    now = max((op.t_start for records in ops.values() for op in records), default=time.time())
    # A rank that left no dump at all never entered anything we can see.
    for rank in range(world):
        ops.setdefault(rank, [])
    findings = match_collectives(ops, now)
    missing_dumps = sorted(set(range(world)) - set(dumps))
    return _verdict(findings, missing_dumps, world, ops)


def _not_started(finding: CollectiveFinding, ops: dict[int, list[OpRecord]]) -> list[int]:
    """With start events (TORCH_NCCL_ENABLE_TIMING) the ranks whose op #k never started while the
    others' did: their GPU never got to the collective's kernel."""
    states = {
        rank: next((op.state for op in ops.get(rank, []) if op.group == finding.group and op.seq == finding.seq), None)
        for rank in finding.waiting
    }
    started = [r for r, state in states.items() if state == "started"]
    scheduled = [r for r, state in states.items() if state == "scheduled"]
    return sorted(scheduled) if started and scheduled and len(scheduled) < len(started) else []


def _verdict(
    findings: list[CollectiveFinding], missing_dumps: list[int], world: int, ops: dict[int, list[OpRecord]]
) -> HangDiagnosis:
    evidence = [
        Evidence(kind="hang", entity=rank_id("local", (f.missing or f.waiting or [0])[0]), ts=time.time(),
                 summary=f.describe(), attrs={"group": f.group, "seq": f.seq})
        for f in findings
    ]
    if missing_dumps:
        evidence.append(Evidence(kind="hang", entity=rank_id("local", missing_dumps[0]), ts=time.time(),
                                 summary=f"no FR dump from rank(s) {missing_dumps}"))
    verdict: Verdict = "ok"
    kind: HangKind | None = None
    culprits: list[int] = []
    summary = "no unfinished collective in the dumps"
    mismatch = next((f for f in findings if f.mismatched), None)
    if mismatch is not None:
        verdict, kind, culprits = "mismatch", "signature_mismatch", sorted(mismatch.mismatched)
        summary = f"mismatch: {mismatch.describe()}"
    elif findings and findings[0].missing:
        first = findings[0]
        verdict, kind, culprits = "hang", "not_enqueued", first.missing
        summary = f"hang: {first.describe()}"
    elif findings:
        first = findings[0]
        verdict, kind, culprits = "hang", "stuck_in_collective", _not_started(first, ops)
        if culprits:
            summary = f"hang: {first.describe()}; every rank entered it, rank(s) {culprits} never started it"
        else:
            summary = f"hang: {first.describe()}; every rank entered it (FR cannot see inside the collective)"
    return HangDiagnosis(
        verdict=verdict, culprit_ranks=culprits, hang_kind=kind, summary=summary, world_size=world,
        source="flight_recorder", evidence=evidence,
    )


# ----------------------------------------------------------------------------- torch's analyzer


@dataclass
class TorchAnalyzerResult:
    ok: bool
    culprit_ranks: list[int]
    missing_ranks: list[int]
    output: str


def run_torch_analyzer(directory: Path, prefix: str, timeout_s: float = 120.0) -> TorchAnalyzerResult:
    """torch.distributed.flight_recorder.fr_trace on the same dumps, for a side-by-side comparison."""
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(directory), "-p", prefix,
         "--allow-incomplete-ranks"],
        capture_output=True, text=True, timeout=timeout_s,
    )
    output = proc.stdout + proc.stderr
    culprits = sorted({int(m) for m in re.findall(r"Culprit rank (\d+)", output)})
    missing: set[int] = set()
    for group in re.findall(r"missing ranks: \{([\d, ]*)\}", output):
        missing.update(int(v) for v in group.split(",") if v.strip())
    return TorchAnalyzerResult(ok=proc.returncode == 0, culprit_ranks=culprits, missing_ranks=sorted(missing),
                               output=output[-4000:])


def normalize_for_torch(source: Path, target: Path) -> list[Path]:
    """Copy gloo dumps with ``pg_config`` keyed by the names the entries use, so torch's analyzer,
    which looks groups up by entry name, does not stop with a KeyError on them."""
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for rank, dump in read_dir(source).items():
        configs = [c for c in dump.pg_config.values() if isinstance(c, dict)]
        fixed: dict[str, Any] = {}
        for entry in dump.entries:
            name, desc = (list(entry.get("process_group") or ["0", ""]) + ["", ""])[:2]
            match = next((c for c in configs if c.get("desc") == desc), configs[0] if len(configs) == 1 else None)
            if match is not None:
                fixed[str(name)] = {**match, "name": str(name), "desc": str(desc)}
        payload = {"version": dump.version, "pg_config": fixed or dump.pg_config, "pg_status": dump.pg_status,
                   "entries": dump.entries}
        path = target / f"rank_{rank}"
        path.write_bytes(pickle.dumps(payload))
        written.append(path)
    return written
