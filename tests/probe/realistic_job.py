"""Training jobs written the way an ML engineer writes them (DDP, FSDP2, a 2 x 2 DeviceMesh, DataLoaders,
custom autograd Functions, optimizer subclasses, hooks, checkpoints, evaluation), each with one fault of a
kind people meet in real jobs; a plain user script (no Vigil imports). These are new scenarios, written
after the detector, to check it from outside.

    python realistic_job.py --scenario NAME --rank R [--at-step K] [--steps N] [--sleep S]

The scenarios (``--rank`` is the faulty rank; ``--sleep`` the length of the long pause where there is one):

- ``backward``: DDP; a custom autograd Function (activation offload) blocks in backward waiting for a
  prefetch thread that never delivers.
- ``optimizer``: DDP; an optimizer subclass blocks in ``step()`` on a lock a logging thread never releases.
- ``loader_worker``: DDP; a DataLoader worker process blocks reading one sample (a stuck mount).
- ``lock_hook``: DDP; a forward pre-hook that records activation statistics deadlocks with the thread
  that flushes them (lock-order deadlock).
- ``fsdp_skip_rs``: FSDP2; one rank turns gradient sync off for a step (its accumulation counter is
  off), so it skips the reduce-scatters and goes on to the next forward's all-gather.
- ``accum``: DDP with ``no_sync()`` gradient accumulation; one rank accumulates 3 micro-batches where
  the others accumulate 2, so it runs fewer all-reduces and reaches the final barrier first.
- ``unused_ok``: DDP with ``find_unused_parameters=True``; one rank takes another branch now and then
  (supported: no fault).
- ``unused_crash``: DDP without ``find_unused_parameters``; one rank skips the auxiliary head once, so
  its reducer never finishes and its next forward raises.
- ``fsdp_straggler``: FSDP2; one rank's data pipeline does extra CPU work every step.
- ``ckpt_stuck``: DDP; one rank's ``torch.save`` blocks writing to storage that stopped accepting data
  (a pipe nobody reads: the write blocks in the kernel, as on a hung NFS mount).
- ``ckpt_slow_ok``: DDP; rank 0 alone saves a checkpoint to throttled storage for ``--sleep`` seconds
  while the others wait at a barrier (no fault).
- ``eval_ok``: DDP; rank 0 alone runs a validation loop (``inference_mode``, the unwrapped model, a
  DataLoader) for ``--sleep`` seconds while the others wait at a barrier (no fault).
- ``eval_slow_ok``: like ``eval_ok``, but every validation batch takes 3 s to load (a worker decoding
  large samples), so the forward passes come 3 s apart (no fault).
- ``warmup_ok``: DDP; one rank's DataLoader workers take ``--sleep`` seconds to open their shards before
  the first batch (no fault).
- ``mesh_hang``: 4 ranks on a 2 x 2 DeviceMesh (dp x tp): FSDP2 over dp, the loss all-reduced over tp;
  one rank waits forever for a batch from a prefetch thread that died.
- ``segv``: DDP; one rank's native extension dereferences a null pointer (SIGSEGV).
- ``exit0``: DDP; one rank leaves the loop early and exits 0 (its loop bound is wrong).

A second batch, written after the first fixes landed:

- ``nan_skip``: DDP; one rank's loss is NaN once and it skips that step (``continue`` before backward).
- ``join_ok``: DDP with ``model.join()``; one rank has 3 batches fewer (supported uneven inputs: no fault).
- ``loader_crash``: DDP; a DataLoader worker raises on a corrupt sample in one rank.
- ``gather_hang``: DDP; at a step's end the ranks gather metrics with ``all_gather_object``; one rank first
  waits forever for its async metrics writer.
- ``ema_stuck``: DDP; one rank's spectral-norm estimate (power iteration under ``no_grad`` after the
  optimizer step) never meets its tolerance.

A third batch, written after the second batch's fixes landed (each its own loop, ``THIRD_BATCH``):

- ``compile_hang``: ``torch.compile`` of a DDP model (the first compile is slow: no fault); later one rank's
  data pipeline rejection-samples a crop from a sample with no foreground, forever.
- ``pipe_short``: a pipeline (one stage per rank, micro-batches through ``batch_isend_irecv``, gradients
  back); the last stage's label batch is one sample short, so it posts one recv too few.
- ``moe_hang``: MoE layer (one expert per rank, tokens dispatched with ``all_to_all_single`` inside an
  autograd Function); one rank's Sinkhorn routing meets a NaN and never converges, before the dispatch.
- ``fsdp_ac_hang``: FSDP2 with activation checkpointing; a block's forward takes a stats lock that a
  dashboard thread holds while blocked, so the recomputation in backward blocks in one rank.
- ``collate_straggler``: DDP; one rank's ``collate_fn`` makes a ~0.4 s round trip per batch (a remote
  caption store).
- ``oom_worker``: DDP; the OOM killer SIGKILLs one rank's DataLoader worker while it decodes a sample.
- ``grad_hook_raise``: DDP; a gradient guard (``Tensor.register_hook``) raises in backward on one rank's
  non-finite gradient.
- ``clip_skip``: FSDP2 with ``clip_grad_norm_``; one rank's local loss-spike guard skips clipping and the
  step (its peers' clip all-reduces the norm).
- ``dcp_slow_ok``: DDP; every rank saves with ``torch.distributed.checkpoint`` to throttled storage; one rank
  writes the large replicated tensor for ``--sleep`` seconds while the others wait (no fault).
- ``eval_ddp_ok``: DDP; every rank evaluates the DDP-wrapped model under ``torch.no_grad()``, rank 0 for
  ``--sleep`` seconds, the others a fifth of that, then the metrics are all-reduced (no fault).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import queue
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

SCENARIOS = (
    "none", "backward", "optimizer", "loader_worker", "lock_hook", "fsdp_skip_rs", "accum", "unused_ok",
    "unused_crash", "fsdp_straggler", "ckpt_stuck", "ckpt_slow_ok", "eval_ok", "eval_slow_ok", "warmup_ok",
    "mesh_hang",
    "segv", "exit0", "nan_skip", "join_ok", "loader_crash", "gather_hang", "ema_stuck",
    "compile_hang", "pipe_short", "moe_hang", "fsdp_ac_hang", "collate_straggler", "oom_worker", "grad_hook_raise",
    "clip_skip", "dcp_slow_ok", "eval_ddp_ok",
)
FSDP = ("fsdp_skip_rs", "fsdp_straggler", "mesh_hang")
LOADER = ("loader_worker", "warmup_ok", "loader_crash")


# --- data -------------------------------------------------------------------------------------------------


class Shards(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Samples read from "shards"; ``stuck_at`` is an index whose read never returns (a hung mount)."""

    def __init__(self, length: int, seed: int, stuck_at: int | None = None, read_s: float = 0.0,
                 corrupt_at: int | None = None, killed_at: int | None = None) -> None:
        self.length, self.seed, self.stuck_at, self.read_s = length, seed, stuck_at, read_s
        self.corrupt_at, self.killed_at = corrupt_at, killed_at

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if index == self.stuck_at:
            # read() on a file of a mount whose server went away: blocks until the server is back
            read_end, _write_end = os.pipe()
            os.read(read_end, 1)
        if index == self.killed_at:
            # decoding a huge image: the kernel's OOM killer picks this worker
            os.kill(os.getpid(), signal.SIGKILL)
        if index == self.corrupt_at:
            raise ValueError(f"corrupt sample {index}: bad JPEG header in shard 3")
        time.sleep(self.read_s)  # decoding a large sample
        generator = torch.Generator().manual_seed(self.seed * 100_003 + index)
        return torch.randn(32, generator=generator), torch.randn(4, generator=generator)


