"""Start a script as an N-rank torch.distributed job on this machine, with the probe in every rank.

Python API (used by `vigil launch` and by remediation to restart a job)::

    from vigil.run.launcher import launch
    diagnosis = launch("train.py", ["--epochs", "3"], nproc=4, hang_timeout=10, out_dir=Path("run1"))
    diagnosis.verdict, diagnosis.culprit_ranks, diagnosis.exit_code
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from vigil.diagnose.hang import HangDiagnosis
from vigil.diagnose.timeline import TIMELINE_FILE
from vigil.model import VigilInputError
from vigil.run.supervise import EventSink, Supervisor, SupervisorConfig
from vigil.sources.probe.activate import ENV_DIR, ENV_HANG_TIMEOUT
from vigil.sources.probe.records import DIAGNOSIS_FILE, DUMP_REQUEST_FILE, FR_DIR, RUN_FILE, STACKS_FILE

REPO_ROOT = Path(__file__).resolve().parents[2]
FR_BUFFER_SIZE = "2000"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rank_env(
    rank: int,
    nproc: int,
    port: int,
    out_dir: Path,
    hang_timeout: float,
    flight_recorder: bool,
    extra: Mapping[str, str] | None,
) -> dict[str, str]:
    """The environment torchrun would give a rank, plus the probe's settings."""
    env = dict(os.environ)
    env.update(extra or {})
    env.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(nproc),
            "LOCAL_WORLD_SIZE": str(nproc),
            "GROUP_RANK": "0",
            "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(nproc),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "TORCHELASTIC_RUN_ID": "vigil",
            "PYTHONUNBUFFERED": "1",
            ENV_DIR: str(out_dir),
            ENV_HANG_TIMEOUT: str(hang_timeout),
        }
    )
    if flight_recorder:
        env.setdefault("TORCH_FR_BUFFER_SIZE", FR_BUFFER_SIZE)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def prepare_out_dir(out_dir: Path) -> None:
    """Create the run directory and drop what an earlier run left there (only Vigil's own files)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for pattern in ("rank*.json", "rank*.cur", "rank*.log", ".rank*.tmp"):
        for path in out_dir.glob(pattern):
            path.unlink()
    for name in (STACKS_FILE, RUN_FILE, DIAGNOSIS_FILE, DUMP_REQUEST_FILE, TIMELINE_FILE):
        (out_dir / name).unlink(missing_ok=True)
    shutil.rmtree(out_dir / FR_DIR, ignore_errors=True)


def launch(
    script: str | Path,
    args: Sequence[str] = (),
    nproc: int = 2,
    hang_timeout: float = 10.0,
    out_dir: str | Path = "vigil-run",
    env: Mapping[str, str] | None = None,
    job: str = "local",
    flight_recorder: bool = True,
    checkpoint_timeout: float | None = None,
    python: str | None = None,
    on_event: EventSink | None = None,
) -> HangDiagnosis:
    """Run SCRIPT as ``nproc`` ranks under the supervisor; returns the diagnosis also written to
    ``out_dir/diagnosis.json``. A hung, crashed or mismatched job is stopped before this returns."""
    script_path = Path(script)
    if not script_path.is_file():
        raise VigilInputError(f"training script {script_path} does not exist")
    if nproc < 1:
        raise VigilInputError(f"--nproc-per-node must be at least 1, got {nproc}")
    if hang_timeout <= 0:
        raise VigilInputError(f"--hang-timeout must be positive, got {hang_timeout}")
    out = Path(out_dir).resolve()
    prepare_out_dir(out)
    port = free_port()
    interpreter = python or sys.executable
    procs: dict[int, subprocess.Popen[bytes]] = {}
    try:
        for rank in range(nproc):
            with open(out / f"rank{rank}.log", "wb") as log:
                procs[rank] = subprocess.Popen(
                    [interpreter, "-m", "vigil.sources.probe.bootstrap", str(script_path), *args],
                    env=rank_env(rank, nproc, port, out, hang_timeout, flight_recorder, env),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        config = SupervisorConfig(
            hang_timeout_s=hang_timeout,
            checkpoint_timeout_s=checkpoint_timeout or max(600.0, 10 * hang_timeout),
            flight_recorder=flight_recorder,
            job=job,
        )
        supervisor = Supervisor(procs, out, config, on_event or (lambda message: None))
        return supervisor.run()
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
