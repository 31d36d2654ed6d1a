"""The probe inside a real (one-rank) gloo process group: hooks, ring buffer, snapshot files."""

from __future__ import annotations

import copy
import io
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from vigil.sources.probe.hooks import ProbedWork, _global_rank, _watch_future, install_hooks, uninstall_hooks
from vigil.sources.probe.probe import Probe, torch_callbacks
from vigil.sources.probe.records import COLLECTIVE, OpRecord, read_rank, read_snapshot, snapshot_path
from vigil.sources.probe.ring import OpRing


@pytest.fixture()
def probe(tmp_path: Path) -> Iterator[Probe]:
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    probe = Probe(rank=0, world_size=1, out_dir=tmp_path, hang_timeout_s=5.0)
    install_hooks(probe)
    try:
        yield probe
    finally:
        uninstall_hooks()
        dist.destroy_process_group()


def test_collectives_are_recorded_with_sequence_shape_and_state(probe: Probe) -> None:
    dist.all_reduce(torch.ones(3, 4))
    dist.broadcast(torch.ones(2), src=0)
    work = dist.all_reduce(torch.ones(5), async_op=True)
    assert isinstance(work, ProbedWork)
    work.wait()
    dist.barrier()
    ops = probe.ring.tail(10)
    assert [(op.op, op.seq) for op in ops] == [("all_reduce", 1), ("broadcast", 2), ("all_reduce", 3), ("barrier", 4)]
    assert ops[0].sizes == [[3, 4]] and ops[0].dtypes == ["float32"]
    assert ops[1].root == 0
    assert ops[2].is_async
    assert all(op.state == "completed" and op.duration_s is not None for op in ops)
    assert ops[0].group_ranks == [0]


def test_compute_step_and_checkpoint_marks(probe: Probe) -> None:
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = probe.compute_calls
    torch.matmul(torch.ones(2, 2), torch.ones(2, 2))
    _ = torch.ones(2, 2) @ torch.ones(2, 2)
    assert probe.compute_calls == before + 2
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    assert probe.steps == 1
    seen = []

    class Recorder(io.RawIOBase):
        def writable(self) -> bool:
            return True

        def write(self, data: bytes) -> int:  # type: ignore[override]
            seen.append(probe.activity["kind"])
            return len(data)

    torch.save({"w": torch.ones(3)}, Recorder())
    assert set(seen) == {"checkpoint"}
    assert probe.activity["kind"] != "checkpoint"
    # A convolution without gradients marks evaluation, as a matmul does (a CNN evaluated on the bare model).
    with torch.no_grad():
        torch.nn.Conv2d(1, 2, 3)(torch.ones(1, 1, 5, 5))
    assert probe.last_eval is not None and time.time() - probe.last_eval < 5
    # A bare matmul without gradients is compute, not evaluation (a power iteration that never converges).
    evaluated, calls = probe.last_eval, probe.compute_calls
    with torch.no_grad():
        torch.ones(3, 3) @ torch.ones(3, 3)
    assert probe.last_eval == evaluated and probe.compute_calls == calls + 1


def test_checkpoint_progress_follows_the_bytes_a_save_writes(probe: Probe, tmp_path: Path) -> None:
    """The watchdog moves ``progress_at`` on while a save writes (to a file object, or a path through the
    saving thread's kernel counters) and leaves it where it was while the save writes nothing."""
    marks: list[tuple[float, int]] = []

    class Storage(io.RawIOBase):
        def __init__(self, stall_after: int) -> None:
            self.calls = 0
            self.stall_after = stall_after

        def writable(self) -> bool:
            return True

        def write(self, data: bytes) -> int:  # type: ignore[override]
            self.calls += 1
            if self.calls <= self.stall_after:
                probe.note_checkpoint_progress(time.time())
                marks.append((float(probe.activity["progress_at"]), int(probe.activity["written"])))
            return len(data)

    torch.save({"w": torch.ones(300)}, Storage(stall_after=10))
    assert len(marks) >= 3
    assert marks[-1][1] > marks[1][1] > 0, "bytes handed to the file object count as progress"
    assert marks[-1][0] > marks[0][0]
    probe.set_activity("checkpoint", "save")
    begun = probe.activity["progress_at"]
    probe.note_checkpoint_progress(time.time())
    (tmp_path / "ckpt").write_bytes(b"x" * 4096)  # this thread writes through the kernel
    probe.note_checkpoint_progress(time.time())
    assert probe.activity["progress_at"] > begun and probe.activity["written"] >= 4096
    quiet = probe.activity["progress_at"]
    probe.note_checkpoint_progress(time.time() + 5)
    assert probe.activity["progress_at"] == quiet, "nothing written: no progress"