def open_shards(delay_s: float) -> Any:
    def init(worker_id: int) -> None:
        # Listing and opening the shards of an object store, once per worker, before the first sample.
        deadline = time.time() + delay_s
        while time.time() < deadline:
            time.sleep(0.1)

    return init


# --- model ------------------------------------------------------------------------------------------------


class OffloadedActivation(torch.autograd.Function):
    """Keeps the activation on "host" storage; backward waits until the prefetcher brought it back."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, prefetched: threading.Event) -> torch.Tensor:
        ctx.prefetched = prefetched
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.prefetched.wait()
        return grad, None


class Net(nn.Module):
    def __init__(self, alternative_head: bool = False) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.head = nn.Linear(64, 4)
        self.aux = nn.Linear(64, 4)
        self.alt = nn.Linear(64, 4) if alternative_head else None
        self.prefetched: threading.Event | None = None

    def forward(self, x: torch.Tensor, use_aux: bool = True, use_alt: bool = False) -> torch.Tensor:
        h = self.trunk(x)
        if self.prefetched is not None:
            h = OffloadedActivation.apply(h, self.prefetched)
        out = self.alt(h) if use_alt and self.alt is not None else self.head(h)
        if use_aux:
            out = out + 0.1 * self.aux(h)
        return out


class LoggedSGD(torch.optim.SGD):
    """SGD that takes the metrics lock around its update (a logging thread reads the parameters under it)."""

    def __init__(self, params: Any, lr: float, metrics_lock: threading.Lock) -> None:
        super().__init__(params, lr=lr)
        self.metrics_lock = metrics_lock

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        with self.metrics_lock:
            return super().step(closure)


# --- storage ----------------------------------------------------------------------------------------------


class ThrottledFile:
    """A real file on storage that takes ``rate`` bytes a second: each chunk is written, then paced."""

    def __init__(self, path: str, rate: float) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        self.rate = rate

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        for start in range(0, len(view), 65536):
            chunk = view[start:start + 65536]
            begin = time.monotonic()
            os.write(self.fd, chunk)
            time.sleep(max(0.0, len(chunk) / self.rate - (time.monotonic() - begin)))
        return len(data)

    def flush(self) -> None:
        os.fsync(self.fd)

    def close(self) -> None:
        os.close(self.fd)


def stuck_storage_path(directory: str) -> str:
    """A path whose writes stop after the first 64 KiB: a pipe a "server" opened and then stopped reading."""
    path = os.path.join(directory, "checkpoint.pt")
    os.mkfifo(path)
    os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # the server's end: open, never read
    return path


# --- job --------------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenario", choices=SCENARIOS, default="none")
    parser.add_argument("--rank", type=int, default=1, help="the faulty rank")
    parser.add_argument("--at-step", type=int, default=4)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--sleep", type=float, default=25.0, help="length of a long pause that is no fault")
    parser.add_argument("--step-time", type=float, default=0.05)
    parser.add_argument("--builtin-hook", action="store_true",
                        help="DDP with its built-in C++ all_reduce hook: no gradient collective passes through Python")
    parser.add_argument("--ckpt-dir", default=None, help="checkpoint directory shared by the ranks")
    args = parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(hours=1))
    rank, world = dist.get_rank(), dist.get_world_size()
    faulty = rank == args.rank
    scenario = args.scenario
    torch.manual_seed(0)
    if scenario in THIRD_BATCH:
        THIRD_BATCH[scenario](args, rank, world, faulty)
        dist.barrier()
        dist.destroy_process_group()
        return
    net = Net(alternative_head=scenario == "unused_ok")
    metrics_lock = threading.Lock()
    stats_lock = threading.Lock()
    tp_group = None

    if scenario == "backward" and faulty:
        net.prefetched = threading.Event()
        net.prefetched.set()
    if scenario == "lock_hook":
        activation_stats: list[float] = []
        flushed = threading.Event()

        def record_stats(module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
            with stats_lock:
                activation_stats.append(float(inputs[0].abs().mean()))
                flushed.set()

        net.head.register_forward_pre_hook(record_stats)

    if scenario in FSDP:
        from torch.distributed.fsdp import fully_shard

        mesh = None
        if scenario == "mesh_hang":
            from torch.distributed.device_mesh import init_device_mesh

            mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
            tp_group = mesh.get_group("tp")
            mesh = mesh["dp"]
        for layer in net.trunk:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(net, mesh=mesh)
        model: nn.Module = net
    else:
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(net, find_unused_parameters=scenario == "unused_ok")
        if args.builtin_hook:
            model._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
    optimizer: torch.optim.Optimizer
    if scenario == "optimizer":
        optimizer = LoggedSGD(model.parameters(), lr=0.01, metrics_lock=metrics_lock)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    batches: Any
    if scenario in LOADER:
        stuck_at = 16 * args.at_step if scenario == "loader_worker" and faulty else None
        delay = args.sleep if scenario == "warmup_ok" and faulty else 0.0
        corrupt_at = 16 * args.at_step + 3 if scenario == "loader_crash" and faulty else None
        loader = DataLoader(Shards(16 * args.steps, rank, stuck_at, corrupt_at=corrupt_at), batch_size=16,
                            num_workers=1,
                            worker_init_fn=open_shards(delay), persistent_workers=False)
        batches = iter(loader)
    else:
        prefetch: queue.Queue[tuple[torch.Tensor, torch.Tensor]] = queue.Queue(maxsize=2)

        def prefetcher() -> None:
            generator = torch.Generator().manual_seed(rank)
            for step in range(args.steps):
                if scenario == "mesh_hang" and faulty and step == args.at_step:
                    return  # the prefetch thread hit an error it swallowed and ended
                prefetch.put((torch.randn(16, 32, generator=generator), torch.randn(16, 4, generator=generator)))

        threading.Thread(target=prefetcher, name="prefetch", daemon=True).start()
        batches = (prefetch.get() for _ in range(args.steps))

    accumulation = 3 if scenario == "accum" and faulty else 2
    micro_batches = args.steps * 2 if scenario == "accum" else args.steps
    loss_fn = nn.MSELoss()
    step = 0
    if scenario == "join_ok" and faulty:
        micro_batches -= 3  # this rank's shard is smaller
    joined = model.join() if scenario == "join_ok" else _null()  # type: ignore[operator]
    joined.__enter__()
    for micro in range(micro_batches):
        if scenario == "exit0" and faulty and step == args.at_step:
            # for step in range(len(loader) - 1): an off-by-some bound on this rank's shard count
            dist.destroy_process_group()
            sys.exit(0)
        if scenario == "accum":
            x, y = torch.randn(16, 32), torch.randn(16, 4)
        else:
            x, y = next(batches)
        time.sleep(args.step_time)
        if scenario == "fsdp_straggler" and faulty:
            # heavier augmentation on this rank's data: CPU work, not a sleep
            a = torch.randn(256, 256)
            for _ in range(40):
                a = torch.tanh(a @ a)
        at_fault = faulty and step == args.at_step
        if at_fault and scenario == "backward":
            assert net.prefetched is not None
            net.prefetched.clear()

            def fetch_from_host(done: threading.Event) -> None:
                time.sleep(3600)  # the host-to-device copy it waits on never completes
                done.set()

            threading.Thread(target=fetch_from_host, args=(net.prefetched,), name="offload", daemon=True).start()
        if at_fault and scenario == "optimizer":

            def log_weights() -> None:
                with metrics_lock:
                    time.sleep(3600)  # blocked writing to a metrics server that stopped answering

            threading.Thread(target=log_weights, name="metrics", daemon=True).start()
            time.sleep(0.2)
        if at_fault and scenario == "lock_hook":
            flushed.clear()

            def flush_stats() -> None:
                with stats_lock:
                    flushed.wait()  # waits for the next record while holding the lock the record needs

            threading.Thread(target=flush_stats, name="stats-flush", daemon=True).start()
            time.sleep(0.2)
        if at_fault and scenario == "fsdp_skip_rs":
            model.set_requires_gradient_sync(False)  # type: ignore[operator]
        use_aux = not (at_fault and scenario == "unused_crash")
        use_alt = scenario == "unused_ok" and faulty and step % 3 == 1
        if scenario == "accum":
            sync = (micro + 1) % accumulation == 0
            context = model.no_sync() if not sync else _null()  # type: ignore[operator]
            with context:
                loss = loss_fn(model(x), y) / accumulation
                loss.backward()
            if not sync:
                continue
        else:
            loss = loss_fn(model(x, use_aux, use_alt) if scenario not in FSDP else model(x), y)
            if at_fault and scenario == "nan_skip":
                loss = loss * float("nan")  # an fp16 overflow, say
            if not torch.isfinite(loss):
                print(f"rank {rank}: non-finite loss at step {step}, skipping the batch", flush=True)
                optimizer.zero_grad()
                step += 1
                continue
            loss.backward()
        if tp_group is not None:
            dist.all_reduce(loss.detach(), group=tp_group)
        optimizer.step()
        optimizer.zero_grad()
        if at_fault and scenario == "fsdp_skip_rs":
            model.set_requires_gradient_sync(True)  # type: ignore[operator]
        if at_fault and scenario == "ema_stuck":
            spectral_norm(net.trunk[2].weight)
        if step == args.at_step and scenario == "gather_hang":
            if faulty:
                threading.Event().wait()  # waits for the async metrics writer, which never signals
            metrics: list[Any] = [None] * world
            dist.all_gather_object(metrics, {"rank": rank, "loss": float(loss)})
        if at_fault and scenario == "segv":
            ctypes.string_at(0)  # a native extension reading through a null pointer
        if step == args.at_step and scenario in ("ckpt_stuck", "ckpt_slow_ok"):
            with tempfile.TemporaryDirectory() as directory:
                if scenario == "ckpt_stuck" and faulty:
                    state = {"model": net.state_dict(), "optimizer_shadow": torch.randn(1 << 20)}
                    torch.save(state, stuck_storage_path(directory))
                elif scenario == "ckpt_slow_ok" and rank == 0:
                    state = {"model": net.state_dict(), "optimizer_shadow": torch.randn(1 << 20)}
                    size = 4 * (1 << 20)
                    storage = ThrottledFile(os.path.join(directory, "checkpoint.pt"), size / args.sleep)
                    torch.save(state, storage)  # type: ignore[arg-type]
                    storage.close()
            dist.barrier()
        if step == args.at_step and scenario in ("eval_ok", "eval_slow_ok"):
            if rank == 0:
                evaluate(net, args.sleep, batch_load_s=3.0 if scenario == "eval_slow_ok" else 0.0)
            dist.barrier()
        step += 1
    joined.__exit__(None, None, None)
    dist.barrier()
    dist.destroy_process_group()


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def spectral_norm(weight: torch.Tensor, tolerance: float = 0.0) -> float:
    """Power iteration until the estimate moves less than ``tolerance`` (0: never, a config typo)."""
    with torch.no_grad():
        v = torch.randn(weight.shape[1])
        estimate = 0.0
        while True:
            u = torch.nn.functional.normalize(weight @ v, dim=0)
            v = torch.nn.functional.normalize(weight.t() @ u, dim=0)
            new = float(u @ weight @ v)
            if abs(new - estimate) < tolerance:
                return new
            estimate = new


def evaluate(net: Net, duration_s: float, batch_load_s: float = 0.0) -> float:
    """Validation over a held-out set: the unwrapped model, inference mode, batches from a DataLoader (its
    worker taking ``batch_load_s`` to load each batch of 4)."""
    net.eval()
    total, batches = 0.0, 0
    deadline = time.time() + duration_s
    if batch_load_s:
        loader = DataLoader(Shards(64, 999, read_s=batch_load_s / 4), batch_size=4, num_workers=1)
    else:
        loader = DataLoader(Shards(64, 999), batch_size=16)
    with torch.inference_mode():
        while time.time() < deadline:
            for x, y in loader:
                total += float(nn.functional.mse_loss(net(x), y))
                batches += 1
                time.sleep(0.02)
                if time.time() >= deadline:
                    break
    net.train()
    return total / max(batches, 1)


# --- third batch ------------------------------------------------------------------------------------------


def batch_for(rank: int, step: int, features: int = 32, size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(rank * 100_003 + step)
    return torch.randn(size, features, generator=generator), torch.randn(size, 4, generator=generator)


def foreground_crop(mask: torch.Tensor, width: int, generator: torch.Generator) -> torch.Tensor:
    """Rejection-sample a window that is mostly foreground, as detection / segmentation pipelines crop."""
    while True:
        start = int(torch.randint(0, mask.numel() - width + 1, (1,), generator=generator))
        if mask[start:start + width].float().mean() > 0.5:
            return torch.arange(start, start + width)


def run_compile_hang(args: argparse.Namespace, rank: int, world: int, faulty: bool) -> None:
    from torch.nn.parallel import DistributedDataParallel

    model = torch.compile(DistributedDataParallel(Net()))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(rank)
    for step in range(args.steps):
        x, y = batch_for(rank, step, features=64)
        mask = torch.ones(64, dtype=torch.bool)
        if faulty and step == args.at_step:
            mask[:] = False  # a sample whose annotation has no foreground at all
        x = x[:, foreground_crop(mask, 32, generator)]
        time.sleep(args.step_time)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def exchange(ops: list[dist.P2POp]) -> None:
    for work in dist.batch_isend_irecv(ops):
        work.wait()


def run_pipe_short(args: argparse.Namespace, rank: int, world: int, faulty: bool) -> None:
    """GPipe-style: every stage receives its micro-batches' activations from the previous stage, sends its own to
    the next, and the gradients come back the same way; the last stage holds the labels and the loss."""
    torch.manual_seed(rank)
    stage = nn.Sequential(nn.Linear(32, 32), nn.Tanh())
    optimizer = torch.optim.SGD(stage.parameters(), lr=0.01)
    first, last = rank == 0, rank == world - 1
    micro, batch = 4, 16
    loss = torch.zeros(())
    for step in range(args.steps):
        time.sleep(args.step_time)
        targets: list[torch.Tensor] = []
        if last:
            # the label loader filters bad samples: this batch came out one sample short
            short = faulty and step == args.at_step
            labels = torch.randn(batch - 1 if short else batch, 32)
            count = len(labels) // micro  # the remainder micro-batch is dropped
            targets = list(labels.split(micro))[:count]
        else:
            count = batch // micro
        if first:
            inputs = list(torch.randn(batch, 32).split(micro))
        else:
            inputs = [torch.empty(micro, 32) for _ in range(count)]
            exchange([dist.P2POp(dist.irecv, t, rank - 1) for t in inputs])
            inputs = [t.requires_grad_() for t in inputs]
        outputs = [stage(t) for t in inputs]
        if last:
            loss = sum(nn.functional.mse_loss(o, t) for o, t in zip(outputs, targets, strict=True)) / count
            loss.backward()
        else:
            exchange([dist.P2POp(dist.isend, o.detach(), rank + 1) for o in outputs])
            grads = [torch.empty_like(o) for o in outputs]
            exchange([dist.P2POp(dist.irecv, g, rank + 1) for g in grads])
            torch.autograd.backward(outputs, grads)
        if not first:
            exchange([dist.P2POp(dist.isend, t.grad, rank - 1) for t in inputs if t.grad is not None])
        optimizer.step()
        optimizer.zero_grad()
        logged = loss.detach().clone() if last else torch.zeros(())
        dist.broadcast(logged, src=world - 1)  # every stage logs the loss


class _AllToAll(torch.autograd.Function):
    """Token dispatch between expert ranks, differentiable (as MoE libraries write it)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x.contiguous())
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return _AllToAll.apply(grad)


