"""The in-process probe: op ledger, compute / step / checkpoint marks, and a watchdog thread.

The watchdog rewrites ``rank<R>.json`` every tick. Its heartbeat stops when the rank holds the GIL
(stuck in a C call, for instance), which is exactly what the out-of-process supervisor looks for.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import socket
import sys
import threading
import time
import traceback
import weakref
from collections import defaultdict, deque
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from vigil.sources.probe.records import (
    CURRENT_END_BYTES,
    CURRENT_FILE_BYTES,
    CURRENT_OP_BYTES,
    DEFAULT_HANG_TIMEOUT_S,
    DUMP_REQUEST_FILE,
    FR_DIR,
    OpRecord,
    RankSnapshot,
    current_op_path,
    snapshot_path,
    write_json_atomic,
)
from vigil.sources.probe.ring import OpRing

SNAPSHOT_OPS = 128
# An op may take this many times its recent worst duration before it counts as stalled.
ADAPTIVE_FACTOR = 4.0
# The full snapshot (ops, step times, stacks) is rewritten at most this often, or at once when something
# the supervisor must see changes (a stall, an error, stacks, a checkpoint mark, the end); the heartbeat,
# step and compute marks and the current op go to the mapped current-op file on every tick / op.
SNAPSHOT_INTERVAL_S = 1.0
STOP_JOIN_S = 5.0  # the longest a job's exit waits for the watchdog to leave its current tick
ENV_NODE_NAME = "VIGIL_NODE_NAME"
_LIVE_START = CURRENT_OP_BYTES + CURRENT_END_BYTES
_LIVE_BYTES = CURRENT_FILE_BYTES - _LIVE_START
_BLANK_END = b" " * CURRENT_END_BYTES


class TorchCallbacks:
    """The Python callbacks the probe hands to torch futures, until torch lets go of them.

    The thread that completes a future (gloo's worker thread, for a CPU collective) runs its callbacks and then
    drops them, and dropping a Python callback takes the GIL again (torch's ``PythonFunctionGuard``). Whoever
    waits on the future - DDP on its comm hook's result, a ``future.wait()`` - is woken before that, so the
    job can reach its end while the worker still has to take the GIL. A thread that takes it while the
    interpreter finalizes is ended by a forced unwind, which aborts the process from that destructor
    ("terminate called without an active exception", SIGABRT) after the job itself finished. ``settle``, called
    at exit, waits until every callback whose future has completed has been dropped; callbacks of futures
    still pending (a collective that never ended) are not waited for."""

    def __init__(self) -> None:
        # Reentrant: a callback freed by the garbage collector while this thread holds the lock calls back in.
        self._cond = threading.Condition(threading.RLock())
        self._held: dict[weakref.ref[Callable[..., Any]], Any] = {}

    def track(self, callback: Callable[..., Any], future: Any) -> Callable[..., Any]:
        """``callback``, about to be given to ``future``; it must be a fresh object, referenced by torch alone."""
        with self._cond:
            self._held[weakref.ref(callback, self._dropped)] = future
        return callback

    def _dropped(self, ref: weakref.ref[Callable[..., Any]]) -> None:
        with self._cond:
            self._held.pop(ref, None)
            self._cond.notify_all()

    def pending(self) -> int:
        """Callbacks of completed futures that torch has not dropped yet."""
        with self._cond:
            futures = list(self._held.values())
        return sum(1 for future in futures if future.done())

    def settle(self, timeout_s: float) -> bool:
        """Wait (releasing the GIL) until torch has dropped the callbacks of every completed future; False when
        ``timeout_s`` passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: self.pending() == 0, timeout_s)


# One per process, like torch's threads.
torch_callbacks = TorchCallbacks()


class Probe:
    """Per-rank recorder; one instance per process, created by :func:`vigil.sources.probe.install`."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        out_dir: Path | None,
        hang_timeout_s: float = DEFAULT_HANG_TIMEOUT_S,
        tick_s: float = 0.25,
        capacity: int = 2048,
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.out_dir = out_dir
        self.hang_timeout_s = hang_timeout_s
        self.tick_s = tick_s
        self.ring = OpRing(capacity)
        self.started = time.time()
        # The machine's name as the cluster knows it (Kubernetes' NODE_NAME, say) when it differs from the
        # hostname; the periodic stacks compare machines across jobs by it.
        self.host = os.environ.get(ENV_NODE_NAME) or socket.gethostname()
        self._seq: dict[str, int] = defaultdict(int)
        self._p2p_seq: dict[tuple[str, int, str], int] = defaultdict(int)
        self._durations: dict[tuple[str, str], deque[float]] = defaultdict(lambda: deque(maxlen=32))
        self._worst: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()
        self.activity: dict[str, Any] = {"kind": "idle", "since": self.started}
        # Bytes a checkpoint save handed to a file object (torch.save of a buffer or stream); with the saving
        # thread's own kernel write counters they tell a slow save from one that stopped.
        self.checkpoint_bytes = 0
        self._checkpoint_written = -1
        self.compute_calls = 0
        # Set by the optimizer step hooks: matmuls without gradients there are the optimizer's, not an evaluation.
        self.in_optimizer_step = False
        self.last_compute: float | None = None
        self.last_eval: float | None = None
        self.steps = 0
        self.last_step: float | None = None
        self.step_times: deque[float] = deque(maxlen=64)
        self.error: dict[str, Any] | None = None
        # OpenTelemetry step spans (vigil.sources.probe.otel), when an endpoint is configured.
        self.step_tracer: Any = None
        self.step_batch: tuple[int, str] | None = None
        self.stalled = False
        self.stacks: list[dict[str, Any]] = []
        self.finished = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._fr_dumped = False
        self._last_payload_version = -1
        self._ops_payload: list[dict[str, Any]] = []
        self._current: mmap.mmap | None = None
        self._current_id = -1
        self._json_cache: dict[str, str] = {}
        # JSON of finished ops (they never change again), by record id: a snapshot encodes each op once.
        self._encoded: dict[int, str] = {}
        self._last_full = 0.0
        self._urgent = False
        # Issued ops whose Work the watchdog polls until it reports completion.
        self._works: dict[int, tuple[OpRecord, Any]] = {}
        # Ops begun and not ended, oldest first, by record id: the stall check reads these, not the whole ring.
        self._in_flight: dict[int, OpRecord] = {}
        # Backend ops per group that are not collectives (p2p ops, the sends inside a monitored barrier): gloo's
        # group sequence number counts them with the collectives, FR's collective_seq_id does not.
        self._p2p_ops: dict[str, int] = defaultdict(int)
        # The Flight Recorder reader (vigil.sources.probe.flight), once the default process group says whether
        # this process's collectives are read from the FR ring; None until then and where they are not.
        self.flight: Any = None
        self.flight_factory: Callable[[Probe], tuple[bool, Any]] | None = None
        self._flight_decided = False
        if out_dir is not None:
            # Mapped shared: a write is a memory store, and what was written stays in the page cache
            # (visible to the supervisor) even if the process aborts the next instant.
            fd = os.open(current_op_path(out_dir, rank), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.ftruncate(fd, CURRENT_FILE_BYTES)
                self._current = mmap.mmap(fd, CURRENT_FILE_BYTES)
            finally:
                os.close(fd)
            self._current[:] = b" " * CURRENT_FILE_BYTES

    # ----------------------------------------------------------------- ops

    def begin_op(
        self,
        group: str,
        group_ranks: list[int],
        kind: str,
        op: str,
        sizes: list[list[int]],
        dtypes: list[str],
        peer: int | None = None,
        root: int | None = None,
        is_async: bool = False,
        pg: Any = None,
    ) -> OpRecord:
        """An op issued through the Python API. With a Flight Recorder reader, a collective on ``pg`` is
        numbered as torch numbers it (so the reader knows it was recorded here)."""
        if kind == "p2p":
            key = (group, -1 if peer is None else peer, op)
            with self._lock:
                self._p2p_seq[key] += 1
                seq = self._p2p_seq[key]
            if self.flight is not None:
                self.flight.note_p2p(group)
        else:
            flight = self.flight if self._flight_decided else self.flight_reader()
            numbered = None if flight is None or pg is None else flight.next_seq(pg, group, self._p2p_ops[group])
            with self._lock:
                self._seq[group] += 1
                seq = self._seq[group] if numbered is None else numbered
        record = OpRecord(
            record_id=self.ring.new_record_id(),
            group=group,
            group_ranks=group_ranks,
            kind=kind,
            seq=seq,
            op=op,
            sizes=sizes,
            dtypes=dtypes,
            peer=peer,
            root=root,
            is_async=is_async,
            state="scheduled" if is_async else "started",
            t_start=time.time(),
            timeout_s=self.timeout_for(group, op),
            thread=threading.current_thread().name,
        )
        self.ring.append(record)
        self._in_flight[record.record_id] = record
        if len(self._in_flight) > self.ring.capacity:
            # Async ops nobody ever waits on stay in flight; past the ring's size they are forgotten with it.
            self._in_flight.pop(next(iter(self._in_flight)), None)
        self._write_current(record)
        return record

    def add_op(
        self,
        group: str,
        group_ranks: list[int],
        kind: str,
        seq: int,
        op: str,
        sizes: list[list[int]],
        dtypes: list[str],
        t_start: float,
        thread: str,
    ) -> OpRecord:
        """An op issued outside Python (DDP's reducer, a compiled graph), as the Flight Recorder ring showed
        it: in flight (``started``) from its enqueue time until the reader sees it completed."""
        record = OpRecord(
            record_id=self.ring.new_record_id(),
            group=group,
            group_ranks=group_ranks,
            kind=kind,
            seq=seq,
            op=op,
            sizes=sizes,
            dtypes=dtypes,
            is_async=True,
            state="started",
            t_start=t_start,
            timeout_s=self.timeout_for(group, op),
            thread=thread,
        )
        self.ring.append(record)
        self._in_flight[record.record_id] = record
        if len(self._in_flight) > self.ring.capacity:
            self._in_flight.pop(next(iter(self._in_flight)), None)
        self._urgent = True
        return record

    def count_p2p(self, group: str, ops: int) -> None:
        """``ops`` backend ops of ``group`` that FR does not number as collectives (see flight.next_seq)."""
        if ops:
            with self._lock:
                self._p2p_ops[group] += ops

    def flight_reader(self) -> Any:
        """The Flight Recorder reader, decided once the default process group exists (None before, and
        where collectives are not read from the ring). ``flight_factory`` (set by the hooks) makes it."""
        if self._flight_decided:
            return self.flight
        if self.flight_factory is None or sys.modules.get("torch.distributed") is None:
            return None
        try:
            decided, reader = self.flight_factory(self)
        except (AttributeError, ImportError):
            # torch.distributed still being imported by another thread: ask again next time.
            return None
        if decided:
            self.flight, self._flight_decided = reader, True
        return self.flight

    def read_flight_recorder(self, failing: bool = False) -> None:
        """Bring the records of collectives issued from C++ up to date now (evidence, error, exit)."""
        flight = self.flight
        if flight is not None:
            with contextlib.suppress(RuntimeError, OSError):
                flight.read(failing=failing)

    def _write_current(self, record: OpRecord) -> None:
        """The op's record into the mapped current-op file at its start (and its end slot at its end, see
        end_op), so an abort inside the op, or a rank whose snapshot writer cannot run, still shows it."""
        if self._current is None:
            return
        self._current_id = record.record_id
        payload = self._encode(record)
        if len(payload) <= CURRENT_OP_BYTES:
            self._current[CURRENT_OP_BYTES:_LIVE_START] = _BLANK_END
            self._current[:CURRENT_OP_BYTES] = payload.encode().ljust(CURRENT_OP_BYTES)

    def _encode(self, record: OpRecord) -> str:
        """JSON of the record, by hand: json.dumps was most of the probe's cost per op."""
        group = self._json_cache.get(record.group)
        if group is None:
            group = self._json_cache[record.group] = json.dumps(record.group)
        thread = self._json_cache.get(record.thread)
        if thread is None:
            thread = self._json_cache[record.thread] = json.dumps(record.thread)
        dtypes = "[" + ",".join(f'"{d}"' for d in record.dtypes) + "]"
        return (
            f'{{"record_id":{record.record_id},"group":{group},"group_ranks":{record.group_ranks},'
            f'"kind":"{record.kind}","seq":{record.seq},"op":"{record.op}","sizes":{record.sizes},'
            f'"dtypes":{dtypes},"peer":{_json_int(record.peer)},"root":{_json_int(record.root)},'
            f'"is_async":{"true" if record.is_async else "false"},"state":"{record.state}",'
            f'"t_start":{record.t_start!r},"t_end":{_json_float(record.t_end)},"timeout_s":{record.timeout_s!r},'
            f'"thread":{thread}}}'
        )

    def end_op(self, record: OpRecord, ok: bool = True, t_end: float | None = None) -> None:
        if not record.in_flight:
            return
        record.t_end = time.time() if t_end is None else t_end
        record.state = "completed" if ok else "failed"
        self._in_flight.pop(record.record_id, None)
        if ok:
            recent = self._durations[(record.group, record.op)]
            recent.append(record.t_end - record.t_start)
            self._worst[(record.group, record.op)] = max(recent)
        self.ring.touch()
        if record.record_id == self._current_id and self._current is not None:
            end = f"{record.record_id} {record.state} {record.t_end!r}".encode()
            self._current[CURRENT_OP_BYTES:_LIVE_START] = end.ljust(CURRENT_END_BYTES)

    def watch_work(self, record: OpRecord, work: Any) -> None:
        """Poll ``work.is_completed()`` until the op ends (NCCL: when the GPU finished it)."""
        if record.in_flight:
            with self._lock:
                self._works[record.record_id] = (record, work)

    def poll_works(self) -> None:
        with self._lock:
            pending = list(self._works.items())
        for record_id, (record, work) in pending:
            if record.in_flight and work.is_completed():
                self.end_op(record, ok=work_succeeded(work))
            if not record.in_flight:
                with self._lock:
                    self._works.pop(record_id, None)

    def mark_waiting(self, record: OpRecord) -> None:
        """An async op's handle is being waited on: from now on the rank is blocked by it."""
        if record.state == "scheduled":
            record.state = "started"
            self.ring.touch()

    def timeout_for(self, group: str, op: str) -> float:
        """The floor, or a multiple of the op's recent worst duration when that is longer."""
        worst = self._worst.get((group, op))
        if worst is None:
            return self.hang_timeout_s
        return max(self.hang_timeout_s, ADAPTIVE_FACTOR * worst)

    # ----------------------------------------------------------------- activity marks

    def compute_begin(self) -> None:
        self.compute_calls += 1
        self.last_compute = time.time()

    def eval_begin(self) -> None:
        """A forward pass without gradients (or of a module in eval mode): an evaluation, not a step."""
        self.compute_calls += 1
        self.last_compute = self.last_eval = time.time()

    def step(self) -> None:
        now = time.time()
        if self.last_step is not None:
            self.step_times.append(now - self.last_step)
        self.steps += 1
        if self.step_tracer is not None:
            batch, device = self.step_batch or (None, None)
            self.step_tracer.record(self.steps, self.last_step or self.started, now, batch, device)
        self.step_batch = None
        self.last_step = now

    def note_batch(self, batch_size: int, device: str) -> None:
        """The batch of the step's first forward: what its span reports."""
        if self.step_batch is None:
            self.step_batch = (batch_size, device)

    def set_activity(self, kind: str, name: str = "") -> None:
        now = time.time()
        self.activity = {"kind": kind, "name": name, "since": now}
        if kind == "checkpoint":
            # progress_at: when the save last wrote a byte (the watchdog moves it on while bytes flow).
            self.activity.update(tid=threading.get_native_id(), progress_at=now, written=0)
            self._checkpoint_written = -1
        self._urgent = True

    def note_checkpoint_progress(self, now: float) -> None:
        """While a checkpoint is saved: move ``progress_at`` on whenever the save wrote something, counted as
        the bytes handed to its file object plus the saving thread's kernel write counters (``wchar``, and
        ``write_bytes`` that grows while one large write() dirties pages)."""
        activity = self.activity
        if activity.get("kind") != "checkpoint":
            return
        written = self.checkpoint_bytes + thread_write_bytes(activity.get("tid"))
        if written != self._checkpoint_written:
            if self._checkpoint_written >= 0:
                activity["progress_at"] = now
                activity["written"] = int(activity.get("written", 0)) + written - self._checkpoint_written
            self._checkpoint_written = written

    def record_error(
        self, exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None
    ) -> None:
        self.error = {
            "ts": time.time(),
            "type": exc_type.__name__,
            "message": str(exc)[:2000],
            "traceback": "".join(traceback.format_exception(exc_type, exc, tb))[-6000:],
        }
        self.read_flight_recorder(failing=True)
        if self.step_tracer is not None:
            batch, device = self.step_batch or (None, None)
            self.step_tracer.record(self.steps + 1, self.last_step or self.started, time.time(), batch, device, exc)
        self.write_snapshot()

    # ----------------------------------------------------------------- snapshot

    def snapshot(self) -> RankSnapshot:
        return RankSnapshot(
            rank=self.rank,
            world_size=self.world_size,
            pid=os.getpid(),
            host=self.host,
            heartbeat=time.time(),
            started=self.started,
            ops=self.ring.tail(SNAPSHOT_OPS),
            op_count=self.ring.total,
            activity=dict(self.activity),
            compute_calls=self.compute_calls,
            last_compute=self.last_compute,
            last_eval=self.last_eval,
            steps=self.steps,
            last_step=self.last_step,
            step_times=list(self.step_times),
            error=self.error,
            stalled=self.stalled,
            stacks=self.stacks,
            finished=self.finished,
        )

    def write_snapshot(self) -> None:
        """Rewrite ``rank<R>.json`` whole (write aside, rename over); each finished op is encoded once."""
        if self.out_dir is None:
            return
        parts = []
        ops = self.ring.tail(SNAPSHOT_OPS)
        for op in ops:
            text = self._encoded.get(op.record_id)
            if text is None:
                finished = not op.in_flight
                text = self._encode(op)
                if finished:
                    self._encoded[op.record_id] = text
            parts.append(text)
        if ops and len(self._encoded) > 2 * SNAPSHOT_OPS:
            oldest = ops[0].record_id
            self._encoded = {k: v for k, v in self._encoded.items() if k >= oldest}
        now = time.time()
        fields = {
            "rank": self.rank,
            "world_size": self.world_size,
            "pid": os.getpid(),
            "host": self.host,
            "heartbeat": now,
            "started": self.started,
            "op_count": self.ring.total,
            "activity": dict(self.activity),
            "compute_calls": self.compute_calls,
            "last_compute": self.last_compute,
            "last_eval": self.last_eval,
            "steps": self.steps,
            "last_step": self.last_step,
            "step_times": list(self.step_times),
            "error": self.error,
            "stalled": self.stalled,
            "stacks": self.stacks,
            "finished": self.finished,
        }
        head = json.dumps(fields)
        write_json_atomic(snapshot_path(self.out_dir, self.rank), head[:-1] + ', "ops": [' + ",".join(parts) + "]}")
        self._last_full = now
        self._urgent = False

    def write_live(self, now: float) -> None:
        """The per-tick marks into the mapped current-op file: a memory write, no system call."""
        if self._current is None:
            return
        live = (f"{now!r} {self.steps} {_or_minus(self.last_step)} {self.compute_calls} "
                f"{_or_minus(self.last_compute)} {_or_minus(self.last_eval)}").encode()
        if len(live) <= _LIVE_BYTES:
            self._current[_LIVE_START:] = live.ljust(_LIVE_BYTES)

    # ----------------------------------------------------------------- watchdog

    def start_watchdog(self) -> None:
        self._thread = threading.Thread(target=self._watch, name="vigil-probe", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.read_flight_recorder()
        self.finished = True
        self._stop.set()
        # Called at exit (atexit runs before the interpreter finalizes): the watchdog must be out of torch's
        # C++ calls by then. A daemon thread that returns from a call that released the GIL while the
        # interpreter finalizes is ended by a forced unwind that aborts the process ("terminate called
        # without an active exception", SIGABRT) after the job itself finished. Bounded: a watchdog stuck in a
        # hung read must not hold the job's exit.
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=STOP_JOIN_S)
        # The same for torch's threads that ran the probe's callbacks (see TorchCallbacks).
        torch_callbacks.settle(STOP_JOIN_S)
        with contextlib.suppress(OSError):
            self.write_snapshot()

    def _watch(self) -> None:
        while not self._stop.wait(self.tick_s):
            flight = self.flight if self._flight_decided else self.flight_reader()
            if flight is not None:
                with contextlib.suppress(RuntimeError):
                    flight.tick(time.time())
            self.poll_works()
            self.check_stall()
            self.answer_dump_request()
            now = time.time()
            self.note_checkpoint_progress(now)
            try:
                self.write_live(now)
                if self._urgent or now - self._last_full >= SNAPSHOT_INTERVAL_S:
                    self.write_snapshot()
            except (OSError, ValueError):
                # The run directory may be gone at shutdown (or the map closed); the probe must never
                # break the job.
                return

    def check_stall(self) -> None:
        """An op in flight past its timeout: remember the in-process stacks while they still matter."""
        now = time.time()
        stalled = any(
            now - op.t_start > (op.timeout_s or self.hang_timeout_s)
            for op in list(self._in_flight.values()) if op.in_flight
        )
        if stalled and not self.stalled:
            self.stacks = python_stacks()
        if stalled != self.stalled:
            self._urgent = True
        self.stalled = stalled

    def answer_dump_request(self) -> None:
        """The supervisor asks for evidence by creating a request file: stacks and FR dump, once.

        The in-process stacks are the fallback when py-spy cannot attach; a rank holding the GIL
        cannot answer at all, which the supervisor reads from its stopped heartbeat.
        """
        if self.out_dir is None or self._fr_dumped or not (self.out_dir / DUMP_REQUEST_FILE).exists():
            return
        self._fr_dumped = True
        self.read_flight_recorder()
        self.stacks = python_stacks()
        self.write_snapshot()
        dump_flight_recorder(self.out_dir / FR_DIR, self.rank)


def thread_write_bytes(tid: Any) -> int:
    """What one thread of this process has written so far (``wchar`` + ``write_bytes`` of
    /proc/self/task/TID/io), 0 where the kernel does not say (not Linux, no such thread)."""
    if not isinstance(tid, int):
        return 0
    try:
        with open(f"/proc/self/task/{tid}/io", "rb") as io:
            fields = dict(line.split(b":", 1) for line in io.read().splitlines() if b":" in line)
        return int(fields.get(b"wchar", 0)) + int(fields.get(b"write_bytes", 0))
    except (OSError, ValueError):
        return 0


def work_succeeded(work: Any) -> bool:
    try:
        return work.exception() is None
    except (RuntimeError, ValueError):
        # Backends that keep no exception object say so by raising; completion is all they report.
        return True


def _json_int(value: int | None) -> str:
    return "null" if value is None else str(int(value))


def _json_float(value: float | None) -> str:
    return "null" if value is None else repr(float(value))


def _or_minus(value: float | None) -> str:
    return "-1" if value is None else repr(value)


def python_stacks() -> list[dict[str, Any]]:
    """Every thread's Python stack, outermost frame first, in py-spy's field names."""
    names = {t.ident: t.name for t in threading.enumerate()}
    stacks = []
    for ident, frame in sys._current_frames().items():
        frames = [
            {"name": f.name, "filename": f.filename, "line": f.lineno}
            for f in traceback.extract_stack(frame)
        ]
        stacks.append({"thread_name": names.get(ident, str(ident)), "frames": frames})
    return stacks


def dump_flight_recorder(fr_dir: Path, rank: int) -> Path | None:
    """Write this rank's PyTorch Flight Recorder buffer (pickle), if torch records one: the ring of the default
    process group's backend (NCCL keeps its own, which ``_dump_fr_trace`` does not show; see flight.py)."""
    from vigil.sources.probe.ringdump import default_backend, flight_recorder_dump

    dump = flight_recorder_dump(default_backend() or "gloo") or flight_recorder_dump("gloo")
    if dump is None:
        return None
    fr_dir.mkdir(parents=True, exist_ok=True)
    path = fr_dir / f"rank_{rank}"
    payload = dump(True, True, False)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(payload)
    os.replace(tmp, path)
    return path
