"""What the probe records about a rank: communication ops and the rank's snapshot file.

These plain records are the contract between the in-process probe (which writes them), the supervisor
(which reads them live) and `vigil diagnose` (which reads them after the fact). They import nothing
heavy, so analysis code can use them without torch.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vigil.model import VigilInputError

SNAPSHOT_PATTERN = "rank{rank}.json"
CURRENT_OP_PATTERN = "rank{rank}.cur"
CURRENT_OP_BYTES = 2048
CURRENT_END_BYTES = 64
# After the op and its end: "<heartbeat> <steps> <last_step> <compute_calls> <last_compute> <last_eval>",
# rewritten by the watchdog every tick (a memory write into the mapped file: no system call).
CURRENT_LIVE_BYTES = 192
CURRENT_FILE_BYTES = CURRENT_OP_BYTES + CURRENT_END_BYTES + CURRENT_LIVE_BYTES
STACKS_FILE = "stacks.json"
RUN_FILE = "run.json"
DIAGNOSIS_FILE = "diagnosis.json"
FR_DIR = "fr"
DUMP_REQUEST_FILE = ".dump_request"
# The least silence that makes a hang (`--hang-timeout`, VIGIL_HANG_TIMEOUT): 5 minutes, half of NCCL's default
# 10-minute collective timeout and below ProcessGroupNCCL's 8-minute heartbeat monitor, so the verdict comes
# while the ranks still live to be looked at, and past the pauses of a real job's evaluation or checkpoint. It
# is a floor: a job whose steps or collectives are slower gets 4x its slowest recent one.
DEFAULT_HANG_TIMEOUT_S = 300.0

OP_STATES = ("scheduled", "started", "completed", "failed")
COLLECTIVE = "collective"
P2P = "p2p"


@dataclass
class OpRecord:
    """One collective or point-to-point op as a rank saw it.

    ``seq`` counts collectives per process group (like FR's collective_seq_id); for p2p ops it counts
    ops per (group, peer, direction), so the k-th send of a to b matches the k-th recv of b from a.
    """

    record_id: int
    group: str
    group_ranks: list[int]
    kind: str
    seq: int
    op: str
    sizes: list[list[int]] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    peer: int | None = None
    root: int | None = None
    is_async: bool = False
    state: str = "scheduled"
    t_start: float = 0.0
    t_end: float | None = None
    timeout_s: float | None = None
    thread: str = ""

    @property
    def duration_s(self) -> float | None:
        return None if self.t_end is None else self.t_end - self.t_start

    @property
    def in_flight(self) -> bool:
        return self.state in ("scheduled", "started")

    def signature(self) -> tuple[Any, ...]:
        """What every member of a collective must agree on: op, dtype and element counts."""
        numels = tuple(_numel(s) for s in self.sizes)
        return (self.op, tuple(self.dtypes), numels, self.root)

    def to_dict(self) -> dict[str, Any]:
        # Spelled out: dataclasses.asdict deep-copies and is the probe's hottest cost per op.
        return {
            "record_id": self.record_id,
            "group": self.group,
            "group_ranks": self.group_ranks,
            "kind": self.kind,
            "seq": self.seq,
            "op": self.op,
            "sizes": self.sizes,
            "dtypes": self.dtypes,
            "peer": self.peer,
            "root": self.root,
            "is_async": self.is_async,
            "state": self.state,
            "t_start": self.t_start,
            "t_end": self.t_end,
            "timeout_s": self.timeout_s,
            "thread": self.thread,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OpRecord:
        try:
            return cls(**data)
        except TypeError as err:
            raise VigilInputError(f"bad op record {str(data)[:120]!r}: {err}") from None


def _numel(shape: list[int]) -> int:
    total = 1
    for dim in shape:
        total *= int(dim)
    return total


@dataclass
class RankSnapshot:
    """The state file one rank's probe rewrites every tick (``rank<R>.json``)."""

    rank: int
    world_size: int
    pid: int
    host: str
    heartbeat: float
    started: float
    ops: list[OpRecord] = field(default_factory=list)
    op_count: int = 0
    activity: dict[str, Any] = field(default_factory=dict)
    compute_calls: int = 0
    last_compute: float | None = None
    last_eval: float | None = None
    steps: int = 0
    last_step: float | None = None
    step_times: list[float] = field(default_factory=list)
    error: dict[str, Any] | None = None
    stalled: bool = False
    stacks: list[dict[str, Any]] = field(default_factory=list)
    finished: bool = False

    def last_progress(self) -> float:
        """The latest time this rank started or finished a communication op or a step."""
        times = [self.started]
        for op in self.ops:
            times.append(op.t_start)
            if op.t_end is not None:
                times.append(op.t_end)
        if self.last_step is not None:
            times.append(self.last_step)
        return max(times)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["ops"] = [op.to_dict() for op in self.ops]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "snapshot") -> RankSnapshot:
        if not isinstance(data, dict):
            raise VigilInputError(f"{where}: expected a JSON object")
        try:
            ops = [OpRecord.from_dict(op) for op in data.get("ops", [])]
            fields = {k: v for k, v in data.items() if k != "ops"}
            return cls(ops=ops, **fields)
        except TypeError as err:
            raise VigilInputError(f"{where}: {err}") from None


