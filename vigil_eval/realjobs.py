"""Real failed jobs to triage: small torch.distributed (gloo, CPU) trainings launched with torchrun, in
which one rank fails on purpose, with every rank's real stderr captured by torchrun's ``--log-dir``.

    python -m vigil_eval.realjobs worker --mode exception --culprit 1     (what torchrun runs)

Failure modes: ``exception`` (a Python error in the user's code), ``nan`` (non-finite loss raised as an
error), ``segfault`` (a real SIGSEGV, reported by faulthandler) and ``kill`` (the rank SIGKILLs itself,
as the OOM killer would: it logs nothing, only the launcher sees it). The healthy ranks are blocked in
an all_reduce and fail with whatever gloo really says when the peer disappears.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from vigil_eval.logcorpus import RootLabel

MODES = ("exception", "nan", "segfault", "kill")

# The line each mode's culprit prints last (how the label is found in the real log, independent of triage).
_PREFIX = r"^(?:\[rank\d+\]: ?)?"
_ROOT_LINE = {
    "exception": re.compile(_PREFIX + r"ValueError: batch 3 has 0 samples"),
    "nan": re.compile(_PREFIX + r"FloatingPointError: loss is nan at step 3"),
    "segfault": re.compile(_PREFIX + r"Fatal Python error: Segmentation fault"),
    "kill": re.compile(r"failed \(exitcode: -9\)"),
}


@dataclass(frozen=True)
class RealJob:
    directory: Path
    world: int
    mode: str
    culprit: int
    returncode: int


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_failed_job(directory: Path, world: int, mode: str, culprit: int, timeout_s: float = 180.0) -> RealJob:
    """Launch a ``world``-rank gloo job with torchrun in which rank ``culprit`` fails by ``mode``."""
    if mode not in MODES:
        raise ValueError(f"unknown failure mode {mode!r}: expected one of {', '.join(MODES)}")
    directory.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(world),
        "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "--max-restarts", "0",
        "--log-dir", str(directory / "torchrun"), "--redirects", "3",
        "-m", "vigil_eval.realjobs", "worker", "--mode", mode, "--culprit", str(culprit),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1", "TORCH_CPP_LOG_LEVEL": "ERROR"}
    with (directory / "launcher.log").open("wb") as launcher:
        done = subprocess.run(command, stdout=launcher, stderr=subprocess.STDOUT, env=env, timeout=timeout_s,
                              check=False)
    return RealJob(directory, world, mode, culprit, done.returncode)


def root_label(job: RealJob) -> RootLabel:
    """Where the culprit's own last word is in the captured logs (found by its known text)."""
    pattern = _ROOT_LINE[job.mode]
    if job.mode == "kill":
        candidates = [job.directory / "launcher.log"]
    else:
        candidates = sorted(job.directory.rglob(f"attempt_*/{job.culprit}/stderr.log"))
    for path in candidates:
        for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if pattern.search(line):
                # the fault catalogue's name for what the line establishes; an exception or a kill names none
                fault = {"exception": None, "nan": "nan_loss", "segfault": "process_crash", "kill": None}[job.mode]
                return RootLabel(f"real_{job.mode}", path.relative_to(job.directory).as_posix(), lineno, fault,
                                 job.culprit)
    raise RuntimeError(f"real job {job.directory}: the culprit's error line was not captured")


_FAILURE_ROW = re.compile(r"rank\s*:\s*(\d+) \(local_rank: \d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")
_ERROR_LINE = re.compile(r"^(?:\[rank\d+\]: ?)?\w*(?:Error|Exception)\b.*:")


def terminated_by_launcher(job: RealJob) -> set[int]:
    """Ranks torchrun's failure table reports as stopped by its SIGTERM (exitcode -15): once one rank fails, the
    launcher's next look (every 0.1 s by default) terminates the others, and a rank it reaches before the peer's
    failure did leaves no error of its own - in a real job as here."""
    table = (job.directory / "launcher.log").read_text(errors="replace")
    return {int(rank) for rank, code in _FAILURE_ROW.findall(table) if int(code) == -15}


def logged_an_error(job: RealJob, rank: int) -> bool:
    """Whether the rank's captured stderr holds an exception line of its own (a healthy rank's gloo error)."""
    for path in job.directory.rglob(f"attempt_*/{rank}/stderr.log"):
        if any(_ERROR_LINE.search(line) for line in path.read_text(errors="replace").splitlines()):
            return True
    return False


def _worker(mode: str, culprit: int, steps: int) -> None:
    import datetime
    import logging

    import torch
    import torch.distributed as dist

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("train")
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    log.info("rank %d of %d started, pid %d", rank, dist.get_world_size(), os.getpid())
    weights = torch.ones(1024)
    for step in range(steps):
        if rank == culprit and step == 3:
            _fail(mode, step)
        grad = torch.full_like(weights, float(rank + step))
        dist.all_reduce(grad)
        weights -= 0.01 * grad / dist.get_world_size()
        log.info("step %d loss %.4f", step, float(weights.mean()))
    dist.destroy_process_group()


def _fail(mode: str, step: int) -> None:
    if mode == "exception":
        raise ValueError(f"batch {step} has 0 samples")
    if mode == "nan":
        raise FloatingPointError(f"loss is nan at step {step}")
    if mode == "segfault":
        ctypes.string_at(0)  # reads address 0: a real SIGSEGV
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m vigil_eval.realjobs")
    sub = parser.add_subparsers(dest="command", required=True)
    worker = sub.add_parser("worker", help="one rank of the failing job (run by torchrun)")
    worker.add_argument("--mode", choices=MODES, required=True)
    worker.add_argument("--culprit", type=int, required=True)
    worker.add_argument("--steps", type=int, default=8)
    args = parser.parse_args(argv)
    _worker(args.mode, args.culprit, args.steps)


if __name__ == "__main__":
    main()
