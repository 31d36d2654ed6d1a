"""Device check of the probe's NCCL completion path and of the NCCL Flight Recorder ring reader (needs one
CUDA GPU; not run on the CPU machines).

On NCCL a collective's Python call returns once the kernel is enqueued on the communication stream;
the probe must keep such an op in flight until its Work reports completion (``is_completed``, which
queries the CUDA event NCCL records after the kernel). This script, on a one-rank NCCL group:

1. queues ``torch.cuda._sleep`` (about ``--gpu-busy-s`` seconds of GPU time) and then a synchronous
   ``all_reduce``, and an ``async_op`` one: the call returns at once, the probe's record must stay
   ``started`` until the GPU reaches the collective, and end about ``--gpu-busy-s`` later;
2. reads NCCL's Flight Recorder ring (``_dump_nccl_trace_json``; ``_dump_fr_trace`` is gloo's ring and shows
   nothing of an NCCL group) with ``TORCH_NCCL_ENABLE_TIMING=1``: NCCL's own state and duration of the same
   collectives, for comparison;
3. the same for a functional collective (``_functional_collectives.all_reduce`` and ``wait_tensor``, which
   on CUDA only makes the stream wait): the record must stay ``started`` until the GPU finished it (a
   CUDA event behind the wait, polled by the watchdog);
4. times a matmul with CUDA events on the current stream (the CUDA-event timeline source);
5. the ring reader against the comm hook on a DDP model (one rank, ``--steps`` steps, the GPU kept busy
   ``--gpu-busy-s`` before each backward, timing off as by default), each arm in a fresh process:
   ``ring`` (``VIGIL_FR_BACKENDS=gloo,nccl``, no comm hook: the reducer's all_reduces are read from the ring)
   and ``both`` (the same reader and the probe's Python comm hook: its wrappers number and end the same
   all_reduces). PASS when the ring's records are the hook's (same ops, sizes and sequence numbers, none
   twice), each ended after the GPU work (no sooner than 0.8 x the busy time, no later than 2 s after it),
   and NCCL's ``pg_status`` counters reached the last collective.

Every check prints a ``PASS`` / ``FAIL`` line; the last line says whether NCCL's default can switch to the
ring (all of check 5 passed). About a minute on one GPU; every wait has a timeout.

Run: python bench/device/cuda_hang.py [--gpu-busy-s 2] [--steps 4]   -> $OUT/cuda_hang.json (or bench/results/)
     python bench/device/cuda_hang.py --dry-run   (no GPU: imports, arguments and the checks' names)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
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

from vigil.sources.probe.flight import ENV_DDP_RECORDING, ENV_FR_BACKENDS, RING_FORMATS  # noqa: E402
from vigil.sources.probe.hooks import allreduce_mean_hook, install_hooks, uninstall_hooks  # noqa: E402
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


FR_KEEP = ("profiling_name", "collective_seq_id", "p2p_seq_id", "op_id", "state", "duration_ms", "time_created_ns",
           "time_discovered_started_ns", "time_discovered_completed_ns", "retired", "is_p2p")


def flight_recorder_entries() -> dict[str, Any]:
    """NCCL's ring, as its JSON dump has it (the ring of ``FlightRecorderCUDA``, not gloo's)."""
    import torch._C._distributed_c10d as c10d

    dump = getattr(c10d, "_dump_nccl_trace_json", None)
    if dump is None:
        return {"error": "this torch has no _dump_nccl_trace_json"}
    data = json.loads(dump(True, False))
    return {"pg_status": data.get("pg_status"),
            "entries": [{k: entry.get(k) for k in FR_KEEP} for entry in data.get("entries", [])]}


def matmul_event_ms(n: int = 8192) -> float:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    a @ a
    end.record()
    end.synchronize()
    return round(start.elapsed_time(end), 3)


# ----------------------------------------------------------------------------- ring reader against the hook

ARM_TIMEOUT_S = 120.0
COMPLETION_WAIT_S = 20.0


def ddp_arm(arm: str, busy_s: float, steps: int, out: Path) -> None:
    """One arm of check 5, in its own process (a fresh FR ring and fresh sequence numbers): a one-rank NCCL
    DDP model, the GPU busy before each backward; writes the probe's records and NCCL's ring to ``out``."""
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    torch.cuda.set_device(0)
    with tempfile.TemporaryDirectory(prefix="vigil-cuda-ring-") as tmp:
        dist.init_process_group("nccl", store=dist.FileStore(f"{tmp}/store", 1), rank=0, world_size=1,
                                device_id=torch.device("cuda", 0))
        probe = Probe(rank=0, world_size=1, out_dir=Path(tmp), hang_timeout_s=60.0)
        install_hooks(probe)
        try:
            reader = probe.flight_reader()
            torch.manual_seed(0)
            model = DistributedDataParallel(
                nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 16)).cuda(), device_ids=[0])
            if arm == "both":
                model.register_comm_hook(None, allreduce_mean_hook)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            cycles = sleep_cycles(busy_s)
            torch.cuda.synchronize()
            probe.start_watchdog()
            loop_start = time.time()
            for _ in range(steps):
                loss = model(torch.randn(32, 256, device="cuda")).pow(2).mean()
                torch.cuda._sleep(cycles)  # the reducer's all_reduce runs on the GPU after this
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                torch.cuda.synchronize()
            deadline = time.time() + COMPLETION_WAIT_S
            while time.time() < deadline:
                probe.read_flight_recorder()
                probe.poll_works()
                if not any(op.in_flight for op in probe.ring.tail(probe.ring.capacity) if op.kind == "collective"):
                    break
                time.sleep(0.25)
            # NCCL's watchdog moves pg_status a pass (100 ms) after the GPU finished; the dump may see it first.
            nccl_ring = flight_recorder_entries()
            for _ in range(20):
                seqs = [e["collective_seq_id"] for e in nccl_ring.get("entries") or [] if not e["is_p2p"]]
                done = [int(v["last_completed_collective"]) for v in (nccl_ring.get("pg_status") or {}).values()]
                if seqs and max(seqs) in done:
                    break
                time.sleep(0.1)
                nccl_ring = flight_recorder_entries()
            result = {
                "arm": arm,
                "reads_ring": reader is not None,
                "ring_format": None if reader is None else reader.format.backend,
                "comm_hooks": len(getattr(model, "_comm_hooks", [])),
                "loop_start": loop_start,
                "ops": [op.to_dict() for op in probe.ring.tail(probe.ring.capacity)],
                "reader": None if reader is None else reader.stats(),
                "nccl_ring": nccl_ring,
            }
            probe.stop()
        finally:
            uninstall_hooks()
            dist.destroy_process_group()
    out.write_text(json.dumps(result))


def run_arm(arm: str, busy_s: float, steps: int, tmp: Path) -> dict[str, Any]:
    out = tmp / f"arm-{arm}.json"
    env = {**os.environ, ENV_FR_BACKENDS: "gloo,nccl", ENV_DDP_RECORDING: "ring", "TORCH_FR_BUFFER_SIZE": "2000",
           "TORCH_NCCL_ENABLE_TIMING": "0"}
    command = [sys.executable, __file__, "--ddp-arm", arm, "--arm-out", str(out), "--gpu-busy-s", str(busy_s),
               "--steps", str(steps)]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=ARM_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"arm": arm, "error": f"timed out after {ARM_TIMEOUT_S:.0f} s"}
    if done.returncode != 0 or not out.exists():
        return {"arm": arm, "error": f"exit {done.returncode}", "stderr": done.stderr[-3000:]}
    return dict(json.loads(out.read_text()))


def step_reduces(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The all_reduces the training loop issued (DDP's set-up collectives come before it)."""
    return [op for op in result.get("ops", []) if op["kind"] == "collective" and op["op"] == "all_reduce"
            and op["t_start"] >= result["loop_start"]]


