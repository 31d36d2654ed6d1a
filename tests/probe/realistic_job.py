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
"""

from __future__ import annotations

import argparse
import ctypes
import os
import queue
import sys
import tempfile
import threading
import time
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
)
FSDP = ("fsdp_skip_rs", "fsdp_straggler", "mesh_hang")
LOADER = ("loader_worker", "warmup_ok", "loader_crash")


# --- data -------------------------------------------------------------------------------------------------


class Shards(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Samples read from "shards"; ``stuck_at`` is an index whose read never returns (a hung mount)."""

    def __init__(self, length: int, seed: int, stuck_at: int | None = None, read_s: float = 0.0,
                 corrupt_at: int | None = None) -> None:
        self.length, self.seed, self.stuck_at, self.read_s = length, seed, stuck_at, read_s
        self.corrupt_at = corrupt_at

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if index == self.stuck_at:
            # read() on a file of a mount whose server went away: blocks until the server is back
            read_end, _write_end = os.pipe()
            os.read(read_end, 1)
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
    args = parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(hours=1))
    rank, world = dist.get_rank(), dist.get_world_size()
    faulty = rank == args.rank
    scenario = args.scenario
    torch.manual_seed(0)
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


if __name__ == "__main__":
    main()