def sinkhorn(scores: torch.Tensor, tolerance: float = 1e-3) -> torch.Tensor:
    """Balanced token-to-expert assignment (BASE-layer style): normalise rows and columns until converged."""
    plan = torch.exp(scores - scores.max())
    while True:
        plan = plan / plan.sum(dim=0, keepdim=True) / plan.shape[1]
        plan = plan / plan.sum(dim=1, keepdim=True) / plan.shape[0]
        error = (plan.sum(dim=0) * plan.shape[1] - 1).abs().max()
        if error < tolerance:
            return plan


class MoE(nn.Module):
    def __init__(self, world: int, capacity: int) -> None:
        super().__init__()
        self.world, self.capacity = world, capacity
        self.router = nn.Linear(32, world)
        self.expert = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.router(x)
        with torch.no_grad():
            expert_of = sinkhorn(scores.detach()).argmax(dim=1)
        gates = scores.softmax(dim=1)
        dispatch = torch.zeros(self.world, self.capacity, 32)
        chosen = []
        for e in range(self.world):
            tokens = (expert_of == e).nonzero().flatten()[:self.capacity]
            chosen.append(tokens)
            dispatch[e, :len(tokens)] = x[tokens] * gates[tokens, e:e + 1]
        received = _AllToAll.apply(dispatch.reshape(-1, 32))
        returned = _AllToAll.apply(self.expert(received)).reshape(self.world, self.capacity, 32)
        out = torch.zeros_like(x)
        for e, tokens in enumerate(chosen):
            out = out.index_add(0, tokens, returned[e, :len(tokens)])
        return x + out


