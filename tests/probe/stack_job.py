"""A small training job on the stacks people use - DDP, FSDP2, or hand-written collectives - with one
injectable fault in one rank; a plain user script (no Vigil imports).

    python stack_job.py --stack ddp|ddp_builtin|fsdp|manual|funcol|mesh|compiled_ops --fault NAME --rank R
        --at-step K [--steps N]

``ddp_builtin`` registers DDP's built-in C++ all_reduce hook, so its gradient collectives never pass
through Python. ``funcol`` all-reduces gradients with functional collectives on the world group, ``mesh``
with functional collectives on a DeviceMesh dimension (2 x N/2 mesh when the world is even: the "dp"
sub-groups), ``compiled_ops`` through the c10d_functional operators a compiled graph calls (no Python
collective API at all).
"""

from __future__ import annotations

import argparse
import ctypes
import io
import os
import tempfile
import time

import torch
import torch.distributed as dist
from torch import nn

STACKS = ("ddp", "ddp_builtin", "fsdp", "manual", "funcol", "mesh", "compiled_ops")
FAULTS = ("none", "forward", "uneven", "straggler", "crash", "gil", "checkpoint", "eval", "warmup")


class Net(nn.Module):
    def __init__(self, stuck_rank: int | None) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 4))
        self.stuck_rank = stuck_rank
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.stuck_rank is not None and self.calls > self.stuck_rank:
            spin_in_forward(x)
        return self.body(x)


def spin_in_forward(x: torch.Tensor) -> None:
    a = torch.randn(48, 48)
    while True:
        a = torch.tanh(a @ a)


def native_call_holding_gil() -> None:
    # PyDLL keeps the GIL during the call, like a C extension that forgot to release it.
    ctypes.PyDLL(None).sleep(3600)


class SlowStorage(io.RawIOBase):
    """A checkpoint file on slow storage: bytes reach the file at a rate that makes a save of ``size``
    bytes take about ``duration_s`` (a bandwidth-limited mount, not one that stopped accepting data)."""

    def __init__(self, path: str, size: int, duration_s: float) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        self.seconds_per_byte = duration_s / max(size, 1)

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        view = memoryview(data)
        for start in range(0, len(view), 1024):
            chunk = view[start:start + 1024]
            os.write(self.fd, chunk)
            time.sleep(len(chunk) * self.seconds_per_byte)
        return len(data)

    def close(self) -> None:
        if not self.closed:
            os.close(self.fd)
        super().close()


def saved_size(state: object) -> int:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.tell()


def wrap(model: nn.Module, stack: str) -> nn.Module:
    if stack in ("ddp", "ddp_builtin"):
        from torch.nn.parallel import DistributedDataParallel

        ddp = DistributedDataParallel(model)
        if stack == "ddp_builtin":
            ddp._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
        return ddp
    if stack == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in model.body:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(model)
    return model


def make_mesh() -> object:
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    shape = (2, world // 2) if world % 2 == 0 and world >= 4 else (1, world)
    return init_device_mesh("cpu", shape, mesh_dim_names=("pp", "dp"))


def reduce_gradients(model: nn.Module, stack: str, mesh: object) -> None:
    import torch.distributed._functional_collectives as funcol

    for param in model.parameters():
        assert param.grad is not None
        if stack == "manual":
            dist.all_reduce(param.grad)
        elif stack == "funcol":
            param.grad.copy_(funcol.all_reduce(param.grad, "sum", dist.group.WORLD))
        elif stack == "mesh":
            param.grad.copy_(funcol.all_reduce(param.grad, "sum", (mesh, 1)))
        else:
            group_name = dist.group.WORLD.group_name  # type: ignore[union-attr]
            reduced = torch.ops._c10d_functional.all_reduce(param.grad, "sum", group_name)
            param.grad.copy_(torch.ops._c10d_functional.wait_tensor(reduced))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stack", choices=STACKS, default="ddp")
    parser.add_argument("--fault", choices=FAULTS, default="none")
    parser.add_argument("--rank", type=int, default=1, help="the faulty rank")
    parser.add_argument("--at-step", type=int, default=4)
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--step-time", type=float, default=0.05)
    parser.add_argument("--sleep", type=float, default=0.6)
    args = parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    faulty = rank == args.rank
    stuck = args.at_step if faulty and args.fault == "forward" else None
    model = wrap(Net(stuck), args.stack)
    mesh = make_mesh() if args.stack == "mesh" else None
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    # Uneven inputs: the faulty rank's data runs out early and it leaves the loop.
    steps = args.at_step if faulty and args.fault == "uneven" else args.steps
    for step in range(steps):
        if faulty and args.fault == "warmup" and step == 0:
            # The data loader's first batch takes long; the peers wait in the first collective.
            time.sleep(args.sleep)
        time.sleep(args.step_time)
        if faulty and args.fault == "straggler":
            time.sleep(args.sleep)
        loss = model(torch.randn(16, 32)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        if args.stack in ("manual", "funcol", "mesh", "compiled_ops"):
            reduce_gradients(model, args.stack, mesh)
        optimizer.step()
        if faulty and step == args.at_step:
            if args.fault == "crash":
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            if args.fault == "gil":
                native_call_holding_gil()
        if args.fault == "checkpoint" and step == args.at_step:
            # Every rank saves; the faulty one takes long (slow storage), the others wait in the
            # barrier after it: not a hang.
            state = model.state_dict()
            with tempfile.TemporaryDirectory() as directory, SlowStorage(
                os.path.join(directory, "checkpoint.pt"), saved_size(state), args.sleep if faulty else 0.0
            ) as storage:
                torch.save(state, storage)
            dist.barrier()
        if args.fault == "eval" and step == args.at_step:
            # An evaluation pass: no optimizer step for a while, forward passes continue.
            with torch.no_grad():
                deadline = time.time() + args.sleep
                while time.time() < deadline:
                    model(torch.randn(16, 32))
                    time.sleep(0.02)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
