"""A real one-node Slurm cluster (Debian's slurm-wlm + munge) for tests, per docs/reference/slurm-single-node.md:
every daemon runs from a private directory with its own munge socket and ports, and is stopped by its PID."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import missing, require_binary

CONF = """ClusterName=vigiltest
SlurmctldHost={host}
AuthType=auth/munge
AuthInfo=socket={base}/munge/munge.socket
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
SlurmctldPidFile={base}/run/slurmctld.pid
SlurmdPidFile={base}/run/slurmd.pid
SlurmdSpoolDir={base}/spool
StateSaveLocation={base}/state
SlurmUser=root
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MinJobAge=600
SlurmctldLogFile={base}/log/slurmctld.log
SlurmdLogFile={base}/log/slurmd.log
NodeName={host} CPUs={cpus} RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


@dataclass
class SlurmCluster:
    base: Path
    node: str
    env: dict[str, str]

    def run(self, *argv: str) -> str:
        return subprocess.run(list(argv), env=self.env, check=True, capture_output=True, text=True, timeout=60).stdout

    def node_state(self) -> str:
        return self.run("sinfo", "-h", "-N", "-o", "%T").strip()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait(condition: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if callable(condition) and condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


def _stop(pid_file: Path) -> None:
    try:
        pid = int(pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)


@contextmanager
def slurm_cluster() -> Iterator[SlurmCluster]:
    for binary in ("munged", "slurmctld", "slurmd", "scontrol", "squeue", "sbatch", "sinfo"):
        require_binary(binary)
    if os.geteuid() != 0:
        missing("a one-node Slurm cluster (its daemons run as root here)")
    base = Path(tempfile.mkdtemp(prefix="vigil-slurm-"))
    for sub in ("state", "spool", "log", "run", "munge"):
        (base / sub).mkdir()
    key = base / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    host = socket.gethostname().split(".")[0]
    conf = base / "slurm.conf"
    conf.write_text(CONF.format(host=host, base=base, ctld_port=_free_port(), slurmd_port=_free_port(),
                                cpus=os.cpu_count() or 1))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    cluster = SlurmCluster(base, host, env)
    try:
        subprocess.run([shutil.which("munged") or "munged", f"--key-file={key}",
                        f"--socket={base}/munge/munge.socket", f"--pid-file={base}/munge/munged.pid",
                        f"--log-file={base}/munge/munged.log", f"--seed-file={base}/munge/munged.seed", "--force"],
                       check=True, capture_output=True, timeout=30)
        subprocess.run(["slurmctld", "-f", str(conf)], env=env, check=True, capture_output=True, timeout=30)
        _wait(lambda: subprocess.run(["scontrol", "ping"], env=env, capture_output=True, text=True).stdout.count("UP"),
              30, "slurmctld to answer")
        subprocess.run(["slurmd", "-f", str(conf)], env=env, check=True, capture_output=True, timeout=30)
        _wait(lambda: cluster.node_state() in ("idle", "mixed", "allocated"), 60, "the node to be idle")
        yield cluster
    finally:
        _stop(base / "run" / "slurmd.pid")
        _stop(base / "run" / "slurmctld.pid")
        _stop(base / "munge" / "munged.pid")
        shutil.rmtree(base, ignore_errors=True)
