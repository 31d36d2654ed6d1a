"""A small data-parallel gloo training step loop used to measure probe overhead.

    python train_small.py --steps N --result FILE [--toggle-probe BLOCK]

Each step: forward/backward of a small MLP, one all_reduce per parameter gradient, an all_reduce of
the loss, an optimizer step. Rank 0 writes step times after warm-up to FILE (JSON).

With ``--toggle-probe BLOCK`` (run under `vigil launch`, which installs the probe) the probe's hooks are
switched off and on every BLOCK steps, in step on every rank, so both arms run in the same processes
at the same moments of machine load: ``on_step_s`` / ``off_step_s`` (wall) and ``on_cpu_s`` /
``off_cpu_s`` (CPU time of the whole process, all threads) in FILE.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--result", required=True)
    parser.add_argument("--toggle-probe", type=int, default=0, metavar="BLOCK")
    parser.add_argument("--width", type=int, default=1024)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    torch.manual_seed(dist.get_rank())
    width = args.width
    model = torch.nn.Sequential(torch.nn.Linear(width, 2 * width), torch.nn.ReLU(), torch.nn.Linear(2 * width, width))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    world = dist.get_world_size()
    if args.toggle_probe:
        import vigil.sources.probe
        from vigil.sources.probe import hooks

        probe = vigil.sources.probe.install()
    times: dict[bool, list[float]] = {True: [], False: []}
    cpu_times: dict[bool, list[float]] = {True: [], False: []}
    probe_on = True
    for step in range(args.warmup + args.steps):
        if args.toggle_probe and step >= args.warmup and (step - args.warmup) % args.toggle_probe == 0:
            probe_on = (step - args.warmup) // args.toggle_probe % 2 == 0
            if probe_on:
                hooks.install_hooks(probe)
            else:
                hooks.uninstall_hooks()
        start, cpu_start = time.perf_counter(), time.process_time()
        loss = model(torch.randn(64, width)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        for param in model.parameters():
            dist.all_reduce(param.grad)
            param.grad /= world
        dist.all_reduce(loss.detach().reshape(1))
        optimizer.step()
        if step >= args.warmup:
            times[probe_on].append(time.perf_counter() - start)
            cpu_times[probe_on].append(time.process_time() - cpu_start)
    dist.barrier()
    if dist.get_rank() == 0:
        steps = times[True] + times[False]
        result = {"mean_step_s": statistics.fmean(steps), "median_step_s": statistics.median(steps),
                  "steps": len(steps)}
        if args.toggle_probe:
            result.update(on_step_s=times[True], off_step_s=times[False], on_cpu_s=cpu_times[True],
                          off_cpu_s=cpu_times[False])
        with open(args.result, "w") as out:
            json.dump(result, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