def test_snapshot_and_current_op_files(probe: Probe, tmp_path: Path) -> None:
    dist.all_reduce(torch.ones(2))
    probe.write_snapshot()
    snap = read_snapshot(snapshot_path(tmp_path, 0))
    assert snap.op_count == 1 and snap.ops[0].op == "all_reduce"
    # An op begun after the last snapshot is still visible through the current-op file.
    record = probe.begin_op("0", [0], "collective", "all_gather", [[2]], ["float32"])
    merged = read_rank(tmp_path, 0)
    assert merged.ops[-1].record_id == record.record_id
    assert merged.ops[-1].in_flight
    assert json.loads(snapshot_path(tmp_path, 0).read_text())["rank"] == 0


def test_watchdog_marks_reach_the_reader_without_a_snapshot_rewrite(probe: Probe, tmp_path: Path) -> None:
    """Heartbeat, steps and compute marks go through the mapped current-op file every tick; the full
    snapshot is rewritten at most once a second, so the reader must take the newer marks from there."""
    probe.write_snapshot()
    written = snapshot_path(tmp_path, 0).read_bytes()
    first = read_rank(tmp_path, 0)
    probe.step()
    probe.step()
    probe.compute_begin()
    later = first.heartbeat + 0.5
    probe.write_live(later)
    assert snapshot_path(tmp_path, 0).read_bytes() == written
    merged = read_rank(tmp_path, 0)
    assert (merged.heartbeat, merged.steps) == (later, 2)
    assert merged.last_step == probe.last_step and merged.last_compute == probe.last_compute
    assert merged.compute_calls == probe.compute_calls
    # An op ended after the snapshot: its end slot says so, in the same file.
    record = probe.begin_op("0", [0], "collective", "all_reduce", [[2]], ["float32"])
    probe.end_op(record)
    [op] = [o for o in read_rank(tmp_path, 0).ops if o.record_id == record.record_id]
    assert op.state == "completed" and op.t_end == record.t_end


def test_functional_collectives_run_from_the_call_to_the_wait(probe: Probe) -> None:
    import torch.distributed._functional_collectives as funcol

    reduced = funcol.all_reduce(torch.ones(4), "sum", dist.group.WORLD)
    [record] = probe.ring.tail(1)
    assert (record.op, record.group_ranks, record.sizes, record.state) == ("all_reduce", [0], [[4]], "scheduled")
    assert torch.equal(reduced + 0, torch.ones(4))  # first use waits
    assert record.state == "completed" and record.t_end is not None
    parts = funcol.all_reduce_coalesced([torch.ones(2), torch.ones(3)], "sum", dist.group.WORLD)
    [coalesced] = probe.ring.tail(1)
    assert coalesced.op == "all_reduce_coalesced" and coalesced.sizes == [[2], [3]]
    parts[0].wait()
    assert coalesced.in_flight, "one of two results waited on: the op is not over"
    parts[1].wait()
    assert coalesced.state == "completed"


def test_adaptive_timeout_has_a_floor(probe: Probe) -> None:
    assert probe.timeout_for("0", "all_reduce") == 5.0
    for duration in (0.1, 3.0, 0.2):
        record = probe.begin_op("0", [0], "collective", "all_reduce", [[1]], ["float32"])
        record.t_start -= duration
        probe.end_op(record)
    assert probe.timeout_for("0", "all_reduce") == pytest.approx(12.0, rel=0.01)


def test_uninstall_restores_torch() -> None:
    original = dist.all_reduce
    probe = Probe(rank=0, world_size=1, out_dir=None)
    install_hooks(probe)
    assert dist.all_reduce is not original
    uninstall_hooks()
    assert dist.all_reduce is original


def test_ring_is_bounded() -> None:
    ring = OpRing(capacity=3)
    for index in range(5):
        ring.append(OpRecord(record_id=ring.new_record_id(), group="0", group_ranks=[0], kind="collective",
                             seq=index, op="all_reduce"))
    assert [op.seq for op in ring.tail(10)] == [2, 3, 4]
    assert ring.total == 5
    with pytest.raises(ValueError):
        OpRing(capacity=0)


def test_install_stays_callable_after_first_use(tmp_path: Path) -> None:
    import sys
    import threading

    import vigil.sources.probe
    from vigil.sources.probe import activate

    hooks_before = (sys.excepthook, threading.excepthook)
    first = vigil.sources.probe.install(tmp_path)
    try:
        assert callable(vigil.sources.probe.install)
        assert vigil.sources.probe.install() is first
    finally:
        first.stop()
        uninstall_hooks()
        activate._probe = None
        sys.excepthook, threading.excepthook = hooks_before


