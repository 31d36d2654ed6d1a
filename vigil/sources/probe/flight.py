"""Collectives issued from C++ (DDP's reducer, compiled graphs) read from torch's in-process Flight Recorder
ring by the probe's watchdog, instead of a Python comm hook in the step.

torch (2.13) keeps a ring of every collective a process group enqueues when ``TORCH_FR_BUFFER_SIZE`` is set
(``vigil launch`` sets 2000), gloo included. Two reads of it, very different in cost:

- the *cursor*: ``_dump_fr_trace(False, False, False)`` returns only ``pg_status`` - per process group the
  backend's counters of ops enqueued and completed (``last_enqueued_collective`` /
  ``last_completed_collective``; on gloo they count p2p ops too, as an entry's ``op_id`` does). About 6 us.
  The watchdog takes it every tick and the optimizer step hook at every step; the times at which the
  completed counter passed an op are that op's end - when the work finished (gloo's worker thread updates
  the counter), not when some Python call returned.
- the *entries*: the whole ring, about 7.5 us per entry (15 ms for 2,000). Read only when something new was
  enqueued since the last read (the cursor says so) and either the job went quiet (no step and no new
  collective for a while: a hang being born) or the periodic interval passed, which is at least 5 s and at
  least 1,000 times the last read's CPU time (reads use at most 0.1% of a core); and once more when the supervisor
  asks for evidence, when a rank raises, and before the process group is destroyed.

Entries the probe's Python wrappers recorded already (``dist.*`` calls, FSDP2, functional collectives) are
recognised by their process group and ``collective_seq_id``: with a reader active, the wrappers number a
collective as torch does - the group's sequence number (``_get_sequence_number_for_group``, which on gloo
counts p2p ops as well, so the group's p2p ops the probe saw are taken off) plus one. The rest become op
records like any other: group, ranks, seq, op, sizes, dtypes, ``started`` while in flight, ``completed``
once the cursor passed them.

Backends. torch keeps one ring per event type, and each has its own dump function (torch 2.13;
``torch/csrc/distributed/c10d/FlightRecorder.cpp``, ``ProcessGroupNCCL.cpp``):

- gloo records into ``FlightRecorder<c10::Event>``, dumped by ``_dump_fr_trace(includeCollectives,
  includeStackTraces, onlyActive)`` (pickle; ``_dump_fr_trace_json(includeCollectives, onlyActive)``). Its
  entries carry no events: ``state`` stays ``scheduled`` (``retired`` turns True) and completion is known from
  the counters alone, which count every op (``op_id``).
- NCCL records into ``FlightRecorder<at::cuda::CUDAEvent>`` (``FlightRecorderCUDA``), dumped by
  ``_dump_nccl_trace`` with the same three arguments (``_dump_nccl_trace_json`` with two), present only in
  CUDA builds; ``_dump_fr_trace`` shows nothing of an NCCL group. The dump's fields are the same (one template,
  ``FlightRecorderDetail.hpp``). What differs:

  - numbering: ``collective_seq_id`` is the group's ``seqCollective_``, bumped once per collective (once per
    coalesced group, whose ops share it; ``op_id`` counts each op and the p2p ops); p2p ops bump ``seqP2P_``
    only. ``_get_sequence_number_for_group()`` returns ``seqCollective_``: the wrappers' numbering (plus one,
    less the p2p ops the group's sequence number counted, which on NCCL are none) fits as it is;
  - counters: ``pg_status`` (``last_enqueued_collective`` / ``last_started_collective`` /
    ``last_completed_collective``) holds the ``seq_`` of a Work: ``seqCollective_`` for a collective,
    ``seqP2P_`` for a p2p op, so on a group that also runs p2p ops the counters mix two numberings and are
    not read there. ``last_completed_collective`` is moved by NCCL's watchdog thread (a pass every 100 ms)
    when the Work's end CUDA event has completed: the GPU finished the kernel. ``last_started_collective``
    moves only with ``TORCH_NCCL_ENABLE_TIMING=1`` (without it there is no start event; -1 on gloo);
  - entry state: every dump queries the CUDA events of the entries not yet retired, so ``state`` is
    ``scheduled`` / ``started`` (start event done; timing only) / ``completed`` (end event done) as of the
    read, and ``time_discovered_completed_ns`` is when torch first saw the end event done (wall-clock ns,
    as ``time_created_ns``: at most a watchdog pass, or the read itself, after the GPU finished);
    ``duration_ms`` (GPU time between the events) is there with ``TORCH_NCCL_ENABLE_TIMING=1``. The ops of a
    coalesced group are recorded without events and never complete by themselves; the group's
    ``nccl:coalesced`` entry (same ``collective_seq_id``) does.

  So on NCCL an op ends at its entry's ``time_discovered_completed_ns``, or when the cursor (on groups
  without p2p ops) first passed its ``collective_seq_id``, whichever the reader sees first.

Which backends are read: ``VIGIL_FR_BACKENDS`` (comma-separated; default ``gloo``). gloo's numbering and
completion are checked by the tests on real jobs; NCCL's are written from torch's source and tested on dumps
built to it, and ``gloo,nccl`` opts NCCL jobs in. Until ``bench/device/cuda_hang.py`` has checked the ring
against the comm hook on a GPU, NCCL jobs keep the comm hook by default.
"""

