"""A DDP gloo job for the Flight Recorder ring reader: a few DDP steps with collectives of its own between
them (an all_reduce on the same group, a send / recv pair, a monitored barrier), then each rank writes what
the probe made of it.

    python ring_job.py --result DIR [--steps N]

Run under `vigil launch` (probe installed by its bootstrap). Each rank writes ``DIR/rank<R>.json``: the DDP
model's Python comm hooks, whether the probe reads the ring, and its op records.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--result", required=True)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()

    import vigil.sources.probe

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    probe = vigil.sources.probe.install()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        loss = model(torch.randn(8, 16)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        logged = loss.detach().clone()
        dist.all_reduce(logged)
        if step == 2:
            token = torch.zeros(1)
            if rank == 0:
                dist.send(token, 1)
            elif rank == 1:
                dist.recv(token, 0)
            dist.monitored_barrier()
    probe.read_flight_recorder()
    result = {
        "comm_hooks": len(getattr(model, "_comm_hooks", [])),
        "reads_ring": probe.flight is not None,
        "ops": [op.to_dict() for op in probe.ring.tail(probe.ring.capacity)],
    }
    Path(args.result, f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