def run_moe_hang(args: argparse.Namespace, rank: int, world: int, faulty: bool) -> None:
    torch.manual_seed(0)
    dense = nn.ModuleDict({"embed": nn.Linear(32, 32), "head": nn.Linear(32, 4)})
    torch.manual_seed(rank)
    moe = MoE(world, capacity=8)
    params = [*dense.parameters(), *moe.parameters()]
    optimizer = torch.optim.SGD(params, lr=0.01)
    for step in range(args.steps):
        x, y = batch_for(rank, step)
        if faulty and step == args.at_step:
            x[5] = float("nan")  # a corrupt sample
        time.sleep(args.step_time)
        loss = nn.functional.mse_loss(dense["head"](moe(dense["embed"](x))), y)
        loss.backward()
        # data-parallel gradients of the dense layers (every expert lives on one rank only)
        for p in dense.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= world
        optimizer.step()
        optimizer.zero_grad()


class StatsBlock(nn.Module):
    """A residual block that records its input's scale for the training dashboard."""

    def __init__(self, stats: dict[str, Any]) -> None:
        super().__init__()
        self.linear = nn.Linear(32, 32)
        self.stats = stats

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with self.stats["lock"]:
            self.stats["scale"].append(float(x.detach().abs().mean()))
        return x + torch.relu(self.linear(x))