from __future__ import annotations

import bisect
import os
import pickle
import threading
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from vigil.sources.probe.records import COLLECTIVE, OpRecord
from vigil.sources.probe.ringdump import (
    ENV_FR_BACKENDS,
    FR_BACKENDS,
    RING_FORMATS,
    RingFormat,
    default_backend,
    flight_recorder_dump,
    fr_backends,
)

if TYPE_CHECKING:
    from vigil.sources.probe.probe import Probe

__all__ = [
    "ENV_DDP_RECORDING", "ENV_FR_BACKENDS", "FR_BACKENDS", "RING_FORMATS", "FlightReader", "RingFormat",
    "default_backend", "flight_recorder_dump", "fr_backends", "reader_for", "reader_wanted",
]

# "ring" (the default where it works) or "hook": record DDP's all_reduces through the probe's Python comm hook
# and leave the ring unread.
ENV_DDP_RECORDING = "VIGIL_DDP_RECORDING"
MIN_READ_INTERVAL_S = 5.0
# A full read may use at most this share of a core: the interval is at least its CPU cost divided by it.
READ_COST_SHARE = 0.001
# Quiet: no step and no new collective for this long (at least; see FlightReader.quiet_after) starts a read.
QUIET_MIN_S = 1.0
QUIET_STEP_FACTOR = 1.5
# Between two reads while the job is quiet.
QUIET_READ_GAP_S = 0.5
OBSERVATIONS_KEPT = 4096
# c10 ScalarType names (what FR writes) as torch spells dtypes (what the wrappers write).
_DTYPES = {
    "Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16", "Int": "int32",
    "Long": "int64", "Short": "int16", "Char": "int8", "Byte": "uint8", "Bool": "bool",
    "ComplexFloat": "complex64", "ComplexDouble": "complex128",
}


def reader_wanted() -> bool | None:
    """Whether this process's collectives should be read from the FR ring: None while that cannot be told
    yet (no default process group), else True on a backend listed in ``VIGIL_FR_BACKENDS`` (default gloo)
    whose dump this torch has, with FR on, unless ``VIGIL_DDP_RECORDING=hook``."""
    backend = default_backend()
    if backend is None:
        import torch.distributed as dist

        return None if not dist.is_available() or not dist.is_initialized() else False
    if os.environ.get(ENV_DDP_RECORDING, "ring").strip().lower() == "hook":
        return False
    return backend in fr_backends() and flight_recorder_dump(backend) is not None


def reader_for(probe: Probe) -> tuple[bool, FlightReader | None]:
    """Whether the choice can be made yet, and the reader for ``probe`` where the ring is to be read."""
    wanted = reader_wanted()
    if wanted is None:
        return False, None
    if not wanted:
        return True, None
    backend = default_backend() or "gloo"
    return True, FlightReader(probe, flight_recorder_dump(backend), RING_FORMATS[backend])


