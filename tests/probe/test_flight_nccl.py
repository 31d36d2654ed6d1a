"""The Flight Recorder ring reader on NCCL's ring (vigil.sources.probe.flight), without a GPU.

No NCCL build here, so the dumps are built: every field is copied from a real dump that this torch writes
(a one-rank gloo group in a subprocess: ``_dump_fr_trace``, the same ``FlightRecorder<EventType>`` template
that ``_dump_nccl_trace`` pickles, FlightRecorderDetail.hpp ``getCollectiveTrace`` / ``getPgStatus``), and
only the values are set as ProcessGroupNCCL sets them (torch 2.13 source, ProcessGroupNCCL.cpp):

- ``profiling_name`` ``nccl:<op>``; ``collective_seq_id`` is ``seqCollective_`` (once per collective, shared by
  the ops of a coalesced group), ``p2p_seq_id`` is ``seqP2P_``, ``op_id`` counts every op;
- ``state`` / ``time_discovered_*_ns`` from the Work's CUDA events as the dump queries them (``completed`` once
  the end event is done), ``duration_ms`` with timing; the ops of a coalesced group have no events and stay
  ``scheduled``, the group's ``nccl:coalesced`` entry carries them;
- ``pg_status`` holds the ``seq_`` of the last Work enqueued / completed: ``seqCollective_`` for a collective,
  ``seqP2P_`` for a p2p op.

The reader, the probe and its records are Vigil's own, unmocked; only torch's dump function is replaced by
the built dumps. What this cannot show (that a real NCCL ring reads so) is bench/device/cuda_hang.py's job.
"""

from __future__ import annotations

import copy
import os
import pickle
import subprocess
import sys
import time
from typing import Any

import pytest

from vigil.sources.probe.flight import (
    ENV_FR_BACKENDS,
    RING_FORMATS,
    FlightReader,
    flight_recorder_dump,
    fr_backends,
)
from vigil.sources.probe.probe import Probe

GLOO_DUMP = """
import pickle, sys, tempfile
import torch, torch.distributed as dist
from torch._C._distributed_c10d import _dump_fr_trace
store = dist.FileStore(tempfile.mkdtemp() + "/store", 1)
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
dist.all_reduce(torch.ones(4))
sys.stdout.buffer.write(_dump_fr_trace(True, False, False))
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def torch_dump() -> dict[str, Any]:
    """A dump as this torch writes it (pickle of one collective's entry and its group's status)."""
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "20"}
    out = subprocess.run([sys.executable, "-c", GLOO_DUMP], env=env, capture_output=True, timeout=120, check=True)
    data = pickle.loads(out.stdout)
    assert data["entries"] and set(data["pg_status"]["0"]) == {
        "last_enqueued_collective", "last_started_collective", "last_completed_collective"}
    return data


class NcclRing:
    """NCCL's ring of one default group as torch would dump it at each moment; ``dump`` is what
    ``_dump_nccl_trace(includeCollectives, includeStackTraces, onlyActive)`` returns."""

    def __init__(self, template: dict[str, Any]) -> None:
        self.template = template
        self.entries: list[dict[str, Any]] = []
        self.enqueued = self.started = self.completed = -1
        self.seq_collective = self.seq_p2p = self.op_id = 0

    def enqueue(self, op: str, created: float, p2p: bool = False, coalesced_ops: int = 0) -> list[dict[str, Any]]:
        """One Work (``coalesced_ops`` > 0: a coalesced group of that many ops and its ``nccl:coalesced``
        entry); returns the entry that carries the Work's events last."""
        base = self.template["entries"][0]
        if p2p:
            self.seq_p2p += 1
        else:
            self.seq_collective += 1
        added = []
        for index in range(max(coalesced_ops, 1) + (1 if coalesced_ops else 0)):
            last = index == max(coalesced_ops, 1) + (1 if coalesced_ops else 0) - 1
            if not coalesced_ops or not last:
                self.op_id += 1
            entry = copy.deepcopy(base)
            entry.update(
                record_id=len(self.entries), collective_seq_id=self.seq_collective, p2p_seq_id=self.seq_p2p,
                op_id=self.op_id, profiling_name="nccl:coalesced" if coalesced_ops and last else f"nccl:{op}",
                time_created_ns=int(created * 1e9), state="scheduled", time_discovered_started_ns=None,
                time_discovered_completed_ns=None, retired=False, is_p2p=p2p,
                # The ops inside a coalesced group are recorded without CUDA events.
                _events=last,
            )
            self.entries.append(entry)
            added.append(entry)
        self.enqueued = self.seq_p2p if p2p else self.seq_collective
        return added

    def gpu_finishes(self, entry: dict[str, Any], at: float, watchdog_retires: bool = True) -> None:
        """The Work's end event completed; NCCL's watchdog retires it (``lastCompletedSeq = work.seq_``)."""
        assert entry["_events"]
        entry.update(state="completed", time_discovered_completed_ns=int(at * 1e9), retired=watchdog_retires)
        if watchdog_retires:
            self.completed = entry["p2p_seq_id"] if entry["is_p2p"] else entry["collective_seq_id"]

    def dump(self, include_collectives: bool = True, include_stack_traces: bool = True,
             only_active: bool = False) -> bytes:
        data = {k: copy.deepcopy(v) for k, v in self.template.items() if k != "entries"}
        data["pg_status"] = {"0": {"last_enqueued_collective": self.enqueued,
                                   "last_started_collective": self.started,
                                   "last_completed_collective": self.completed}}
        if include_collectives:
            data["entries"] = [{k: v for k, v in e.items() if k != "_events"} for e in self.entries
                               if not (only_active and e["state"] == "completed")]
        return pickle.dumps(data)