def check_ring_against_hook(busy_s: float, steps: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="vigil-cuda-arms-") as tmp:
        ring, both = (run_arm(arm, busy_s, steps, Path(tmp)) for arm in ("ring", "both"))
    checks: dict[str, Any] = {}
    if "error" in ring or "error" in both:
        for name in ("ring reader on", "same ops as the comm hook", "completion after the GPU work",
                     "wrapper and ring numbering agree", "pg_status counters"):
            checks[name] = {"ok": False, "why": ring.get("error") or both.get("error")}
        return {"checks": checks, "ring": ring, "both": both}
    ring_ops, hook_ops = step_reduces(ring), step_reduces(both)
    checks["ring reader on"] = {
        "ok": ring["reads_ring"] and ring["ring_format"] == "nccl" and ring["comm_hooks"] == 0
        and both["reads_ring"] and both["comm_hooks"] == 1,
        "ring_arm": [ring["reads_ring"], ring["ring_format"], ring["comm_hooks"]],
        "both_arm": [both["reads_ring"], both["ring_format"], both["comm_hooks"]],
    }
    key = [(op["seq"], op["op"], op["sizes"], op["dtypes"]) for op in ring_ops]
    checks["same ops as the comm hook"] = {
        "ok": len(ring_ops) == steps and key == [(op["seq"], op["op"], op["sizes"], op["dtypes"]) for op in hook_ops],
        "ring": [[op["seq"], op["op"], op["sizes"]] for op in ring_ops],
        "hook": [[op["seq"], op["op"], op["sizes"]] for op in hook_ops],
    }
    durations = [None if op["t_end"] is None else round(op["t_end"] - op["t_start"], 3) for op in ring_ops]
    hook_durations = [None if op["t_end"] is None else round(op["t_end"] - op["t_start"], 3) for op in hook_ops]
    checks["completion after the GPU work"] = {
        "ok": bool(ring_ops) and all(op["state"] == "completed" for op in ring_ops)
        and all(d is not None and 0.8 * busy_s <= d <= busy_s + 2.0 for d in durations),
        "ring_s": durations, "hook_s": hook_durations, "expected_s": [round(0.8 * busy_s, 3), busy_s + 2.0],
    }
    # With the hook, the wrappers number each all_reduce as torch does (seqCollective_ + 1): the reader then
    # recognises every ring entry as recorded and adds none of its own.
    seqs = [op["seq"] for op in both.get("ops", []) if op["kind"] == "collective"]
    checks["wrapper and ring numbering agree"] = {
        "ok": len(hook_ops) == steps and len(seqs) == len(set(seqs)),
        "both_arm_collectives": [[op["seq"], op["op"]] for op in both.get("ops", []) if op["kind"] == "collective"],
    }
    status = (ring.get("nccl_ring") or {}).get("pg_status") or {}
    entries = [e for e in (ring.get("nccl_ring") or {}).get("entries") or [] if not e.get("is_p2p")]
    last_seq = max((int(e["collective_seq_id"]) for e in entries), default=-1)
    completed = [int(v.get("last_completed_collective", -2)) for v in status.values()]
    checks["pg_status counters"] = {
        "ok": last_seq > 0 and last_seq in completed,
        "pg_status": status, "last_collective_seq_id": last_seq,
    }
    return {"checks": checks, "ring": {k: v for k, v in ring.items() if k != "ops"},
            "both": {k: v for k, v in both.items() if k != "ops"}}