def test_each_process_group_has_its_own_sequence(probe: Probe) -> None:
    sub = dist.new_group([0])
    dist.all_reduce(torch.ones(2))
    dist.all_reduce(torch.ones(2), group=sub)
    dist.all_reduce(torch.ones(2), group=sub)
    ops = probe.ring.tail(10)
    groups = {op.group for op in ops}
    assert len(groups) == 2
    by_group = {g: [op.seq for op in ops if op.group == g] for g in groups}
    assert sorted(by_group.values()) == [[1], [1, 2]]


def test_rank_comes_from_torchrun_or_slurm_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    from vigil.model import VigilInputError
    from vigil.sources.probe.activate import RANK_VARS, WORLD_SIZE_VARS, _env_int

    for name in (*RANK_VARS, *WORLD_SIZE_VARS):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_PROCID", "5")
    monkeypatch.setenv("SLURM_NTASKS", "8")
    assert (_env_int(RANK_VARS, 0), _env_int(WORLD_SIZE_VARS, 1)) == (5, 8)
    monkeypatch.setenv("RANK", "2")
    assert _env_int(RANK_VARS, 0) == 2
    monkeypatch.setenv("RANK", "two")
    with pytest.raises(VigilInputError, match="RANK='two' is not an integer"):
        _env_int(RANK_VARS, 0)


def test_ddp_collectives_are_seen_and_an_earlier_user_hook_is_kept(tmp_path: Path) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    probe = Probe(rank=0, world_size=1, out_dir=tmp_path, hang_timeout_s=5.0)
    try:
        # Registered before the probe is installed: DDP refuses a second hook, the probe must not break the job.
        early = DistributedDataParallel(torch.nn.Linear(4, 2))
        early.register_comm_hook(None, allreduce_hook)
        builtin = DistributedDataParallel(torch.nn.Linear(4, 2))
        builtin._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
        install_hooks(probe)
        plain = DistributedDataParallel(torch.nn.Linear(4, 2))
        for model in (early, builtin, plain):
            model(torch.ones(3, 4)).sum().backward()
        # The probe's hook on the plain model and the user's Python hook both pass through the wrappers;
        # the built-in C++ hook does not.
        ops = [op for op in probe.ring.tail(10) if op.op == "all_reduce"]
        assert len(ops) == 2 and all(op.state == "completed" and op.is_async for op in ops)
    finally:
        uninstall_hooks()
        dist.destroy_process_group()


def test_forward_marks_move_from_every_module_to_the_roots_at_the_first_step(probe: Probe) -> None:
    from torch.nn.modules import module as torch_module

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    loss_fn = torch.nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert torch_module._global_forward_pre_hooks
    loss_fn(model(torch.ones(3, 4)), torch.zeros(3, 2)).backward()
    optimizer.step()
    # After the first step only the modules called outside any other carry a hook: the inner ones are back
    # on nn.Module's fast path.
    assert not torch_module._global_forward_pre_hooks
    assert model._forward_pre_hooks and loss_fn._forward_pre_hooks
    assert not any(inner._forward_pre_hooks for inner in model)
    assert probe.step_batch is None
    marked = probe.last_compute
    model(torch.ones(5, 4))
    assert probe.last_compute is not None and marked is not None and probe.last_compute > marked
    assert probe.step_batch == (5, "cpu")
    # An evaluation model first called after the step: its matmuls without gradients mark evaluation.
    evaluator = torch.nn.Linear(4, 4)
    before = probe.last_eval
    with torch.no_grad():
        evaluator(torch.ones(1, 4))
    assert probe.last_eval is not None and probe.last_eval != before
    # What was learned outlives taking the hooks out and back in.
    uninstall_hooks()
    assert not model._forward_pre_hooks
    install_hooks(probe)
    assert model._forward_pre_hooks and not torch_module._global_forward_pre_hooks


def test_forward_marks_learn_again_when_the_model_is_replaced(probe: Probe) -> None:
    import gc

    from torch.nn.modules import module as torch_module

    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    assert model._forward_pre_hooks and not torch_module._global_forward_pre_hooks
    del model, optimizer
    gc.collect()
    # Every root is gone: the next step goes back to the global hook, and the new model's forwards are seen.
    replacement = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(replacement.parameters(), lr=0.1)
    optimizer.step()
    assert torch_module._global_forward_pre_hooks
    replacement(torch.ones(3, 4)).sum().backward()
    optimizer.step()
    assert replacement._forward_pre_hooks and not torch_module._global_forward_pre_hooks