def reader_on(ring: NcclRing) -> tuple[Probe, FlightReader]:
    probe = Probe(rank=0, world_size=1, out_dir=None, hang_timeout_s=30.0)
    return probe, FlightReader(probe, ring.dump, RING_FORMATS["nccl"])


def records(probe: Probe) -> list[Any]:
    return [op for op in probe.ring.tail(probe.ring.capacity) if op.kind == "collective"]


def test_the_built_entries_have_the_fields_torch_writes(torch_dump: dict[str, Any]) -> None:
    ring = NcclRing(torch_dump)
    ring.enqueue("all_reduce", time.time())
    built = pickle.loads(ring.dump())
    assert set(built["entries"][0]) == set(torch_dump["entries"][0])
    assert set(built) == set(torch_dump)


def test_an_nccl_op_ends_when_the_gpu_finished_it_not_when_it_was_enqueued(torch_dump: dict[str, Any]) -> None:
    ring = NcclRing(torch_dump)
    t0 = time.time() - 60
    first, = ring.enqueue("all_reduce", t0)
    second, = ring.enqueue("all_reduce", t0 + 0.1)
    third, = ring.enqueue("broadcast", t0 + 0.2)
    # The GPU finished the first 2 s after its enqueue; the dump saw the event before the watchdog did.
    ring.gpu_finishes(first, t0 + 2.0, watchdog_retires=False)
    probe, reader = reader_on(ring)
    assert reader.read(t0 + 2.5) == 3
    ops = records(probe)
    assert [(op.seq, op.op) for op in ops] == [(1, "all_reduce"), (2, "all_reduce"), (3, "broadcast")]
    assert ops[0].state == "completed" and ops[0].t_end == pytest.approx(t0 + 2.0)
    assert [op.state for op in ops[1:]] == ["started", "started"]
    # NCCL's watchdog retires the second: the cursor (a group without p2p ops) ends it at the probe's look.
    ring.gpu_finishes(second, t0 + 3.0)
    reader.observe(t0 + 3.2)
    assert ops[1].state == "completed" and ops[1].t_end == pytest.approx(t0 + 3.2)
    assert ops[2].state == "started"
    # The third ends at the time torch saw its end event, read from the entry by a later full read.
    ring.gpu_finishes(third, t0 + 4.0, watchdog_retires=False)
    reader.read(t0 + 9.0)
    assert ops[2].state == "completed" and ops[2].t_end == pytest.approx(t0 + 4.0)
    assert len(records(probe)) == 3