CHECK_NAMES = (
    "work completion: sync all_reduce", "work completion: async all_reduce", "work completion: functional all_reduce",
    "NCCL ring dumped", "ring: ring reader on", "ring: same ops as the comm hook",
    "ring: completion after the GPU work", "ring: wrapper and ring numbering agree", "ring: pg_status counters",
)


def report(name: str, ok: bool) -> None:
    print(f"{'PASS' if ok else 'FAIL'} {name}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description="Device check of the probe's NCCL completion path and of the "
                                     "NCCL Flight Recorder ring reader (one CUDA GPU).")
    parser.add_argument("--gpu-busy-s", type=float, default=2.0)
    parser.add_argument("--steps", type=int, default=4, help="DDP steps per arm of the ring check")
    parser.add_argument("--dry-run", action="store_true", help="no GPU: check imports and arguments, list checks")
    parser.add_argument("--ddp-arm", choices=("ring", "both"), help=argparse.SUPPRESS)
    parser.add_argument("--arm-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.dry_run:
        assert RING_FORMATS["nccl"].dump_name == "_dump_nccl_trace"
        print(json.dumps({"dry_run": True, "torch": torch.__version__, "cuda": torch.cuda.is_available(),
                          "gpu_busy_s": args.gpu_busy_s, "steps": args.steps, "checks": list(CHECK_NAMES)}))
        return
    if not torch.cuda.is_available():
        sys.stderr.write("bench/device/cuda_hang.py needs a CUDA GPU (--dry-run runs without one)\n")
        raise SystemExit(2)
    if args.ddp_arm:
        ddp_arm(args.ddp_arm, args.gpu_busy_s, args.steps, Path(args.arm_out))
        return
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
            ring_entries = flight_recorder_entries()
            result: dict[str, Any] = {
                "device": torch.cuda.get_device_name(0),
                "torch": torch.__version__,
                "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                "gpu_busy_s": args.gpu_busy_s,
                "collectives": checks,
                "flight_recorder": ring_entries,
                "matmul_8192_bf16_cuda_event_ms": matmul_event_ms(),
            }
        finally:
            uninstall_hooks()
            dist.destroy_process_group()
    for name, check in zip(CHECK_NAMES[:3], checks, strict=True):
        report(name, bool(check["ok"]))
    ring_dumped = bool(ring_entries.get("entries"))
    report("NCCL ring dumped", ring_dumped)
    ring_check = check_ring_against_hook(args.gpu_busy_s, args.steps)
    for name, check in ring_check["checks"].items():
        report(f"ring: {name}", bool(check["ok"]))
    result["ring_against_hook"] = ring_check
    result["all_ok"] = all(c["ok"] for c in checks) and ring_dumped
    result["nccl_ring_default_ok"] = all(c["ok"] for c in ring_check["checks"].values())
    out = Path(os.environ.get("OUT") or REPO / "bench" / "results")
    out.mkdir(parents=True, exist_ok=True)
    (out / "cuda_hang.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    print("PASS" if result["all_ok"] else "FAIL", "work completion path (checks 1-4)")
    print(("SWITCH: NCCL's default can read the ring (VIGIL_FR_BACKENDS default gloo,nccl)"
           if result["nccl_ring_default_ok"] else "KEEP: NCCL jobs keep the comm hook by default"), flush=True)


if __name__ == "__main__":
    main()
