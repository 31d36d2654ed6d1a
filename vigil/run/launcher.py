"""The one local launcher: start ranks the way torchrun does, with the probe in every rank.

``free_port``, ``torchrun_env``, ``probe_command`` and ``start_rank`` are what every local launch of a
training job uses (``vigil launch script``, and ``vigil launch job`` through ``vigil.run.failover``);
``launch`` runs a script under the supervisor and returns its diagnosis.

Python API::

    from vigil.run.launcher import launch
    diagnosis = launch("train.py", ["--epochs", "3"], nproc=4, hang_timeout=10, out_dir=Path("run1"))
    diagnosis.verdict, diagnosis.culprit_ranks, diagnosis.exit_code
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from vigil import procgroups
from vigil.diagnose.hang import HangDiagnosis
from vigil.diagnose.timeline import TIMELINE_FILE
from vigil.model import VigilInputError
from vigil.remedy.heartbeat import RUN_DIR_ENV
from vigil.run.nodes import CLAIM_FILE, NodeGroup
from vigil.run.rank_procs import LAUNCHED_PATTERN, launcher_env, record_launched, signals_raise, stop_groups
from vigil.run.report import LaunchReporter
from vigil.run.supervise import EventSink, Supervisor, SupervisorConfig
from vigil.sources.probe.activate import ENV_DIR, ENV_HANG_TIMEOUT
from vigil.sources.probe.records import (
    DEFAULT_HANG_TIMEOUT_S,
    DIAGNOSIS_FILE,
    DUMP_REQUEST_FILE,
    FR_DIR,
    RUN_FILE,
    STACKS_FILE,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
FR_BUFFER_SIZE = "2000"


def free_port() -> int:
    """A TCP port nobody listens on now, for the rendezvous store."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def torchrun_env(
    rank: int,
    world_size: int,
    port: int,
    *,
    local_rank: int | None = None,
    local_world_size: int | None = None,
    node_rank: int = 0,
    master_addr: str = "127.0.0.1",
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment torchrun gives a rank (static rendezvous through MASTER_ADDR / MASTER_PORT)."""
    env = dict(os.environ)
    env.update(extra or {})
    env.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank if local_rank is None else local_rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size if local_world_size is None else local_world_size),
            "GROUP_RANK": str(node_rank),
            "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(world_size),
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(port),
            "TORCHELASTIC_RUN_ID": "vigil",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def probe_env(env: dict[str, str], out_dir: Path, hang_timeout: float, flight_recorder: bool) -> dict[str, str]:
    """Add the probe's settings, and Vigil to the import path, to a rank's environment."""
    env[ENV_DIR] = str(out_dir)
    env[ENV_HANG_TIMEOUT] = str(hang_timeout)
    if flight_recorder:
        env.setdefault("TORCH_FR_BUFFER_SIZE", FR_BUFFER_SIZE)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def probe_command(argv: Sequence[str], python: str | None = None) -> list[str]:
    """``python [-m MOD | -c CODE | SCRIPT] ARGS`` -> the same, run through the probe's bootstrap.

    Commands that are not Python run unchanged (and unprobed)."""
    if not argv:
        raise VigilInputError("empty command")
    program = Path(argv[0]).name
    if not (program.startswith("python") or argv[0] == sys.executable):
        return list(argv)
    return [python or sys.executable, "-m", "vigil.sources.probe.bootstrap", *argv[1:]]


def start_rank(argv: Sequence[str], env: Mapping[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """One rank in its own session (so the whole process group can be signalled), output to its log; it dies
    with its launcher (``vigil.run.rank_procs``), and its group is killed at the launcher's exit if still running
    then (``vigil.procgroups``: a launch on a thread whose ``finally`` never ran, a Ctrl-C between the start and
    ``procs[rank]``); none starts once the process is exiting."""
    with open(log_path, "wb") as log:
        return procgroups.start_group(list(argv), env={**env, **launcher_env()}, stdout=log, stderr=subprocess.STDOUT)


def prepare_out_dir(out_dir: Path, ranks: range | None = None, shared: bool = True) -> None:
    """Create the run directory and drop what an earlier run left there (only Vigil's own files): the
    files of ``ranks`` (default all), and with ``shared`` the job's own (one node of several cleans them)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if ranks is None:
        for pattern in ("rank*.json", "rank*.cur", "rank*.log", ".rank*.tmp", "node*.json", "stacks.node*.json",
                        LAUNCHED_PATTERN.format(node="*"), "progress-rank*.jsonl"):
            for path in out_dir.glob(pattern):
                path.unlink()
    else:
        for rank in ranks:
            for name in (f"rank{rank}.json", f"rank{rank}.cur", f"rank{rank}.log", f"progress-rank{rank}.jsonl"):
                (out_dir / name).unlink(missing_ok=True)
    if shared:
        for name in (STACKS_FILE, RUN_FILE, DIAGNOSIS_FILE, DUMP_REQUEST_FILE, TIMELINE_FILE, CLAIM_FILE):
            (out_dir / name).unlink(missing_ok=True)
        shutil.rmtree(out_dir / FR_DIR, ignore_errors=True)


def launch(
    script: str | Path,
    args: Sequence[str] = (),
    nproc: int = 2,
    hang_timeout: float = DEFAULT_HANG_TIMEOUT_S,
    out_dir: str | Path = "vigil-run",
    env: Mapping[str, str] | None = None,
    job: str = "local",
    flight_recorder: bool = True,
    checkpoint_timeout: float | None = None,
    python: str | None = None,
    on_event: EventSink | None = None,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str = "127.0.0.1",
    master_port: int | None = None,
    reporter: LaunchReporter | None = None,
    startup_grace: float = 60.0,
    stack_period: float = 300.0,
) -> HangDiagnosis:
    """Run SCRIPT as ``nproc`` ranks under the supervisor; returns the diagnosis also written to
    ``out_dir/diagnosis.json``. A hung, crashed or mismatched job is stopped before this returns.

    Several nodes, as torchrun's static rendezvous: run this on every node with the same ``nnodes``,
    ``master_addr`` / ``master_port`` (node 0's address) and ``out_dir`` (a directory every node can
    write), and each node's ``node_rank``; ranks are ``node_rank * nproc + local rank``. Every node
    returns the same verdict, naming the culprit whichever node it runs on.

    However it ends - verdict, exception, SIGTERM / SIGHUP / SIGINT - this node's ranks' process groups are
    stopped before it returns; their pids are in ``out_dir/launched.node<I>.json``. ``startup_grace``:
    seconds of silence allowed before the first step (warm-up, first compile); past it, ranks split into
    some waiting in a collective and some elsewhere are a hang even if the probe saw no collective.
    ``stack_period``: seconds between py-spy sweeps of every rank for ``vigil stacks`` (0: none)."""
    script_path = Path(script)
    if not script_path.is_file():
        raise VigilInputError(f"training script {script_path} does not exist")
    if nproc < 1:
        raise VigilInputError(f"--nproc-per-node must be at least 1, got {nproc}")
    if hang_timeout <= 0:
        raise VigilInputError(f"--hang-timeout must be positive, got {hang_timeout}")
    if stack_period < 0:
        raise VigilInputError(f"--stack-period must be 0 (off) or positive, got {stack_period}")
    if startup_grace <= 0:
        raise VigilInputError(f"--startup-grace must be positive, got {startup_grace}")
    if nnodes < 1 or not 0 <= node_rank < nnodes:
        raise VigilInputError(f"--node-rank must be in [0, {nnodes}) with --nnodes {nnodes} >= 1, got {node_rank}")
    if nnodes > 1 and master_port is None:
        raise VigilInputError("several nodes need --master-port (and --master-addr: node 0's address)")
    out = Path(out_dir).resolve()
    world = nnodes * nproc
    local_ranks = range(node_rank * nproc, (node_rank + 1) * nproc)
    prepare_out_dir(out, local_ranks if nnodes > 1 else None, shared=node_rank == 0)
    port = master_port or free_port()
    interpreter = python or sys.executable
    procs: dict[int, subprocess.Popen[bytes]] = {}
    argv = probe_command([interpreter, str(script_path), *args], python=interpreter)
    with signals_raise():
        try:
            for local, rank in enumerate(local_ranks):
                rank_vars = torchrun_env(rank, world, port, local_rank=local, local_world_size=nproc,
                                         node_rank=node_rank, master_addr=master_addr, extra=env)
                # Heartbeat lines (loss, gradient norm, tokens/s) go to the run directory too.
                rank_vars.setdefault(RUN_DIR_ENV, str(out))
                procs[rank] = start_rank(argv, probe_env(rank_vars, out, hang_timeout, flight_recorder),
                                         out / f"rank{rank}.log")
            record_launched(out, node_rank, procs)
            config = SupervisorConfig(
                hang_timeout_s=hang_timeout,
                checkpoint_timeout_s=checkpoint_timeout or max(600.0, 10 * hang_timeout),
                flight_recorder=flight_recorder,
                job=job,
                startup_grace_s=startup_grace,
                stack_period_s=stack_period,
            )
            nodes = NodeGroup(out, nnodes, node_rank) if nnodes > 1 else None
            if nodes is not None:
                nodes.clear_own()
            supervisor = Supervisor(procs, out, config, on_event or (lambda message: None), nodes=nodes,
                                    world=world)
            if reporter is not None:
                report = reporter
                supervisor.watch = lambda s: report.watch(s.snapshots, s.exit_codes,
                                                          {r: p.pid for r, p in s.procs.items()})
            diagnosis = supervisor.run()
            if reporter is not None:
                reporter.finish(diagnosis)
                reporter = None
            return diagnosis
        finally:
            if reporter is not None:
                reporter.close()
            stop_groups(procs.values(), grace_s=0.0)