def test_ddp_gradients_with_the_probe_hook_equal_ddp_without_a_hook(tmp_path: Path) -> None:
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    probe = Probe(rank=0, world_size=1, out_dir=tmp_path, hang_timeout_s=5.0)
    try:
        torch.manual_seed(0)
        template = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
        plain = DistributedDataParallel(copy.deepcopy(template))
        batch = torch.randn(8, 6)
        plain(batch).pow(2).sum().backward()
        install_hooks(probe)
        hooked = DistributedDataParallel(copy.deepcopy(template))
        hooked(batch).pow(2).sum().backward()
        assert any(op.op == "all_reduce" for op in probe.ring.tail(10))
        for a, b in zip(plain.parameters(), hooked.parameters(), strict=True):
            assert a.grad is not None and b.grad is not None and torch.equal(a.grad, b.grad)
    finally:
        uninstall_hooks()
        dist.destroy_process_group()


def test_a_peer_named_by_its_group_rank_is_recorded_as_a_global_rank() -> None:
    # batch_isend_irecv passes group_dst / group_src: rank 1 of the group [0, 2, 3] is global rank 2.
    assert _global_rank([0, 2, 3], 1) == 2
    assert _global_rank([], 1) == 1
    assert _global_rank([0, 2, 3], 3) is None
    assert _global_rank([0, 2, 3], None) is None


def test_a_compiled_model_traces_without_graph_breaks_and_its_call_still_marks_compute(probe: Probe) -> None:
    # The layer wrappers and forward marks read the clock; traced into a graph, that would break it at every layer.
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = torch.compile(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)))
    before = probe.last_compute or 0.0
    model(torch.ones(4, 8)).sum().backward()
    assert dict(counters["graph_break"]) == {}
    assert probe.last_compute is not None and probe.last_compute > before


def test_stop_waits_for_the_watchdog_to_leave_its_tick(tmp_path: Path) -> None:
    """stop() runs at exit: the watchdog thread must be gone before the interpreter finalizes, or a return from
    one of torch's GIL-releasing calls during finalization aborts a job that had finished."""
    import threading

    probe = Probe(rank=0, world_size=1, out_dir=tmp_path, hang_timeout_s=5.0)
    inside = threading.Event()

    def slow_call() -> None:  # a tick busy in a long call (a ring read), as at the moment a job exits
        inside.set()
        time.sleep(0.5)

    probe.answer_dump_request = slow_call  # type: ignore[method-assign]
    probe.start_watchdog()
    thread = probe._thread
    assert thread is not None and inside.wait(timeout=30)
    probe.stop()
    assert not thread.is_alive()


class _WorkerFuture:
    """A future whose completing thread runs its callbacks and only later lets go of them, as gloo's worker thread
    does (dropping a Python callback takes the GIL again, after the future's waiters were woken)."""

    def __init__(self) -> None:
        self.callbacks: list[Any] = []
        self.completed = False

    def done(self) -> bool:
        return self.completed

    def value(self) -> list[torch.Tensor]:
        return [torch.ones(4)]

    def add_done_callback(self, callback: Any) -> None:
        self.callbacks.append(callback)

    def complete(self) -> None:
        self.completed = True
        for callback in self.callbacks:
            callback(self)


def test_stop_waits_for_torch_to_drop_the_callbacks_it_ran(tmp_path: Path) -> None:
    """stop() runs at exit: a callback the probe gave torch, run by a worker thread that has not let go of it yet,
    would make that thread take the GIL while the interpreter finalizes, which aborts the finished job."""
    probe = Probe(rank=0, world_size=1, out_dir=tmp_path, hang_timeout_s=5.0)
    record = probe.begin_op("0", [0], COLLECTIVE, "all_reduce", [[4]], ["float32"], is_async=True)
    future = _WorkerFuture()

    class Work:
        def get_future(self) -> _WorkerFuture:
            return future

    assert _watch_future(probe, record, Work())
    ran = threading.Event()

    def worker() -> None:
        future.complete()
        ran.set()
        probe._stop.wait(timeout=30)  # the job reached its end and stop() has begun
        future.callbacks.clear()  # only now does the worker let go

    thread = threading.Thread(target=worker)
    thread.start()
    assert ran.wait(timeout=30) and not record.in_flight
    assert torch_callbacks.pending() == 1
    probe.stop()
    assert future.callbacks == [] and torch_callbacks.pending() == 0
    thread.join(timeout=30)


def test_callbacks_of_a_real_async_collective_are_dropped_by_the_time_stop_returns(probe: Probe) -> None:
    work = dist.all_reduce(torch.ones(64), async_op=True)
    work.get_future().wait()  # woken before gloo's worker ran (and dropped) the probe's callback
    probe.stop()
    assert torch_callbacks.pending() == 0
    assert [op.state for op in probe.ring.tail(1)] == ["completed"]