class FlightReader:
    """Turns the Flight Recorder ring into the probe's op records; one per probe, driven by its watchdog."""

    def __init__(self, probe: Probe, dump: Any, fmt: RingFormat = RING_FORMATS["gloo"]) -> None:
        self.probe = probe
        self._dump = dump
        self.format = fmt
        # Groups with p2p ops (pg_ids the ring showed them on, names the wrappers saw them on): on NCCL their
        # counters mix two numberings and are not read. pg_id -> group name, as the entries pair them.
        self._p2p_groups: set[str] = set()
        self._p2p_names: set[str] = set()
        self._pg_names: dict[str, str] = {}
        self._lock = threading.Lock()
        # pg_id -> (enqueued, completed), as of the last cursor read.
        self.cursor: dict[str, tuple[int, int]] = {}
        self._enqueued_at_read: dict[str, int] = {}
        self.changed_at = time.time()
        # pg_id -> completed counter values (rising) and the times they were first seen.
        self._seen_values: dict[str, list[int]] = defaultdict(list)
        self._seen_times: dict[str, list[float]] = defaultdict(list)
        # Records of entries still in flight, by (pg_id, the entry's number in the counters' numbering).
        self._pending: dict[tuple[str, int], OpRecord] = {}
        # group name -> the highest collective seq already handled; and the seqs the wrappers recorded.
        self._handled: dict[str, int] = {}
        self._wrapped: dict[str, set[int]] = defaultdict(set)
        self._ranks: dict[str, list[int]] = {}
        self._threads: dict[str, str] = {}
        self.last_read = 0.0
        self.last_cost_s = 0.0
        self.reads = 0
        self.read_s = 0.0
        self.cursor_reads = 0
        self.cursor_s = 0.0

    # ----------------------------------------------------------------- numbering of wrapped collectives

    def next_seq(self, pg: Any, group: str, p2p_ops: int) -> int | None:
        """The ``collective_seq_id`` FR will give the collective about to be issued on ``pg``."""
        try:
            issued = int(pg._get_sequence_number_for_group())
        except (AttributeError, RuntimeError):
            return None
        seq = issued + 1 - p2p_ops
        wrapped = self._wrapped[group]
        wrapped.add(seq)
        if len(wrapped) > 2 * OBSERVATIONS_KEPT:
            floor = seq - OBSERVATIONS_KEPT
            self._wrapped[group] = {s for s in wrapped if s > floor}
        return seq

    # ----------------------------------------------------------------- cursor

    def observe(self, now: float, failing: bool = False) -> None:
        """Read the per-group counters (microseconds) and end the records whose op the counter passed -
        as failed when ``failing`` (the rank raised: what ended since the last look ended with the error)."""
        start = time.thread_time()
        try:
            status = pickle.loads(self._dump(False, False, False)).get("pg_status") or {}
        except (RuntimeError, pickle.UnpicklingError, EOFError):
            return
        with self._lock:
            for pg_id, counters in status.items():
                key = str(pg_id)
                enqueued = int(counters.get("last_enqueued_collective", -1))
                completed = int(counters.get("last_completed_collective", -1))
                if self.cursor.get(key) != (enqueued, completed):
                    if self.cursor.get(key, (None, None))[0] != enqueued:
                        self.changed_at = now
                    self.cursor[key] = (enqueued, completed)
                    values = self._seen_values[key]
                    if not values or completed > values[-1]:
                        values.append(completed)
                        self._seen_times[key].append(now)
                        if len(values) > OBSERVATIONS_KEPT:
                            del values[: len(values) - OBSERVATIONS_KEPT]
                            times = self._seen_times[key]
                            del times[: len(times) - OBSERVATIONS_KEPT]
            done = [(k, r) for k, r in self._pending.items() if k[1] <= self._completed_counter(k[0])]
            for pending, _ in done:
                del self._pending[pending]
        for (pg_id, number), record in done:
            self.probe.end_op(record, ok=not failing, t_end=self._completed_at(pg_id, number, record.t_start) or now)
        self.cursor_reads += 1
        self.cursor_s += time.thread_time() - start

    def note_p2p(self, group: str) -> None:
        """A p2p op issued through the Python API on ``group`` (NCCL: its counters are not read from now on)."""
        if self.format.gpu_events:
            self._p2p_names.add(group)

    def _completed_counter(self, pg_id: str) -> int:
        """The highest op number of ``pg_id`` the completed counter has passed, -1 where it cannot be read
        (NCCL: a group with p2p ops, whose counter then holds p2p numbers too)."""
        if self.format.gpu_events and (pg_id in self._p2p_groups or self._pg_names.get(pg_id) in self._p2p_names):
            return -1
        values = self._seen_values.get(pg_id)
        return values[-1] if values else self.cursor.get(pg_id, (-1, -1))[1]

    def _completed_at(self, pg_id: str, number: int, t_start: float) -> float | None:
        """The first time the completed counter of ``pg_id`` was seen at or past ``number``."""
        values = self._seen_values.get(pg_id)
        if not values:
            return None
        index = bisect.bisect_left(values, number)
        if index >= len(values):
            return None
        return max(self._seen_times[pg_id][index], t_start)

    # ----------------------------------------------------------------- full reads

    def quiet_after(self) -> float:
        """How long without a step or a new collective before the ring is read: a rank waiting in (or
        stuck before) a collective shows within the hang timeout, a normal step does not trigger it."""
        times = sorted(self.probe.step_times)
        typical = times[len(times) // 2] if times else 0.0
        return min(self.probe.hang_timeout_s / 3, max(QUIET_MIN_S, QUIET_STEP_FACTOR * typical))

    def due(self, now: float) -> bool:
        with self._lock:
            dirty = any(self._enqueued_at_read.get(k) != v[0] for k, v in self.cursor.items())
        if not dirty:
            return False
        since = now - self.last_read
        if since >= max(MIN_READ_INTERVAL_S, self.last_cost_s / READ_COST_SHARE):
            return True
        last_step = self.probe.last_step or self.probe.started
        quiet = now - max(self.changed_at, last_step)
        return quiet >= self.quiet_after() and since >= QUIET_READ_GAP_S

    def tick(self, now: float) -> bool:
        """The watchdog's turn: the cursor always, the entries when due. True when records were added."""
        self.observe(now)
        return self.read(now) > 0 if self.due(now) else False

    def read(self, now: float | None = None, failing: bool = False) -> int:
        """Read the whole ring; add a record for every collective not seen yet. Returns how many. ``failing``:
        the rank raised just now - a collective whose end is first seen by this read ended with the error (gloo
        moves its counters for a failed work too: a peer that left fails the all_reduce DDP waits in)."""
        now = time.time() if now is None else now
        start = time.thread_time()
        try:
            data = pickle.loads(self._dump(True, False, False))
        except (RuntimeError, pickle.UnpicklingError, EOFError):
            return 0
        self.observe(now, failing=failing)
        status = data.get("pg_status") or {}
        added = 0
        with self._lock:
            self._enqueued_at_read = {str(k): int(v.get("last_enqueued_collective", -1)) for k, v in status.items()}
        entries = data.get("entries") or []
        finished = self._gpu_finished(entries) if self.format.gpu_events else {}
        for entry in entries:
            if entry.get("is_p2p"):
                continue
            record = self._record(entry, now if failing else None, finished)
            if record is not None:
                added += 1
        if finished:
            self._end_finished(finished, now if failing else None)
        # CPU time of the reading thread: waiting for the GIL under load is not the read's cost.
        cost = time.thread_time() - start
        self.last_read, self.last_cost_s = now, cost
        self.reads += 1
        self.read_s += cost
        return added

    def _gpu_finished(self, entries: list[dict[str, Any]]) -> dict[tuple[str, int], float]:
        """NCCL: (pg_id, collective_seq_id) -> when torch saw the GPU finish it, from the entries whose end
        CUDA event has completed (the dump queries them). Notes the groups with p2p ops on the way."""
        finished: dict[tuple[str, int], float] = {}
        for entry in entries:
            try:
                pg_id = str(entry.get("pg_id", (entry.get("process_group") or ["0"])[0]))
                if entry.get("is_p2p"):
                    self._p2p_groups.add(pg_id)
                    continue
                if entry.get("state") != "completed":
                    continue
                seq = int(entry["collective_seq_id"])
                seen_ns = int(entry.get("time_discovered_completed_ns") or 0)
            except (KeyError, TypeError, ValueError, IndexError):
                continue
            finished[(pg_id, seq)] = seen_ns / 1e9 if seen_ns > 0 else time.time()
        return finished

    def _end_finished(self, finished: dict[tuple[str, int], float], failed_since: float | None) -> None:
        """End the records still in flight whose collective the GPU has finished since an earlier read."""
        with self._lock:
            done = [(key, record) for key, record in self._pending.items() if key in finished]
            for key, _ in done:
                del self._pending[key]
        for key, record in done:
            t_end = max(finished[key], record.t_start)
            self.probe.end_op(record, ok=failed_since is None or t_end < failed_since, t_end=t_end)

    def _record(
        self, entry: dict[str, Any], failed_since: float | None = None,
        finished: dict[tuple[str, int], float] | None = None,
    ) -> OpRecord | None:
        try:
            group = str((entry.get("process_group") or ["0"])[0])
            seq = int(entry["collective_seq_id"])
            pg_id = str(entry.get("pg_id", group))
            number = int(entry.get(self.format.counter_key, seq))
        except (KeyError, TypeError, ValueError, IndexError):
            return None
        self._pg_names.setdefault(pg_id, group)
        if seq <= self._handled.get(group, 0):
            return None
        self._handled[group] = seq
        if seq in self._wrapped.get(group, ()):
            return None
        probe = self.probe
        t_start = int(entry.get("time_created_ns") or 0) / 1e9 or time.time()
        gpu_end = (finished or {}).get((pg_id, seq))
        completed = gpu_end is not None or self._completed_counter(pg_id) >= number
        record = probe.add_op(
            group=group,
            group_ranks=self._group_ranks(group),
            kind=COLLECTIVE,
            seq=seq,
            op=str(entry.get("profiling_name", "?")).split(":", 1)[-1].split(" ")[0],
            sizes=[list(s) for s in entry.get("input_sizes") or []],
            dtypes=[_DTYPES.get(str(d), str(d).lower()) for d in entry.get("input_dtypes") or []],
            t_start=t_start,
            thread=self._thread_name(str(entry.get("thread_id", "")), str(entry.get("thread_name", ""))),
        )
        if completed:
            if gpu_end is not None:
                t_end = max(gpu_end, t_start)
            else:
                t_end = self._completed_at(pg_id, number, t_start) or time.time()
            probe.end_op(record, ok=failed_since is None or t_end < failed_since, t_end=t_end)
        else:
            with self._lock:
                self._pending[(pg_id, number)] = record
        return record

    def _group_ranks(self, group: str) -> list[int]:
        ranks = self._ranks.get(group)
        if ranks is None:
            import torch.distributed as dist

            ranks = []
            try:
                for pg, name in dist.distributed_c10d._world.pg_names.items():
                    if str(name) == group:
                        ranks = list(dist.get_process_group_ranks(pg))
                        break
            except (RuntimeError, ValueError, AttributeError):
                ranks = []
            self._ranks[group] = ranks
        return ranks

    def _thread_name(self, thread_id: str, fallback: str) -> str:
        """FR names a thread by its pthread id, which is what ``threading`` calls its ident."""
        name = self._threads.get(thread_id)
        if name is None:
            names = {str(t.ident): t.name for t in threading.enumerate()}
            name = names.get(thread_id, fallback)
            self._threads[thread_id] = name
        return name

    def stats(self) -> dict[str, float]:
        return {"reads": self.reads, "read_s": round(self.read_s, 6), "last_read_cost_s": round(self.last_cost_s, 6),
                "cursor_reads": self.cursor_reads, "cursor_s": round(self.cursor_s, 6)}