class CheckpointedNet(nn.Module):
    def __init__(self, stats: dict[str, Any]) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([StatsBlock(stats) for _ in range(3)])
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return self.head(x)


def run_fsdp_ac_hang(args: argparse.Namespace, rank: int, world: int, faulty: bool) -> None:
    from torch.distributed.fsdp import fully_shard

    stats: dict[str, Any] = {"lock": threading.Lock(), "scale": []}
    net = CheckpointedNet(stats)
    for block in net.blocks:
        fully_shard(block)
    fully_shard(net)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)

    def upload() -> None:
        with stats["lock"]:
            time.sleep(3600)  # posting the stats to a dashboard that stopped answering, lock held

    for step in range(args.steps):
        x, y = batch_for(rank, step)
        time.sleep(args.step_time)
        loss = nn.functional.mse_loss(net(x), y)
        if faulty and step == args.at_step:
            threading.Thread(target=upload, name="dashboard", daemon=True).start()
            time.sleep(0.2)
        loss.backward()  # recomputes the checkpointed blocks' forwards
        optimizer.step()
        optimizer.zero_grad()


def remote_captions(round_trip_s: float) -> Callable[[list[Any]], Any]:
    from torch.utils.data import default_collate

    def collate(samples: list[Any]) -> Any:
        time.sleep(round_trip_s)  # one round trip per batch to a caption key-value store
        return default_collate(samples)

    return collate


