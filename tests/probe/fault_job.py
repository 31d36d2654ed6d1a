"""A small gloo training job with one injectable fault; a plain user script (no Vigil imports).

    python fault_job.py --fault NAME --rank R --at-step K [--steps N] [--sleep S]
"""

from __future__ import annotations

import argparse
import ctypes
import io
import os
import random
import signal
import threading
import time

import torch
import torch.distributed as dist

FAULTS = (
    "none", "compute", "deadlock", "busyloop", "gil", "skip", "shape", "exception", "kill",
    "straggler", "slow", "checkpoint", "p2p",
)


def stuck_in_compute(a: torch.Tensor) -> None:
    while True:
        a = torch.matmul(a, a).clamp_(-1, 1)


def deadlock_between_threads() -> None:
    first, second = threading.Lock(), threading.Lock()
    both_hold_one = threading.Barrier(2)

    def worker(one: threading.Lock, other: threading.Lock) -> None:
        with one:
            both_hold_one.wait()
            with other:
                pass

    threads = [
        threading.Thread(target=worker, args=(first, second), name="loader-a"),
        threading.Thread(target=worker, args=(second, first), name="loader-b"),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def spin_holding_gil() -> None:
    count = 0
    while True:
        count += 1


def native_call_holding_gil() -> None:
    # PyDLL keeps the GIL during the call, like a C extension that forgot to release it.
    ctypes.PyDLL(None).sleep(3600)


class SlowFile(io.RawIOBase):
    """A file on slow storage: every write takes a while."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        time.sleep(self.delay_s)
        self.size += len(data)
        return len(data)


def save_checkpoint_slowly(model: torch.nn.Module, duration_s: float) -> None:
    chunks = 20
    state = {f"part{i}": torch.randn(256) for i in range(chunks)}
    state["model"] = model.state_dict()
    torch.save(state, SlowFile(duration_s / 60))


def ring_exchange(rank: int, world: int, skip_recv: bool) -> None:
    send = torch.full((8,), float(rank))
    recv = torch.zeros(8)
    requests = [dist.isend(send, (rank + 1) % world)]
    if not skip_recv:
        requests.append(dist.irecv(recv, (rank - 1) % world))
    for request in requests:
        request.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fault", choices=FAULTS, default="none")
    parser.add_argument("--rank", type=int, default=1, help="the faulty rank")
    parser.add_argument("--at-step", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--sleep", type=float, default=0.3)
    parser.add_argument("--step-time", type=float, default=0.05)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    faulty = rank == args.rank
    for step in range(args.steps):
        at_fault = faulty and step == args.at_step
        time.sleep(args.step_time)
        if args.fault == "straggler" and faulty:
            time.sleep(args.sleep)
        if args.fault == "slow":
            time.sleep(random.uniform(0.0, args.sleep))
        x = torch.randn(8, 16)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        if at_fault:
            if args.fault == "compute":
                stuck_in_compute(torch.randn(64, 64))
            elif args.fault == "deadlock":
                deadlock_between_threads()
            elif args.fault == "busyloop":
                spin_holding_gil()
            elif args.fault == "gil":
                native_call_holding_gil()
            elif args.fault == "exception":
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            elif args.fault == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
        if args.fault == "checkpoint" and rank == args.rank and step == args.at_step:
            save_checkpoint_slowly(model, args.sleep)
        if args.fault == "p2p":
            ring_exchange(rank, world, skip_recv=at_fault)
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        if args.fault == "shape" and at_fault:
            grads = grads[:-4]
        if not (args.fault == "skip" and at_fault):
            dist.all_reduce(grads)
        dist.all_reduce(loss.detach().reshape(1))
        optimizer.step()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
