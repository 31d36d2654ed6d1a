"""A real one-node Slurm cluster (Debian's slurm-wlm + munge) for tests, per docs/reference/slurm-single-node.md:
every daemon runs from a private directory with its own munge socket and ports, and is stopped by its PID.

With ``accounting=True`` it also runs a private MariaDB and slurmdbd (Debian's mariadb-server and slurmdbd),
so QOS can be defined with sacctmgr, and slurmctld preempts by QOS (``PreemptType=preempt/qos``,
``PreemptMode=REQUEUE``); the cluster, an account ``tide`` and the user root are registered."""

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

import pytest

from tests.conftest import free_port, missing, require_binary, wait_for

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

ACCOUNTING = """AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost={host}
AccountingStoragePort={dbd_port}
AccountingStoragePass={base}/munge/munge.socket
AccountingStorageEnforce=associations,limits,qos
PreemptType=preempt/qos
PreemptMode=REQUEUE
JobRequeue=1
"""

SLURMDBD = """AuthType=auth/munge
AuthInfo=socket={base}/munge/munge.socket
DbdHost={host}
DbdPort={dbd_port}
SlurmUser=root
PidFile={base}/run/slurmdbd.pid
LogFile={base}/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={db_port}
StorageUser=slurm
StoragePass={db_password}
StorageLoc=slurm_acct_db
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


def _start_accounting(base: Path, host: str, env: dict[str, str], slurm_conf: str) -> subprocess.Popen[bytes]:
    """A private MariaDB on a loopback port and slurmdbd on it, with slurm.conf told to use them; returns the
    MariaDB process (it does not daemonize)."""
    db_port, dbd_port, password = free_port(), free_port(), os.urandom(12).hex()
    Path(env["SLURM_CONF"]).write_text(slurm_conf + ACCOUNTING.format(host=host, base=base, dbd_port=dbd_port))
    subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={base}/db", "--user=root",
                    "--auth-root-authentication-method=normal", "--skip-test-db"],
                   check=True, capture_output=True, timeout=120)
    mariadb = subprocess.Popen(
        ["mariadbd", "--no-defaults", f"--datadir={base}/db", "--user=root", f"--socket={base}/db.sock",
         f"--port={db_port}", "--bind-address=127.0.0.1", f"--pid-file={base}/run/mariadb.pid",
         f"--log-error={base}/log/mariadb.log", "--skip-log-bin", "--innodb-buffer-pool-size=16M"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = ["mariadb", "--no-defaults", f"--socket={base}/db.sock", "-uroot"]
    wait_for(lambda: subprocess.run([*client, "-e", "select 1"], capture_output=True).returncode == 0, 60,
             "MariaDB to answer")
    subprocess.run([*client, "-e", f"CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{password}'; "
                    "GRANT ALL ON *.* TO 'slurm'@'127.0.0.1';"], check=True, capture_output=True, timeout=30)
    # slurmdbd reads slurmdbd.conf beside $SLURM_CONF, and only when it is private to its user
    dbd_conf = base / "slurmdbd.conf"
    dbd_conf.write_text(SLURMDBD.format(base=base, host=host, dbd_port=dbd_port, db_port=db_port,
                                        db_password=password))
    dbd_conf.chmod(0o600)
    subprocess.run(["slurmdbd"], env=env, check=True, capture_output=True, timeout=30)
    wait_for(lambda: subprocess.run(["sacctmgr", "-n", "show", "cluster"], env=env,
                                    capture_output=True).returncode == 0, 60, "slurmdbd to answer")
    for argv in (["add", "cluster", "vigiltest"], ["add", "account", "tide", "Description=tide", "Organization=vigil"],
                 ["add", "user", "root", "Account=tide", "DefaultAccount=tide"]):
        subprocess.run(["sacctmgr", "-i", *argv], env=env, check=True, capture_output=True, timeout=60)
    return mariadb


@contextmanager
def slurm_cluster(accounting: bool = False) -> Iterator[SlurmCluster]:
    binaries = ["munged", "slurmctld", "slurmd", "scontrol", "squeue", "sbatch", "sinfo"]
    if accounting:
        binaries += ["slurmdbd", "sacctmgr", "mariadbd", "mariadb-install-db", "mariadb"]
    for binary in binaries:
        require_binary(binary)
    if os.geteuid() != 0:
        missing("a one-node Slurm cluster (its daemons run as root here)")
    base = Path(tempfile.mkdtemp(prefix="vigil-slurm-"))
    for sub in ("state", "spool", "log", "run", "munge", "db"):
        (base / sub).mkdir()
    key = base / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    host = socket.gethostname().split(".")[0]
    conf = base / "slurm.conf"
    text = CONF.format(host=host, base=base, ctld_port=free_port(), slurmd_port=free_port(),
                       cpus=os.cpu_count() or 1)
    conf.write_text(text)
    env = {**os.environ, "SLURM_CONF": str(conf)}
    cluster = SlurmCluster(base, host, env)
    mariadb = None
    try:
        subprocess.run([shutil.which("munged") or "munged", f"--key-file={key}",
                        f"--socket={base}/munge/munge.socket", f"--pid-file={base}/munge/munged.pid",
                        f"--log-file={base}/munge/munged.log", f"--seed-file={base}/munge/munged.seed", "--force"],
                       check=True, capture_output=True, timeout=30)
        if accounting:
            mariadb = _start_accounting(base, host, env, text)
        subprocess.run(["slurmctld", "-f", str(conf)], env=env, check=True, capture_output=True, timeout=30)
        wait_for(lambda: "UP" in subprocess.run(["scontrol", "ping"], env=env, capture_output=True, text=True).stdout,
                 30, "slurmctld to answer")
        subprocess.run(["slurmd", "-f", str(conf)], env=env, check=True, capture_output=True, timeout=30)
        wait_for(lambda: cluster.node_state() in ("idle", "mixed", "allocated"), 60, "the node to be idle")
        yield cluster
    finally:
        _stop(base / "run" / "slurmd.pid")
        _stop(base / "run" / "slurmctld.pid")
        _stop(base / "run" / "slurmdbd.pid")
        _stop(base / "run" / "mariadb.pid")
        if mariadb is not None:
            mariadb.wait(timeout=30)
        _stop(base / "munge" / "munged.pid")
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def slurm(request: pytest.FixtureRequest) -> Iterator[SlurmCluster]:
    """One cluster for a test module; with accounting where the module sets ``SLURM_ACCOUNTING = True``."""
    with slurm_cluster(accounting=getattr(request.module, "SLURM_ACCOUNTING", False)) as cluster:
        yield cluster


@pytest.fixture
def on_path(slurm: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> SlurmCluster:
    """The cluster, with ``SLURM_CONF`` set so the product's own Slurm clients talk to it."""
    monkeypatch.setenv("SLURM_CONF", slurm.env["SLURM_CONF"])
    return slurm