def snapshot_path(out_dir: Path, rank: int) -> Path:
    return out_dir / SNAPSHOT_PATTERN.format(rank=rank)


def current_op_path(out_dir: Path, rank: int) -> Path:
    return out_dir / CURRENT_OP_PATTERN.format(rank=rank)


def read_current_op(path: Path) -> OpRecord | None:
    """The op a rank began last, as of its start or end: survives an abort inside the op and a
    rank that holds the GIL (whose snapshot writer cannot run)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    return _current_op(raw)


def _current_op(raw: bytes) -> OpRecord | None:
    text = raw[:CURRENT_OP_BYTES].decode(errors="replace").strip(" \x00\n")
    if not text:
        return None
    try:
        record = OpRecord.from_dict(json.loads(text))
    except (json.JSONDecodeError, VigilInputError):
        return None
    # The end slot: "<record_id> <state> <t_end>", written when the op finished.
    end = raw[CURRENT_OP_BYTES:CURRENT_OP_BYTES + CURRENT_END_BYTES].decode(errors="replace").split()
    if len(end) == 3 and end[0] == str(record.record_id):
        try:
            record.state, record.t_end = end[1], float(end[2])
        except ValueError:
            return record
    return record


def _apply_live(snap: RankSnapshot, raw: bytes) -> None:
    """The watchdog's per-tick marks, newer than the snapshot's when the snapshot was not rewritten since."""
    fields = raw[CURRENT_OP_BYTES + CURRENT_END_BYTES:CURRENT_FILE_BYTES].decode(errors="replace").split()
    if len(fields) != 6:
        return
    try:
        heartbeat, steps, last_step, compute_calls, last_compute, last_eval = (float(f) for f in fields)
    except ValueError:
        return
    if heartbeat <= snap.heartbeat:
        return
    snap.heartbeat, snap.steps, snap.compute_calls = heartbeat, int(steps), int(compute_calls)
    snap.last_step = last_step if last_step >= 0 else snap.last_step
    snap.last_compute = last_compute if last_compute >= 0 else snap.last_compute
    snap.last_eval = last_eval if last_eval >= 0 else snap.last_eval


def read_rank(out_dir: Path, rank: int) -> RankSnapshot:
    """A rank's snapshot plus what its current-op file says since: the op it began last and the
    watchdog's latest heartbeat, step and compute marks."""
    snap = read_snapshot(snapshot_path(out_dir, rank))
    try:
        raw = current_op_path(out_dir, rank).read_bytes()
    except FileNotFoundError:
        return snap
    _apply_live(snap, raw)
    current = _current_op(raw)
    if current is None:
        return snap
    for op in snap.ops:
        # A snapshot older than the current op: a synchronous op that the same thread began before
        # the current one has ended by the time the current one started.
        stale = op.in_flight and not op.is_async and op.thread == current.thread
        if stale and op.record_id < current.record_id:
            op.state, op.t_end = "completed", current.t_start
    for index, op in enumerate(snap.ops):
        if op.record_id == current.record_id:
            # The current-op file is written at the op's start and end, so it is never older.
            snap.ops[index] = current
            return snap
    if not snap.ops or current.record_id > snap.ops[-1].record_id:
        snap.ops.append(current)
    return snap


def write_json_atomic(path: Path, payload: str) -> None:
    """Readers never see a half-written file: write aside, then rename over."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(payload)
    os.replace(tmp, path)


def read_snapshot(path: Path) -> RankSnapshot:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise VigilInputError(f"rank snapshot {path} does not exist") from None
    except json.JSONDecodeError as err:
        raise VigilInputError(f"rank snapshot {path} is not valid JSON: {err.msg} at line {err.lineno}") from None
    return RankSnapshot.from_dict(data, where=f"rank snapshot {path}")
