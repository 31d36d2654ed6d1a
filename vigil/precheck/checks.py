"""The individual checks. Each measures one thing on this rank and returns a CheckResult.

Collective checks run over the process group they are given - the job's own group when PreCheck
runs inside a job, a fresh gloo group when ``vigil precheck`` starts its own ranks - because a
path that is fine for a generic test can still be slow for the job's particular ranks.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist


@dataclass
class CheckResult:
    name: str
    value: float | None
    unit: str
    higher_is_better: bool = True
    detail: str = ""
    skipped: bool = False
    # Filled by the verdict: the baseline compared against and whether this rank passed.
    baseline: float | None = None
    ok: bool | None = None
    attrs: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CheckResult:
        return cls(**data)


def _timed(fn: Any, repeats: int) -> list[float]:
    durations = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        durations.append(time.perf_counter() - start)
    return durations


def allreduce_bandwidth(group: Any = None, size_mb: float = 8.0, repeats: int = 5) -> CheckResult:
    """Bus bandwidth of a float32 all-reduce (nccl-tests' busbw = algbw * 2(n-1)/n), median of repeats."""
    world = dist.get_world_size(group)
    numel = max(1, int(size_mb * 1e6 / 4))
    tensor = torch.ones(numel, device=_device(group))
    dist.all_reduce(tensor, group=group)  # warm-up: connection set-up is not bandwidth
    _sync(tensor)

    def once() -> None:
        dist.all_reduce(tensor, group=group)
        _sync(tensor)

    median = statistics.median(_timed(once, repeats))
    algbw = numel * 4 / median / 1e9
    busbw = algbw * 2 * (world - 1) / world if world > 1 else algbw
    return CheckResult("allreduce_busbw", busbw, "GB/s", detail=f"{size_mb:g} MB x {repeats}, {world} ranks")


def allreduce_latency(group: Any = None, repeats: int = 20) -> CheckResult:
    """Median time of a one-element all-reduce: the latency floor of the job's collectives."""
    tensor = torch.ones(1, device=_device(group))
    dist.all_reduce(tensor, group=group)
    _sync(tensor)

    def once() -> None:
        dist.all_reduce(tensor, group=group)
        _sync(tensor)

    median = statistics.median(_timed(once, repeats))
    return CheckResult("allreduce_latency", median * 1e6, "us", higher_is_better=False, detail=f"median of {repeats}")


def device_to_host_bandwidth(size_mb: float = 64.0, repeats: int = 5) -> CheckResult:
    """GPU -> pinned host copy bandwidth; on a machine without CUDA, skipped (there is no device)."""
    if not torch.cuda.is_available():
        return CheckResult("d2h_bandwidth", None, "GB/s", skipped=True, detail="no CUDA device")
    numel = int(size_mb * 1e6 / 4)
    device = torch.empty(numel, device="cuda")
    host = torch.empty(numel, pin_memory=True)
    host.copy_(device, non_blocking=True)
    torch.cuda.synchronize()

    def once() -> None:
        host.copy_(device, non_blocking=True)
        torch.cuda.synchronize()

    median = statistics.median(_timed(once, repeats))
    return CheckResult("d2h_bandwidth", numel * 4 / median / 1e9, "GB/s", detail=f"{size_mb:g} MB pinned")


def host_memcpy_bandwidth(size_mb: float = 64.0, repeats: int = 5) -> CheckResult:
    """Host memory copy bandwidth: the data-loader / staging path, and the CPU stand-in for D2H."""
    numel = int(size_mb * 1e6 / 4)
    source, target = torch.ones(numel), torch.empty(numel)
    target.copy_(source)
    median = statistics.median(_timed(lambda: target.copy_(source), repeats))
    return CheckResult("host_memcpy_bandwidth", numel * 4 / median / 1e9, "GB/s", detail=f"{size_mb:g} MB")


def matmul_throughput(n: int = 512, repeats: int = 5) -> CheckResult:
    """float32 matmul throughput in GFLOP/s on this rank's device (best of repeats)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    torch.matmul(a, b)
    _sync(a)

    def once() -> None:
        torch.matmul(a, b)
        _sync(a)

    best = min(_timed(once, repeats))
    return CheckResult("matmul_gflops", 2 * n**3 / best / 1e9, "GFLOP/s", detail=f"{n}x{n} fp32 on {device}")


def nvml_health() -> list[CheckResult]:
    """Per-GPU health from NVML: volatile double-bit ECC errors, pending page retirement, PCIe link width.

    A GPU whose PCIe link trained below its maximum width (a classic silent slowdown) fails here.
    Skipped when NVML is not present (no NVIDIA driver on this machine).
    """
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as err:  # the library raises its own error types, or ImportError
        return [CheckResult("nvml_health", None, "", skipped=True, detail=f"NVML unavailable: {type(err).__name__}")]
    results = []
    try:
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            problems = []
            try:
                dbe = pynvml.nvmlDeviceGetTotalEccErrors(
                    handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
                )
                if dbe:
                    problems.append(f"{dbe} volatile uncorrected ECC errors")
            except pynvml.NVMLError:
                pass
            try:
                if pynvml.nvmlDeviceGetRetiredPagesPendingStatus(handle):
                    problems.append("page retirement pending (reset needed)")
            except pynvml.NVMLError:
                pass
            try:
                width = pynvml.nvmlDeviceGetCurrPcieLinkWidth(handle)
                max_width = pynvml.nvmlDeviceGetMaxPcieLinkWidth(handle)
                if width < max_width:
                    problems.append(f"PCIe link x{width} below x{max_width}")
            except pynvml.NVMLError:
                pass
            results.append(
                CheckResult(
                    f"nvml_health/gpu{index}",
                    float(len(problems)),
                    "problems",
                    higher_is_better=False,
                    detail="; ".join(problems) or "ok",
                    ok=not problems,
                )
            )
    finally:
        pynvml.nvmlShutdown()
    return results


def _device(group: Any) -> str:
    backend = dist.get_backend(group)
    return "cuda" if backend == "nccl" else "cpu"


def _sync(tensor: torch.Tensor) -> None:
    if tensor.is_cuda:
        torch.cuda.synchronize()
