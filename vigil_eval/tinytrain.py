"""A tiny, deterministic data-parallel training job that checkpoints continuously.

It is the workload the failover and checkpoint tests drive (and a worked example of the checkpoint
library): a small MLP with dropout (so the RNG state matters), Adam (so optimizer state matters) and a
resumable sampler (so the data position matters). Ranks sum gradients with one gloo all-reduce;
with two ranks a sum is order-free, so a run is reproducible to the bit.

Launched torchrun-style: RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT in the environment.
Each step sends a heartbeat (``vigil.remedy.heartbeat``) with the loss and gradient norm: what the
failover supervisor watches for hangs and healthCheck conditions. Rank 0 writes ``<run-dir>/result.json`` at the end.

Fault injection for tests and benchmarks: ``VIGIL_INJECT_FAULT=kill:rank=1:step=12`` (or ``hang:``)
fires once, on the first attempt only (``VIGIL_RESTART_COUNT`` unset or 0).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from vigil.checkpoint.manager import CheckpointManager
from vigil.checkpoint.state import ShardedSampler
from vigil.remedy.heartbeat import Heartbeat

DATASET_SIZE = 512
FEATURES = 16


@dataclass
class InjectedFault:
    kind: str
    rank: int
    step: int

    @classmethod
    def from_env(cls) -> InjectedFault | None:
        spec = os.environ.get("VIGIL_INJECT_FAULT", "")
        if not spec or int(os.environ.get("VIGIL_RESTART_COUNT", "0")) > 0:
            return None
        kind, *fields = spec.split(":")
        values = dict(field.split("=", 1) for field in fields)
        if kind not in ("kill", "hang"):
            raise SystemExit(f"VIGIL_INJECT_FAULT: unknown fault kind {kind!r} (kill or hang)")
        return cls(kind=kind, rank=int(values["rank"]), step=int(values["step"]))

    def fire(self) -> None:
        if self.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        while True:  # a hung rank: alive, silent, never reaching the next collective
            time.sleep(3600)


def make_dataset(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(DATASET_SIZE, FEATURES, generator=generator)
    true_weights = torch.randn(FEATURES, 1, generator=generator)
    targets = inputs @ true_weights + 0.1 * torch.randn(DATASET_SIZE, 1, generator=generator)
    return inputs, targets


def make_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(32, 1)
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    # Defaults come from the environment a Vigil supervisor sets from the job spec.
    env = os.environ.get
    parser.add_argument("--run-dir", type=Path, default=env("VIGIL_RUN_DIR"))
    parser.add_argument("--checkpoint-dir", type=Path, default=env("VIGIL_CHECKPOINT_DIR"))
    parser.add_argument("--checkpoint-every", type=int, default=int(env("VIGIL_CHECKPOINT_EVERY", "5")))
    parser.add_argument("--keep-last", type=int, default=int(env("VIGIL_CHECKPOINT_KEEP_LAST", "3")))
    parser.add_argument("--step-seconds", type=float, default=0.0, help="pad each step (simulated compute)")
    args = parser.parse_args(argv)
    if args.run_dir is None:
        parser.error("--run-dir (or VIGIL_RUN_DIR) is required")

    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    args.run_dir.mkdir(parents=True, exist_ok=True)
    fault = InjectedFault.from_env()

    inputs, targets = make_dataset(args.seed)
    model = make_model(args.seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    sampler = ShardedSampler(DATASET_SIZE, args.batch_size, rank, world_size, seed=args.seed)
    # Each rank draws its own dropout masks; the checkpoint keeps every rank's stream.
    torch.manual_seed(args.seed * 7919 + rank)

    checkpoints = None
    start_step = 0
    if args.checkpoint_dir is not None:
        checkpoints = CheckpointManager(args.checkpoint_dir, keep_last=args.keep_last)
        restored = checkpoints.restore_latest(model, optimizer)
        if restored is not None:
            start_step = restored.step
            sampler.load_state_dict(restored.extra["sampler"])

    heartbeat = Heartbeat(args.run_dir, rank)
    heartbeat.start(start_step)
    losses: list[float] = []
    loss_value = float("nan")
    for step in range(start_step + 1, args.steps + 1):
        if fault is not None and fault.rank == rank and fault.step == step:
            fault.fire()
        batch = sampler.next_batch()
        loss = torch.nn.functional.mse_loss(model(inputs[batch]), targets[batch])
        optimizer.zero_grad()
        loss.backward()
        flat = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
        dist.all_reduce(flat)
        flat /= world_size
        offset = 0
        for param in model.parameters():
            assert param.grad is not None
            count = param.grad.numel()
            param.grad.copy_(flat[offset : offset + count].view_as(param.grad))
            offset += count
        optimizer.step()
        global_loss = loss.detach().clone()
        dist.all_reduce(global_loss)
        loss_value = (global_loss / world_size).item()
        losses.append(loss_value)
        if args.step_seconds:
            time.sleep(args.step_seconds)
        heartbeat.step(step, loss=loss_value, grad_norm=flat.norm().item())
        if checkpoints is not None and step % args.checkpoint_every == 0:
            checkpoints.save(step, model, optimizer, {"sampler": sampler.state_dict()})
    if checkpoints is not None:
        checkpoints.close()
    heartbeat.done(args.steps)
    if rank == 0:
        result = {"final_loss": loss_value, "final_loss_hex": float(loss_value).hex(), "steps": args.steps}
        (args.run_dir / "result.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
