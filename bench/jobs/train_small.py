"""A small data-parallel gloo training step loop used to measure probe overhead (no Vigil imports).

    python train_small.py --steps N --result FILE

Each step: forward/backward of a small MLP, one all_reduce per parameter gradient, an all_reduce of
the loss, an optimizer step. Rank 0 writes the mean step time after warm-up to FILE (JSON).
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--result", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    torch.manual_seed(dist.get_rank())
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    world = dist.get_world_size()
    times = []
    for step in range(args.warmup + args.steps):
        start = time.perf_counter()
        loss = model(torch.randn(64, 256)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        for param in model.parameters():
            dist.all_reduce(param.grad)
            param.grad /= world
        dist.all_reduce(loss.detach().reshape(1))
        optimizer.step()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    dist.barrier()
    if dist.get_rank() == 0:
        times.sort()
        with open(args.result, "w") as out:
            json.dump({"mean_step_s": sum(times) / len(times), "median_step_s": times[len(times) // 2],
                       "steps": len(times)}, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
