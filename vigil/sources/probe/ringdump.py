"""Which backends' Flight Recorder rings the probe reads, and torch's function that dumps each (torch 2.13; the
formats and where they differ are in vigil.sources.probe.flight's docstring). No dependency on the probe, so
the probe's evidence dump can use it too."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

# The backends whose collectives are read from the ring (comma-separated), default gloo.
ENV_FR_BACKENDS = "VIGIL_FR_BACKENDS"
FR_BACKENDS = ("gloo",)


@dataclass(frozen=True)
class RingFormat:
    """How one backend's ring is dumped and read (see vigil.sources.probe.flight)."""

    backend: str
    # The function of ``torch._C._distributed_c10d`` that dumps it (pickle).
    dump_name: str
    # The entry field the ``pg_status`` counters number ops by.
    counter_key: str
    # Entries carry the Work's CUDA events: ``state`` / ``time_discovered_completed_ns`` say the GPU finished.
    gpu_events: bool


RING_FORMATS = {
    "gloo": RingFormat("gloo", "_dump_fr_trace", "op_id", gpu_events=False),
    "nccl": RingFormat("nccl", "_dump_nccl_trace", "collective_seq_id", gpu_events=True),
}


def fr_backends() -> tuple[str, ...]:
    """The backends read from the ring: ``VIGIL_FR_BACKENDS`` (names torch's dump is known for), else gloo."""
    raw = os.environ.get(ENV_FR_BACKENDS)
    if raw is None or not raw.strip():
        return FR_BACKENDS
    return tuple(name for name in (part.strip().lower() for part in raw.split(",")) if name in RING_FORMATS)


def flight_recorder_dump(backend: str = "gloo") -> Any:
    """torch's in-process dump function of ``backend``'s ring, or None when this torch has none (NCCL's
    only exists in CUDA builds) or records nothing."""
    fmt = RING_FORMATS.get(backend)
    if fmt is None or not fr_buffer_set():
        return None
    try:
        import torch._C._distributed_c10d as c10d
    except ImportError:
        return None
    return getattr(c10d, fmt.dump_name, None)


def fr_buffer_set() -> bool:
    """Whether the ring is asked for (``TORCH_FR_BUFFER_SIZE``, or NCCL's older name for it)."""
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        value = os.environ.get(name)
        if value is not None and value.strip() not in ("", "0"):
            return True
    return False


def default_backend() -> str | None:
    """The default process group's backend (``gloo``, ``nccl``), or None without one."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return None
    try:
        return str(dist.get_backend()).lower()
    except (RuntimeError, ValueError):
        return None