def test_counters_of_a_group_with_p2p_ops_are_not_read(torch_dump: dict[str, Any]) -> None:
    ring = NcclRing(torch_dump)
    t0 = time.time() - 60
    collective, = ring.enqueue("all_reduce", t0)
    for index in range(5):
        send, = ring.enqueue("send 0->1", t0 + 0.1 * (index + 1), p2p=True)
        ring.gpu_finishes(send, t0 + 0.5)
    # pg_status now holds p2p number 5, past the collective's seq 1, which the GPU has not finished.
    assert pickle.loads(ring.dump(False, False, False))["pg_status"]["0"]["last_completed_collective"] == 5
    probe, reader = reader_on(ring)
    reader.read(t0 + 1.0)
    reader.observe(t0 + 1.5)
    op, = records(probe)
    assert (op.seq, op.state) == (1, "started")
    ring.gpu_finishes(collective, t0 + 2.0)
    reader.observe(t0 + 2.5)
    assert op.state == "started"
    reader.read(t0 + 8.0)
    assert op.state == "completed" and op.t_end == pytest.approx(t0 + 2.0)


def test_p2p_ops_seen_by_the_wrappers_stop_the_counters_being_read(torch_dump: dict[str, Any]) -> None:
    ring = NcclRing(torch_dump)
    t0 = time.time() - 60
    ring.enqueue("all_reduce", t0)
    probe, reader = reader_on(ring)
    reader.read(t0 + 0.5)
    # A send issued from Python after the read; NCCL's counters then hold its p2p number (1), not a seq.
    reader.note_p2p("0")
    ring.enqueue("send 0->1", t0 + 0.6, p2p=True)
    ring.completed = 1
    reader.observe(t0 + 1.0)
    op, = records(probe)
    assert op.state == "started"


def test_a_coalesced_group_is_one_record_ended_by_its_coalesced_entry(torch_dump: dict[str, Any]) -> None:
    ring = NcclRing(torch_dump)
    t0 = time.time() - 60
    entries = ring.enqueue("all_reduce", t0, coalesced_ops=3)
    assert [e["collective_seq_id"] for e in entries] == [1, 1, 1, 1] and entries[-1]["op_id"] == 3
    ring.gpu_finishes(entries[-1], t0 + 1.5, watchdog_retires=False)
    probe, reader = reader_on(ring)
    reader.read(t0 + 2.0)
    op, = records(probe)
    assert (op.seq, op.op, op.state) == (1, "all_reduce", "completed")
    assert op.t_end == pytest.approx(t0 + 1.5)


def test_which_backends_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_FR_BACKENDS, raising=False)
    assert fr_backends() == ("gloo",)
    monkeypatch.setenv(ENV_FR_BACKENDS, "gloo, NCCL")
    assert fr_backends() == ("gloo", "nccl")
    monkeypatch.setenv(ENV_FR_BACKENDS, "nccl,mpi")
    assert fr_backends() == ("nccl",)
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "2000")
    import torch._C._distributed_c10d as c10d

    assert flight_recorder_dump("gloo") is c10d._dump_fr_trace
    # NCCL's ring has its own dump, only in CUDA builds: without it the NCCL job keeps the comm hook.
    assert flight_recorder_dump("nccl") is getattr(c10d, "_dump_nccl_trace", None)
    assert flight_recorder_dump("mpi") is None
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "0")
    assert flight_recorder_dump("gloo") is None
