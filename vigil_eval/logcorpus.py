"""A labelled corpus of multi-rank job failures, to measure root-error triage.

Each case is the log directory of one failed job: one log per rank (Python logging, NCCL INFO / WARN,
tracebacks), the kernel log of each node (dmesg -T or journal form) and the launcher's log; the label
is the line that started the failure. The formats follow the real ones (PyTorch ProcessGroupNCCL and
gloo messages, NCCL's debug.cc layout, NVRM Xid, mlx5, OOM killer, faulthandler, torchrun); the
symptoms are what healthy ranks print: watchdog timeouts ten minutes later, remote errors, closed
connections, launcher reports. Some cases add a later, unrelated-looking root-like error on a healthy
rank (CUDA errors after an NCCL abort, a second exception) and clock skew between nodes, so that the
first error by time - not the loudest - has to be found.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from vigil.knowledge.xid import xid_info

RANKS_PER_NODE = 4
BASE_TIME = 1_785_000_000.0  # 2026-07-25, a fixed epoch keeps the corpus reproducible


@dataclass(frozen=True)
class RootLabel:
    """Where the root error is: (file relative to the job directory, 1-based line); alternates are lines
    that report the same fault at the same moment (the Xid and the CUDA error it causes). ``fault_type`` is the
    fault type or finding of THE fault catalogue the root line establishes (an Xid's from THE Xid table), None
    when it names none (an application error: a Python exception, a device-side assert, a full disk)."""

    kind: str
    source: str
    lineno: int
    fault_type: str | None
    rank: int | None
    alternates: tuple[tuple[str, int], ...] = ()

    def accepts(self, source: str, lineno: int) -> bool:
        return (source, lineno) == (self.source, self.lineno) or (source, lineno) in self.alternates


@dataclass
class _Job:
    directory: Path
    world: int
    rng: random.Random
    start: float
    skew: dict[str, float] = field(default_factory=dict)
    logs: dict[str, list[str]] = field(default_factory=dict)
    pids: dict[int, int] = field(default_factory=dict)

    def node(self, rank: int) -> str:
        return f"n{rank // RANKS_PER_NODE:03d}"

    def rank_file(self, rank: int) -> str:
        return f"{self.node(rank)}/rank_{rank}.log"

    def node_file(self, node: str) -> str:
        return f"{node}/dmesg.log"

    def when(self, node: str, t: float) -> float:
        return t + self.skew.setdefault(node, self.rng.uniform(-0.3, 0.3))

    def iso(self, node: str, t: float) -> str:
        moment = datetime.fromtimestamp(self.when(node, t), tz=UTC)
        return moment.strftime("%Y-%m-%d %H:%M:%S,") + f"{moment.microsecond // 1000:03d}"

    def emit(self, source: str, line: str) -> int:
        lines = self.logs.setdefault(source, [])
        lines.append(line)
        return len(lines)

    def log(self, rank: int, t: float, level: str, message: str) -> int:
        return self.emit(
            self.rank_file(rank), f"{self.iso(self.node(rank), t)} {level} [rank{rank}] {message}"
        )

    def raw(self, rank: int, line: str) -> int:
        return self.emit(self.rank_file(rank), line)

    def nccl_warn(self, rank: int, t: float, where: str, message: str) -> int:
        node = self.node(rank)
        stamp = datetime.fromtimestamp(self.when(node, t), tz=UTC).strftime("[%Y-%m-%d %H:%M:%S]")
        origin = f"{node}:{self.pids[rank]}:{self.pids[rank] + 71} [{rank % RANKS_PER_NODE}]"
        return self.raw(rank, f"{stamp} {origin} {where} NCCL WARN {message}")

    def kernel(self, node: str, t: float, message: str) -> int:
        local = datetime.fromtimestamp(self.when(node, t), tz=UTC)
        if sum(map(ord, node)) % 2:
            line = f"[{local.strftime('%a %b %d %H:%M:%S %Y')}] {message}"
        else:
            line = f"kern  :err   : {local.strftime('%Y-%m-%dT%H:%M:%S')},{local.microsecond:06d}+00:00 {message}"
        return self.emit(self.node_file(node), line)

    def write(self) -> None:
        for name, lines in self.logs.items():
            path = self.directory / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _traceback(job: _Job, rank: int, user_frames: list[tuple[str, int, str]], library: bool = True) -> None:
    job.raw(rank, "Traceback (most recent call last):")
    for path, line, func in user_frames:
        job.raw(rank, f'  File "{path}", line {line}, in {func}')
        job.raw(rank, "    loss = model(batch)")
    if library:
        lib = "/usr/local/lib/python3.11/site-packages/torch/nn/modules/module.py"
        job.raw(rank, f'  File "{lib}", line 1775, in _call_impl')
        job.raw(rank, "    return forward_call(*args, **kwargs)")
        job.raw(rank, "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^")


USER_FRAMES = [
    ("/workspace/train.py", 212, "main"),
    ("/workspace/train.py", 148, "train_step"),
    ("/workspace/model/attention.py", 87, "forward"),
]


def _start(job: _Job) -> None:
    for rank in range(job.world):
        job.pids[rank] = 40_000 + 17 * rank + job.rng.randrange(1000)
        node = job.node(rank)
        pid = job.pids[rank]
        job.log(rank, job.start, "INFO", f"starting worker pid {pid} world_size {job.world}")
        job.raw(
            rank,
            f"{node}:{pid}:{pid} [{rank % RANKS_PER_NODE}] NCCL INFO Bootstrap : Using ib0:10.0.0.{rank}<0>",
        )
        job.raw(
            rank,
            f"{node}:{pid}:{pid + 9} [{rank % RANKS_PER_NODE}] NCCL INFO Channel 00/0 : "
            f"{rank}[{rank % RANKS_PER_NODE}] -> {(rank + 1) % job.world}[0] via NET/IB/0",
        )
        job.raw(
            rank,
            f"{node}:{pid}:{pid} [{rank % RANKS_PER_NODE}] NCCL INFO comm 0x55d0 rank {rank} "
            f"nranks {job.world} cudaDev {rank % RANKS_PER_NODE} busId 3b000 commId 0x9f1 - Init COMPLETE",
        )
        for step in range(0, job.rng.randrange(3, 9) * 10, 10):
            t = job.start + 5 + step
            job.log(rank, t, "INFO", f"step {step} loss {3.2 - step / 100:.4f} lr 3.0e-04 tokens/s 51234")
            if job.rng.random() < 0.1:
                job.log(rank, t + 1, "WARNING", "eval error rate 0.12 above target 0.10, continuing")
    for node in sorted({job.node(r) for r in range(job.world)}):
        job.kernel(node, job.start - 3600, "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15")
        job.kernel(
            node, job.start - 3500, "mlx5_core 0000:0c:00.0: Port module event: module 0, Cable plugged"
        )


def _cascade(job: _Job, failed: set[int], t_fail: float, mode: str) -> None:
    """What the healthy ranks print after the failure, and the launcher's report."""
    for rank in range(job.world):
        if rank in failed:
            continue
        if mode == "timeout":
            t = t_fail + 600 + job.rng.uniform(0, 2)
            seq = 1580 + job.rng.randrange(3)
            job.log(
                rank,
                t,
                "ERROR",
                f"[PG ID 0 PG GUID 0(default_pg) Rank {rank}] Watchdog caught collective "
                f"operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=1048576, "
                "NumelOut=1048576, Timeout(ms)=600000) ran for 600004 milliseconds before timing out.",
            )
            job.log(
                rank,
                t + 0.01,
                "ERROR",
                f"[PG ID 0 PG GUID 0(default_pg) Rank {rank}] Exception (either an error "
                f"or timeout) detected by watchdog at work: {seq}, last enqueued NCCL work: "
                f"{seq}, last completed NCCL work: {seq - 1}.",
            )
            job.raw(
                rank,
                f"[rank{rank}]: torch.distributed.DistBackendError: [Rank {rank}] Watchdog caught collective "
                "operation timeout",
            )
        elif mode == "remote":
            t = t_fail + job.rng.uniform(0.5, 20)
            job.log(
                rank,
                t,
                "ERROR",
                "NCCL error: remote process exited or there was a network error, NCCL version 2.21.5",
            )
            job.raw(
                rank,
                "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, "
                "remote process exited or there was a network error, NCCL version 2.21.5",
            )
        else:
            t = t_fail + job.rng.uniform(0.2, 5)
            job.log(rank, t, "ERROR", "collective failed")
            job.raw(
                rank,
                "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by "
                f"peer [10.0.0.{min(failed)}]:{29500 + rank}",
            )
    launcher = "launcher.log"
    t = t_fail + (605 if mode == "timeout" else 25)
    stamp = datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%d %H:%M:%S,000")
    victim = min(failed)
    job.emit(
        launcher,
        f"{stamp} WARNING torch.distributed.elastic.multiprocessing.api: Sending process "
        f"{job.pids[(victim + 1) % job.world]} closing signal SIGTERM",
    )
    job.emit(
        launcher,
        f"{stamp} ERROR torch.distributed.elastic.multiprocessing.api: failed (exitcode: 1) "
        f"local_rank: {victim % RANKS_PER_NODE} (pid: {job.pids[victim]}) of binary: /usr/bin/python",
    )
    job.emit(launcher, "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ")
    job.emit(launcher, f"  rank      : {victim} (local_rank: {victim % RANKS_PER_NODE})")


def _late_decoy(job: _Job, failed: set[int], t_fail: float) -> None:
    """A healthy rank fails loudly later (a common sight after communicators abort)."""
    healthy = [r for r in range(job.world) if r not in failed]
    if healthy and job.rng.random() < 0.4:
        rank = job.rng.choice(healthy)
        job.log(rank, t_fail + 640, "ERROR", "aborting after collective failure")
        job.raw(rank, "RuntimeError: CUDA error: unspecified launch failure")


# ---------------------------------------------------------------------------- failure kinds


def _python_exception(job: _Job, r: int, t: float) -> RootLabel:
    job.log(r, t, "INFO", "loading shard 17 of dataset")
    _traceback(job, r, USER_FRAMES[:2], library=False)
    line = job.raw(r, "KeyError: 'input_ids'")
    _cascade(job, {r}, t, job.rng.choice(["timeout", "gloo"]))
    return RootLabel("python_exception", job.rank_file(r), line, None, r)


def _cuda_oom(job: _Job, r: int, t: float) -> RootLabel:
    job.log(r, t - 1, "INFO", "step 7760 loss 2.0131 lr 3.0e-04 tokens/s 51234")
    _traceback(job, r, USER_FRAMES)
    line = job.raw(
        r,
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total "
        "capacity of 79.15 GiB of which 1.21 GiB is free.",
    )
    _cascade(job, {r}, t, "timeout")
    _late_decoy(job, {r}, t)
    return RootLabel("cuda_oom", job.rank_file(r), line, "gpu_oom", r)


def _illegal_memory_access(job: _Job, r: int, t: float) -> RootLabel:
    job.log(r, t, "ERROR", "exception in training step")
    _traceback(job, r, USER_FRAMES)
    line = job.raw(r, "RuntimeError: CUDA error: an illegal memory access was encountered")
    job.raw(
        r,
        "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
        "below might be incorrect.",
    )
    job.raw(r, "For debugging consider passing CUDA_LAUNCH_BLOCKING=1")
    _cascade(job, {r}, t, "timeout")
    return RootLabel("illegal_memory_access", job.rank_file(r), line, None, r)


def _device_assert(job: _Job, r: int, t: float) -> RootLabel:
    line = job.raw(
        r,
        "../aten/src/ATen/native/cuda/IndexKernel.cu:92: operator(): block: [13,0,0], thread: [64,0,0] "
        'Assertion `-sizes[i] <= index && index < sizes[i] && "index out of bounds"` failed.',
    )
    job.log(r, t, "ERROR", "exception in training step")
    _traceback(job, r, USER_FRAMES)
    alt = job.raw(r, "RuntimeError: CUDA error: device-side assert triggered")
    _cascade(job, {r}, t, "timeout")
    return RootLabel(
        "device_assert", job.rank_file(r), line, None, r, ((job.rank_file(r), alt),)
    )


def _xid(job: _Job, r: int, t: float, code: int, text: str, rank_error: str | None) -> RootLabel:
    node = job.node(r)
    line = job.kernel(
        node,
        t,
        f"NVRM: Xid (PCI:0000:{0x1B + 0x20 * (r % 4):02x}:00): {code}, "
        f"pid={job.pids[r]}, name=python, {text}",
    )
    alternates: tuple[tuple[str, int], ...] = ()
    if rank_error is not None:
        _traceback(job, r, USER_FRAMES)
        alternates = ((job.rank_file(r), job.raw(r, rank_error)),)
        job.log(r, t + 0.4, "ERROR", "worker exiting")
    _cascade(job, {r}, t, "timeout")
    _late_decoy(job, {r}, t)
    return RootLabel(f"xid_{code}", job.node_file(node), line, xid_info(code).fault, r, alternates)


def _ecc(job: _Job, r: int, t: float) -> RootLabel:
    return _xid(
        job,
        r,
        t,
        48,
        "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer",
        "RuntimeError: CUDA error: uncorrectable ECC error encountered",
    )


def _fallen_off_bus(job: _Job, r: int, t: float) -> RootLabel:
    return _xid(
        job,
        r,
        t,
        79,
        "GPU has fallen off the bus.",
        "RuntimeError: CUDA error: unknown error",
    )


def _gsp_timeout(job: _Job, r: int, t: float) -> RootLabel:
    label = _xid(
        job,
        r,
        t,
        119,
        "Timeout after 6s of waiting for RPC response from GPU1 GSP! Expected function 76 "
        "(GSP_RM_CONTROL) (0x20801813 0x4c).",
        None,
    )
    job.log(
        r,
        t + 480,
        "ERROR",
        "ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress "
        "in monitoring enqueued collectives.",
    )
    return label


def _ib_completion(job: _Job, r: int, t: float) -> RootLabel:
    peer = (r + 1) % job.world
    line = job.nccl_warn(
        r,
        t,
        "transport/net_ib.cc:1696",
        f"NET/IB : Got completion from peer 10.0.0.{peer}<45312> "
        "with status=IBV_WC_RETRY_EXC_ERR(12) opcode=0 len=0 "
        "vendor_err=129 localGid ::ffff:10.0.0.1 remoteGids "
        f"::ffff:10.0.0.{peer} hca mlx5_{r % 4}",
    )
    job.nccl_warn(
        r,
        t + 0.01,
        "proxy.cc:1523",
        "[Service thread] Error encountered progressing operation=Connect, res=3, closing connection",
    )
    job.log(
        r,
        t + 0.2,
        "ERROR",
        "NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled "
        "system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5",
    )
    _cascade(job, {r}, t, "remote")
    return RootLabel("ib_completion_error", job.rank_file(r), line, None, r)


def _link_flap(job: _Job, r: int, t: float) -> RootLabel:
    node = job.node(r)
    line = job.kernel(node, t, f"mlx5_core 0000:{0x0C + r % 4:02x}:00.0 ib{r % 4}: Link down")
    job.kernel(node, t + 4, f"mlx5_core 0000:{0x0C + r % 4:02x}:00.0 ib{r % 4}: Link up")
    job.nccl_warn(
        r, t + 0.3, "transport/net_ib.cc:112", f"NET/IB : mlx5_{r % 4}:1 Got async event : port error"
    )
    job.log(r, t + 1, "ERROR", "NCCL error: unhandled system error, NCCL version 2.21.5")
    _cascade(job, {r}, t, "remote")
    return RootLabel("nic_link_flap", job.node_file(node), line, "link_down", r)


def _host_oom(job: _Job, r: int, t: float) -> RootLabel:
    node = job.node(r)
    job.kernel(
        node,
        t - 0.2,
        "python invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0",
    )
    line = job.kernel(
        node,
        t,
        f"Out of memory: Killed process {job.pids[r]} (python) total-vm:812345672kB, "
        "anon-rss:498765432kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:970000kB oom_score_adj:0",
    )
    _cascade(job, {r}, t, job.rng.choice(["remote", "gloo"]))
    return RootLabel("host_oom_kill", job.node_file(node), line, "host_oom", r)


def _segfault(job: _Job, r: int, t: float) -> RootLabel:
    node = job.node(r)
    line = job.raw(r, "Fatal Python error: Segmentation fault")
    job.raw(r, "")
    job.raw(r, f"Thread 0x00007f{r:02x}1c7fe640 (most recent call first):")
    job.raw(
        r,
        '  File "/usr/local/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2501 '
        "in all_reduce",
    )
    alt = job.kernel(
        node,
        t + 0.05,
        f"pt_main_thread[{job.pids[r]}]: segfault at 7f797fe00000 ip 00007f7c7ac69996 "
        "sp 00007f7c12fd7c30 error 4 in libnccl.so.2[7f7c7ac00000+d3d3000]",
    )
    _cascade(job, {r}, t, "remote")
    return RootLabel("segfault", job.node_file(node), alt, "process_crash", r, ((job.rank_file(r), line),))


def _filesystem(job: _Job, r: int, t: float) -> RootLabel:
    job.log(r, t - 2, "INFO", "saving checkpoint step 8000 to /ckpt/run17/step_8000")
    _traceback(job, r, [("/workspace/train.py", 301, "save_checkpoint")])
    line = job.raw(r, "OSError: [Errno 28] No space left on device: '/ckpt/run17/step_8000/model_03.pt'")
    _cascade(job, {r}, t, "timeout")
    return RootLabel("filesystem_error", job.rank_file(r), line, None, r)


def _nan_loss(job: _Job, r: int, t: float) -> RootLabel:
    line = job.log(r, t, "WARNING", "step 8120 loss is nan, grad_norm inf")
    _traceback(job, r, [("/workspace/train.py", 166, "check_finite")], library=False)
    job.raw(r, "FloatingPointError: non-finite loss at step 8120")
    _cascade(job, {r}, t, "timeout")
    return RootLabel("nan_loss", job.rank_file(r), line, "nan_loss", r)


def _dataloader_oom(job: _Job, r: int, t: float) -> RootLabel:
    node = job.node(r)
    worker = job.pids[r] + 400
    line = job.kernel(
        node,
        t,
        f"Out of memory: Killed process {worker} (pt_data_worker) total-vm:91234567kB, "
        "anon-rss:81234567kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:170000kB oom_score_adj:0",
    )
    job.log(r, t + 1.5, "ERROR", "data loading failed")
    _traceback(job, r, USER_FRAMES[:1])
    alt = job.raw(r, f"RuntimeError: DataLoader worker (pid {worker}) is killed by signal: Killed. ")
    _cascade(job, {r}, t, "timeout")
    return RootLabel(
        "dataloader_killed", job.node_file(node), line, "host_oom", r, ((job.rank_file(r), alt),)
    )


FAILURE_KINDS: dict[str, Callable[[_Job, int, float], RootLabel]] = {
    "python_exception": _python_exception,
    "cuda_oom": _cuda_oom,
    "illegal_memory_access": _illegal_memory_access,
    "device_assert": _device_assert,
    "xid_48_ecc": _ecc,
    "xid_79_fallen_off_bus": _fallen_off_bus,
    "xid_119_gsp_timeout": _gsp_timeout,
    "ib_completion_error": _ib_completion,
    "nic_link_flap": _link_flap,
    "host_oom_kill": _host_oom,
    "segfault": _segfault,
    "filesystem_error": _filesystem,
    "nan_loss": _nan_loss,
    "dataloader_oom": _dataloader_oom,
}


def simulate_failure(kind: str, directory: Path, seed: int, world: int | None = None) -> RootLabel:
    """Write the logs of one failed job of ``kind`` under ``directory`` and return its label."""
    rng = random.Random(seed)
    world = world or rng.choice([2, 4, 8, 16, 32])
    job = _Job(directory, world, rng, BASE_TIME + rng.randrange(86_400))
    _start(job)
    culprit = rng.randrange(world)
    t_fail = job.start + 100 + rng.uniform(0, 50)
    label = FAILURE_KINDS[kind](job, culprit, t_fail)
    job.write()
    return label


def simulate_corpus(directory: Path, per_kind: int, seed: int = 0) -> list[tuple[Path, RootLabel]]:
    """``per_kind`` failed jobs of every kind, each in its own sub-directory."""
    cases = []
    for k, kind in enumerate(sorted(FAILURE_KINDS)):
        for i in range(per_kind):
            case = directory / f"{kind}-{i:03d}"
            cases.append((case, simulate_failure(kind, case, seed=seed * 100_003 + k * 1_009 + i)))
    return cases
