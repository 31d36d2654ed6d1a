"""A small gloo training job that writes Vigil heartbeat lines (loss, gradient norm, tokens/s) every step.

    python heartbeat_job.py [--steps N] [--step-time S] [--hang-rank R | --raise-rank R] [--at-step K]
                            [--exit-delay S]

With --hang-rank, rank R stops at step K in its own code (a data loader that never returns) while its peers
wait for it in the next all_reduce. With --raise-rank, rank R raises at step K (a bad batch), and its peers'
next all_reduce fails with gloo's own error about the peer that went away; with --exit-delay, the raising rank
takes S seconds more to exit after its traceback (as torch's teardown can on a loaded machine), and its peers
see it gone only then.
"""

from __future__ import annotations

import argparse
import atexit
import time

import torch
import torch.distributed as dist

from vigil.remedy.heartbeat import Heartbeat


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--step-time", type=float, default=0.05)
    parser.add_argument("--hang-rank", type=int, default=-1)
    parser.add_argument("--raise-rank", type=int, default=-1)
    parser.add_argument("--at-step", type=int, default=10)
    parser.add_argument("--exit-delay", type=float, default=0.0)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = torch.nn.Linear(16, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    beat = Heartbeat()
    beat.start()
    for step in range(args.steps):
        began = time.time()
        if rank == args.hang_rank and step == args.at_step:
            time.sleep(3600)
        if rank == args.raise_rank and step == args.at_step:
            atexit.register(time.sleep, args.exit_delay)
            raise ValueError(f"bad batch at step {step}: labels out of range")
        time.sleep(args.step_time)
        x = torch.randn(32, 16)
        loss = (model(x) - x[:, :4]).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        dist.all_reduce(grads)
        optimizer.step()
        beat.step(step, loss=float(loss), grad_norm=float(grads.norm()), tokens_per_s=32 / (time.time() - began))
    beat.done(args.steps)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
