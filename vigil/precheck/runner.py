"""Run the checks: inside a job (on its own process group) or as a local N-rank gloo job.

``run_checks(group)`` is what a training script calls before its first step. ``run_local`` is what
``vigil precheck`` does: start N ranks of ``python -m vigil.precheck.runner``, gather every rank's
results on rank 0 and return them, so the verdict sees each machine (grouped by node name).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist

from vigil.model import VigilInputError
from vigil.precheck.checks import (
    CheckResult,
    allreduce_bandwidth,
    allreduce_latency,
    device_to_host_bandwidth,
    host_memcpy_bandwidth,
    matmul_throughput,
    nvml_health,
)


@dataclass
class CheckOptions:
    allreduce_mb: float = 8.0
    memcpy_mb: float = 64.0
    matmul_n: int = 512
    repeats: int = 5


def node_name() -> str:
    """The machine a rank runs on: VIGIL_NODE_NAME / NODE_NAME (Kubernetes downward API) or the hostname."""
    return os.environ.get("VIGIL_NODE_NAME") or os.environ.get("NODE_NAME") or socket.gethostname()


def run_checks(group: Any = None, options: CheckOptions | None = None) -> list[CheckResult]:
    """Every check on this rank; collective ones over ``group`` (default: the world group)."""
    options = options or CheckOptions()
    results = [
        allreduce_bandwidth(group, options.allreduce_mb, options.repeats),
        allreduce_latency(group, repeats=max(options.repeats * 4, 10)),
        device_to_host_bandwidth(options.memcpy_mb, options.repeats),
        host_memcpy_bandwidth(options.memcpy_mb, options.repeats),
        matmul_throughput(options.matmul_n, options.repeats),
    ]
    results.extend(nvml_health())
    return results


def gather(results: list[CheckResult], group: Any = None) -> list[tuple[str, list[CheckResult]]]:
    """Every rank's (node name, results), on every rank."""
    mine = (node_name(), [r.to_dict() for r in results])
    everyone: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    return [(host, [CheckResult.from_dict(r) for r in rows]) for host, rows in everyone]


def _worker(out: Path, rendezvous: Path, options: CheckOptions) -> None:
    import torch

    # Ranks sharing a machine split its cores; oversubscribed threads would measure contention.
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_ranks))
    # The ranks share a machine, so they meet through a file rather than a TCP port that could be taken
    # between choosing it and binding it.
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))
    try:
        per_rank = gather(run_checks(None, options))
        if dist.get_rank() == 0:
            payload = [
                {"rank": r, "host": host, "results": [c.to_dict() for c in res]}
                for r, (host, res) in enumerate(per_rank)
            ]
            tmp = out.with_suffix(".tmp")
            tmp.write_text(json.dumps(payload))
            tmp.replace(out)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_local(
    nproc: int = 2,
    options: CheckOptions | None = None,
    *,
    node_names: list[str] | None = None,
    timeout_s: float = 300.0,
    on_progress: Callable[[str], None] | None = None,
) -> list[tuple[str, list[CheckResult]]]:
    """Start ``nproc`` local gloo ranks running the checks; return each rank's (node, results)."""
    if nproc < 1:
        raise VigilInputError(f"--nproc must be at least 1, got {nproc}")
    options = options or CheckOptions()
    with tempfile.TemporaryDirectory(prefix="vigil-precheck-") as tmp:
        out = Path(tmp) / "results.json"
        rendezvous = Path(tmp) / "rendezvous"
        procs = []
        for rank in range(nproc):
            env = {
                **os.environ,
                "RANK": str(rank),
                "WORLD_SIZE": str(nproc),
                "LOCAL_RANK": str(rank),
                "LOCAL_WORLD_SIZE": str(nproc),
            }
            if node_names:
                env["VIGIL_NODE_NAME"] = node_names[rank % len(node_names)]
            argv = [sys.executable, "-m", "vigil.precheck.runner", str(out), str(rendezvous),
                    json.dumps(options.__dict__)]
            procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        deadline = time.time() + timeout_s
        if on_progress:
            on_progress(f"running checks on {nproc} ranks")
        errors = []
        for rank, proc in enumerate(procs):
            try:
                _, stderr = proc.communicate(timeout=max(1.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                for other in procs:
                    other.kill()
                raise VigilInputError(f"precheck rank {rank} did not finish within {timeout_s:g}s") from None
            if proc.returncode != 0:
                last = stderr.decode(errors="replace").strip().splitlines()
                errors.append(f"rank {rank} exited {proc.returncode}: {last[-1] if last else ''}")
        if errors:
            raise VigilInputError("precheck failed: " + "; ".join(errors))
        payload = json.loads(out.read_text())
    return [(row["host"], [CheckResult.from_dict(r) for r in row["results"]]) for row in payload]


if __name__ == "__main__":
    _worker(Path(sys.argv[1]), Path(sys.argv[2]), CheckOptions(**json.loads(sys.argv[3])))
