"""Device check of the probe's NCCL completion path (needs one CUDA GPU; not run on the CPU machines).

On NCCL a collective's Python call returns once the kernel is enqueued on the communication stream;
the probe must keep such an op in flight until its Work reports completion (``is_completed``, which
queries the CUDA event NCCL records after the kernel). This script, on a one-rank NCCL group:

1. queues ``torch.cuda._sleep`` (about ``--gpu-busy-s`` seconds of GPU time) and then a synchronous
   ``all_reduce``, and an ``async_op`` one: the call returns at once, the probe's record must stay
   ``started`` until the GPU reaches the collective, and end about ``--gpu-busy-s`` later;
2. reads the Flight Recorder ring with ``TORCH_NCCL_ENABLE_TIMING=1``: NCCL's own state and duration
   of the same collectives, for comparison;
3. the same for a functional collective (``_functional_collectives.all_reduce`` and ``wait_tensor``, which
   on CUDA only makes the stream wait): the record must stay ``started`` until the GPU finished it (a
   CUDA event behind the wait, polled by the watchdog);
4. times a matmul with CUDA events on the current stream (the CUDA-event timeline source).

Run: python bench/device/cuda_hang.py [--gpu-busy-s 2]   -> $OUT/cuda_hang.json (or bench/results/)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "200")
os.environ.setdefault("TORCH_NCCL_ENABLE_TIMING", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from vigil.sources.probe.hooks import install_hooks, uninstall_hooks  # noqa: E402
from vigil.sources.probe.probe import Probe  # noqa: E402
from vigil.sources.probe.records import OpRecord  # noqa: E402


def sleep_cycles(seconds: float) -> int:
    """GPU clock cycles for ``torch.cuda._sleep`` to keep the stream busy about ``seconds``."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 10_000_000
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    per_s = cycles / (start.elapsed_time(end) / 1000)
    return int(per_s * seconds)


def wait_until_done(probe: Probe, record: OpRecord, limit_s: float) -> float | None:
    deadline = time.time() + limit_s
    while time.time() < deadline:
        probe.poll_works()
        if not record.in_flight:
            return record.t_end
        time.sleep(0.01)
    return None


def check_collective(probe: Probe, cycles: int, busy_s: float, async_op: bool) -> dict[str, Any]:
    tensor = torch.ones(1 << 20, device="cuda")
    torch.cuda._sleep(cycles)
    called = time.time()
    work = dist.all_reduce(tensor, async_op=async_op)
    returned = time.time()
    record = probe.ring.tail(1)[0]
    in_flight_after_return = record.in_flight
    ended = wait_until_done(probe, record, busy_s * 5 + 10)
    if work is not None:
        work.wait()
    torch.cuda.synchronize()
    return {
        "async_op": async_op,
        "call_returned_after_s": round(returned - called, 4),
        "in_flight_after_return": in_flight_after_return,
        "state": record.state,
        "probe_duration_s": None if ended is None else round(ended - record.t_start, 3),
        "expected_at_least_s": round(busy_s * 0.8, 3),
        "ok": in_flight_after_return and ended is not None and ended - record.t_start >= busy_s * 0.8,
    }


def check_functional(probe: Probe, cycles: int, busy_s: float) -> dict[str, Any]:
    import torch.distributed._functional_collectives as funcol

    tensor = torch.ones(1 << 20, device="cuda")
    torch.cuda._sleep(cycles)
    called = time.time()
    reduced = funcol.all_reduce(tensor, "sum", dist.group.WORLD)
    record = probe.ring.tail(1)[0]
    waited = funcol.wait_tensor(getattr(reduced, "elem", reduced))
    returned = time.time()
    in_flight_after_wait = record.in_flight
    ended = wait_until_done(probe, record, busy_s * 5 + 10)
    torch.cuda.synchronize()
    return {
        "functional": True,
        "op": record.op,
        "wait_returned_after_s": round(returned - called, 4),
        "in_flight_after_wait": in_flight_after_wait,
        "state": record.state,
        "probe_duration_s": None if ended is None else round(ended - record.t_start, 3),
        "expected_at_least_s": round(busy_s * 0.8, 3),
        "result_ok": bool(torch.equal(waited, torch.ones_like(waited))),
        "ok": in_flight_after_wait and ended is not None and ended - record.t_start >= busy_s * 0.8,
    }


def flight_recorder_entries() -> list[dict[str, Any]]:
    from torch._C._distributed_c10d import _dump_fr_trace_json  # type: ignore[attr-defined]

    data = json.loads(_dump_fr_trace_json(True, False))
    keep = ("profiling_name", "collective_seq_id", "state", "duration_ms", "time_discovered_completed_ns")
    return [{k: entry.get(k) for k in keep} for entry in data.get("entries", [])]


def matmul_event_ms(n: int = 8192) -> float:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    a @ a
    end.record()
    end.synchronize()
    return round(start.elapsed_time(end), 3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpu-busy-s", type=float, default=2.0)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.stderr.write("bench/device/cuda_hang.py needs a CUDA GPU\n")
        raise SystemExit(2)
    torch.cuda.set_device(0)
    with tempfile.TemporaryDirectory(prefix="vigil-cuda-hang-") as tmp:
        dist.init_process_group("nccl", store=dist.FileStore(f"{tmp}/store", 1), rank=0, world_size=1,
                                device_id=torch.device("cuda", 0))
        probe = Probe(rank=0, world_size=1, out_dir=Path(tmp))
        install_hooks(probe)
        try:
            dist.all_reduce(torch.ones(8, device="cuda"))  # communicator set-up, outside the measurement
            torch.cuda.synchronize()
            probe.poll_works()
            cycles = sleep_cycles(args.gpu_busy_s)
            checks = [check_collective(probe, cycles, args.gpu_busy_s, async_op) for async_op in (False, True)]
            checks.append(check_functional(probe, cycles, args.gpu_busy_s))
            result = {
                "device": torch.cuda.get_device_name(0),
                "torch": torch.__version__,
                "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                "gpu_busy_s": args.gpu_busy_s,
                "collectives": checks,
                "flight_recorder": flight_recorder_entries(),
                "matmul_8192_bf16_cuda_event_ms": matmul_event_ms(),
                "all_ok": all(c["ok"] for c in checks),
            }
        finally:
            uninstall_hooks()
            dist.destroy_process_group()
    out = Path(os.environ.get("OUT") or REPO / "bench" / "results")
    out.mkdir(parents=True, exist_ok=True)
    (out / "cuda_hang.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
