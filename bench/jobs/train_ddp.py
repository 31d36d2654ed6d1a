"""A DistributedDataParallel gloo training job with a realistic CPU step, for the probe's overhead.

    python train_ddp.py --result FILE [--blocks 8] [--block-steps 6] [--warmup 4]

Run under `vigil launch` (the probe installed by its bootstrap). The model - a 4-layer transformer
encoder language model (d_model 256, 4 heads, feed-forward 1024, vocabulary 2048, batch 4 x 64
tokens), 41 module calls per forward - exists five times in every rank, identically initialised:

- ``plain``: wrapped in DDP and stepped with the probe's hooks taken out, so its reducer keeps
  torch's built-in C++ all_reduce and no Vigil code runs in its step;
- ``fr``: the probe's default on gloo with the Flight Recorder on: hooks in, no comm hook - the reducer's
  all_reduces are read from torch's FR ring by the probe's watchdog; its step runs every wrapper and
  module mark the probe adds;
- ``probed``: the comm-hook path (the fallback where the ring is not read): hooks in and the probe's Python
  comm hook, so its step runs every wrapper, module mark, op record and current-op write the probe adds;
- ``torch_hook``: torch's own Python all_reduce comm hook (``allreduce_hook``), hooks out: what a Python
  comm hook costs by itself, without any Vigil code;
- ``mean_hook``: the hook the probe installs (``allreduce_mean_hook``), hooks out: the part of the probe's
  cost that is the comm hook alone.

Blocks of ``--block-steps`` steps rotate between the arms (hooks taken out / put back in step on
every rank), so the arms share the same processes and the same moments of machine load. The watchdog
(and its reads of the FR ring, which hold every arm's collectives) runs through all of them. Rank 0
writes per-step wall and process-CPU times of each arm, plus the CPU time the probe's watchdog thread
used and the ring reader's own counters, to FILE (JSON).
"""

from __future__ import annotations

import argparse
import json
import threading
import time

import psutil
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

ARMS = ("plain", "fr", "probed", "torch_hook", "mean_hook")
VOCAB, D_MODEL, HEADS, FF, LAYERS, BATCH, SEQ = 2048, 256, 4, 1024, 4, 4, 64


class LanguageModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        layer = nn.TransformerEncoderLayer(D_MODEL, HEADS, FF, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.encoder(self.embed(tokens))))


def watchdog_cpu_s() -> float:
    """CPU seconds the probe's watchdog thread has used (0 without a probe)."""
    ids = {t.native_id for t in threading.enumerate() if t.name == "vigil-probe"}
    return sum(t.user_time + t.system_time for t in psutil.Process().threads() if t.id in ids)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--result", required=True)
    parser.add_argument("--blocks", type=int, default=8, help="blocks per arm")
    parser.add_argument("--block-steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=4, help="steps of each arm before timing")
    args = parser.parse_args()

    import vigil.sources.probe
    from vigil.sources.probe import hooks

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    probe = vigil.sources.probe.install()
    torch.manual_seed(0)
    template = LanguageModel()
    models: dict[str, DistributedDataParallel] = {}
    optimizers: dict[str, torch.optim.Optimizer] = {}
    for arm in ARMS:
        model = LanguageModel()
        model.load_state_dict(template.state_dict())
        models[arm] = DistributedDataParallel(model)
        if arm == "torch_hook":
            models[arm].register_comm_hook(None, allreduce_hook)
        elif arm in ("mean_hook", "probed"):
            # "probed" with the hooks in: the hook's all_reduce passes through the probe's wrappers.
            models[arm].register_comm_hook(None, hooks.allreduce_mean_hook)
        optimizers[arm] = torch.optim.AdamW(models[arm].parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(dist.get_rank())
    loss_fn = nn.CrossEntropyLoss()

    def step(arm: str) -> None:
        tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=generator)
        logits = models[arm](tokens[:, :-1])
        loss = loss_fn(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        optimizers[arm].zero_grad()
        loss.backward()
        optimizers[arm].step()

    def use(arm: str) -> None:
        if arm in ("probed", "fr"):
            hooks.install_hooks(probe)
        else:
            hooks.uninstall_hooks()

    for arm in ARMS:
        use(arm)
        for _ in range(args.warmup):
            step(arm)
    wall: dict[str, list[float]] = {arm: [] for arm in ARMS}
    cpu: dict[str, list[float]] = {arm: [] for arm in ARMS}
    watchdog = watchdog_cpu_s()
    started = time.perf_counter()
    for block in range(len(ARMS) * args.blocks):
        # Rounds of one block per arm, the order rotated each round: no arm always follows the same one.
        round_index, position = divmod(block, len(ARMS))
        arm = ARMS[(position + round_index) % len(ARMS)]
        use(arm)
        for _ in range(args.block_steps):
            wall_start, cpu_start = time.perf_counter(), time.process_time()
            step(arm)
            wall[arm].append(time.perf_counter() - wall_start)
            cpu[arm].append(time.process_time() - cpu_start)
    elapsed = time.perf_counter() - started
    watchdog = watchdog_cpu_s() - watchdog
    hooks.install_hooks(probe)
    dist.barrier()
    if dist.get_rank() == 0:
        result = {"block_steps": args.block_steps, "wall_s": wall, "cpu_s": cpu,
                  "watchdog_cpu_s": watchdog, "elapsed_s": elapsed,
                  "ops_recorded": probe.ring.total, "arms": list(ARMS),
                  "reads_ring": probe.flight is not None,
                  "ring_reader": probe.flight.stats() if probe.flight is not None else None,
                  "module_calls_per_step": count_module_calls(models["plain"])}
        with open(args.result, "w") as out:
            json.dump(result, out)
    dist.destroy_process_group()


def count_module_calls(model: nn.Module) -> int:
    calls = 0

    def count(module: nn.Module, inputs: object) -> None:
        nonlocal calls
        calls += 1

    handles = [m.register_forward_pre_hook(count) for m in model.modules()]
    with torch.no_grad():
        model.module(torch.zeros(1, 4, dtype=torch.long))
    for handle in handles:
        handle.remove()
    return calls


if __name__ == "__main__":
    main()