def ddp_loop(args: argparse.Namespace, batches: Iterator[Any], net: Net | None = None,
             after_step: Callable[[int, nn.Module], None] | None = None) -> None:
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(net or Net())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        x, y = next(batches)
        time.sleep(args.step_time)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if after_step is not None:
            after_step(step, model)


def run_collate_straggler(args: argparse.Namespace, rank: int, world: int, faulty: bool) -> None:
    loader = DataLoader(Shards(16 * args.steps, rank), batch_size=16,
                        collate_fn=remote_captions(0.4 if faulty else 0.0))
    ddp_loop(args, iter(loader))


def run_oom_worker(args: argparse.Namespace, rank: int, world: int, faulty: bool) -> None:
    killed_at = 16 * args.at_step + 5 if faulty else None
    loader = DataLoader(Shards(16 * args.steps, rank, killed_at=killed_at), batch_size=16, num_workers=2)
    ddp_loop(args, iter(loader))


def run_grad_hook_raise(args: argparse.Namespace, rank: int, world: int, faulty: bool) -> None:
    net = Net()

    def guard(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
        def check(grad: torch.Tensor) -> torch.Tensor:
            if not torch.isfinite(grad).all():
                raise FloatingPointError(f"non-finite gradient in {name}")
            return grad

        return check

    for name, param in net.named_parameters():
        param.register_hook(guard(name))

    def batches() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for step in range(args.steps):
            x, y = batch_for(rank, step)
            if faulty and step == args.at_step:
                x[3, 7] = float("inf")  # an overflowed feature
            yield x, y

    ddp_loop(args, batches(), net=net)


def run_clip_skip(args: argparse.Namespace, rank: int, world: int, faulty: bool) -> None:
    from torch.distributed.fsdp import fully_shard

    net = Net()
    for layer in net.trunk:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(net)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    running: float | None = None
    for step in range(args.steps):
        x, y = batch_for(rank, step)
        if faulty and step == args.at_step:
            x = x * 50  # an outlier batch
        time.sleep(args.step_time)
        loss = nn.functional.mse_loss(net(x), y)
        loss.backward()
        value = float(loss)
        if running is not None and value > 10 * running:
            # loss-spike guard: drop this update (decided from this rank's own loss)
            print(f"rank {rank}: loss spike {value:.1f} at step {step}, skipping the update", flush=True)
            optimizer.zero_grad()
            continue
        running = value if running is None else 0.9 * running + 0.1 * value
        torch.nn.utils.clip_grad_norm_(net.parameters(), max_norm=1.0)
        optimizer.step()
        optimizer.zero_grad()


class PacedStream:
    """A file on storage that takes ``rate`` bytes a second (a throttled network file system)."""

    def __init__(self, inner: Any, rate: float) -> None:
        self.inner, self.rate = inner, rate

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        for start in range(0, len(view), 65536):
            chunk = view[start:start + 65536]
            begin = time.monotonic()
            self.inner.write(chunk)
            time.sleep(max(0.0, len(chunk) / self.rate - (time.monotonic() - begin)))
        return len(view)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def throttled_writer(path: str, rate: float) -> Any:
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.filesystem import FileSystem

    class ThrottledFileSystem(FileSystem):
        @contextmanager
        def create_stream(self, path: Any, mode: str) -> Any:
            with super().create_stream(path, mode) as stream:
                yield PacedStream(stream, rate) if "w" in mode else stream

    writer = FileSystemWriter(path)
    writer.fs = ThrottledFileSystem()
    return writer


def run_dcp_slow_ok(args: argparse.Namespace, rank: int, world: int, faulty: bool) -> None:
    import torch.distributed.checkpoint as dcp

    directory = args.ckpt_dir or os.path.join(tempfile.gettempdir(), f"dcp-{os.environ.get('MASTER_PORT', '0')}")
    ema = torch.randn(1 << 20)  # an EMA of the weights, the same on every rank: DCP writes it from one rank

    def save(step: int, model: nn.Module) -> None:
        if step == args.at_step:
            state = {"model": model.module.state_dict(), "ema": ema, "step": step}
            dcp.save(state, storage_writer=throttled_writer(directory, 4 * (1 << 20) / args.sleep))

    try:
        ddp_loop(args, (batch_for(rank, step) for step in range(args.steps)), after_step=save)
    finally:
        if rank == 0:
            shutil.rmtree(directory, ignore_errors=True)


def run_eval_ddp_ok(args: argparse.Namespace, rank: int, world: int, faulty: bool) -> None:
    def validate(step: int, model: nn.Module) -> None:
        if step != args.at_step:
            return
        model.eval()
        total = torch.zeros(2)
        # rank 0's share of the validation set is the long tail: it runs five times as long
        deadline = time.time() + (args.sleep if rank == 0 else args.sleep / 5)
        loader = DataLoader(Shards(64, 1000 + rank), batch_size=16)
        with torch.no_grad():
            while time.time() < deadline:
                for x, y in loader:
                    total += torch.tensor([float(nn.functional.mse_loss(model(x), y)), 1.0])
                    time.sleep(0.02)
                    if time.time() >= deadline:
                        break
        dist.all_reduce(total)  # the validation loss over every rank's share
        model.train()

    ddp_loop(args, (batch_for(rank, step) for step in range(args.steps)), after_step=validate)


THIRD_BATCH: dict[str, Callable[[argparse.Namespace, int, int, bool], None]] = {
    "compile_hang": run_compile_hang,
    "pipe_short": run_pipe_short,
    "moe_hang": run_moe_hang,
    "fsdp_ac_hang": run_fsdp_ac_hang,
    "collate_straggler": run_collate_straggler,
    "oom_worker": run_oom_worker,
    "grad_hook_raise": run_grad_hook_raise,
    "clip_skip": run_clip_skip,
    "dcp_slow_ok": run_dcp_slow_ok,
    "eval_ddp_ok": run_eval_ddp_ok,
}


if __name__ == "__main__":
    main()
