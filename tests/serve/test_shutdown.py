"""`vigil serve` shutting down (SIGTERM) while its engine is resuming a dead peer's drain: the process ends once the
drain's run is closed, or after one lease with one warning - as the engine's own stop and `vigil engine --once` do.
Real processes, a fake `scontrol` that holds the drain until the test lets it go (a FIFO, no sleeps). On SQLite and on
PostgreSQL."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.remedy.test_resume_claim import crashed_drain
from tests.remedy.test_resume_claim import database as database
from tests.serve.conftest import REPO, TOKEN, free_port, wait_for
from tests.serve.conftest import postgres_url as postgres_url
from vigil.model import ActionStatus, Node, Topology
from vigil.remedy.audit import AuditLog
from vigil.store.sql import Store

pytestmark = pytest.mark.slow

# scontrol as the Slurm actuator calls it: the node is idle (not drained yet), and the drain blocks reading the FIFO
# HELD_SLURM_DIR/release until the test writes to it
HELD_SCONTROL = """
import os, sys
state_dir = os.environ["HELD_SLURM_DIR"]
with open(os.path.join(state_dir, "calls.log"), "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\\n")
if sys.argv[1:3] == ["show", "node"]:
    print(f"NodeName={sys.argv[3]} Arch=x86_64 CoresTotal=64 State=IDLE Partitions=gpu")
elif sys.argv[1] == "update":
    with open(os.path.join(state_dir, "draining"), "w"):
        pass
    with open(os.path.join(state_dir, "release")) as release:
        release.read()
"""


@dataclass
class HeldSlurm:
    """A fake Slurm whose drains wait for ``release``; ``env`` puts its scontrol first on PATH."""

    state_dir: Path

    @property
    def env(self) -> dict[str, str]:
        return {"PATH": f"{self.state_dir / 'bin'}{os.pathsep}{os.environ['PATH']}",
                "HELD_SLURM_DIR": str(self.state_dir)}

    def draining(self) -> bool:
        return (self.state_dir / "draining").exists()

    def release(self) -> None:
        with (self.state_dir / "release").open("w") as fifo:
            fifo.write("go\n")


@contextmanager
def held_slurm(state_dir: Path) -> Iterator[HeldSlurm]:
    (state_dir / "bin").mkdir(parents=True)
    scontrol = state_dir / "bin" / "scontrol"
    scontrol.write_text(f"#!{sys.executable} -I{HELD_SCONTROL}")
    scontrol.chmod(0o755)
    os.mkfifo(state_dir / "release")
    slurm = HeldSlurm(state_dir)
    try:
        yield slurm
    finally:
        # a drain still reading: let it end, so no scontrol outlives the test (none reading: ENXIO)
        with contextlib.suppress(OSError):
            os.close(os.open(state_dir / "release", os.O_WRONLY | os.O_NONBLOCK))


def acting_env(home: Path, database: str, slurm: HeldSlurm, **settings: str) -> dict[str, str]:
    """A server or engine that executes through Slurm, on ``database``, the guard letting every node go."""
    return {**os.environ, **slurm.env, "VIGIL_HOME": str(home), "VIGIL_DB_URL": database, "VIGIL_API_TOKEN": TOKEN,
            "VIGIL_EXECUTE_ACTIONS": "true", "VIGIL_REMEDY_BACKEND": "slurm", "VIGIL_MAX_CORDON_SHARE": "1",
            "VIGIL_MAX_CORDON_SHARE_PER_SWITCH": "1", "VIGIL_ENGINE_INTERVAL_S": "0.2", "PYTHONPATH": str(REPO),
            **settings}


def place_cluster(database: str) -> None:
    Store(database).place_nodes(Topology(nodes=[Node(name=f"n{i}") for i in range(1, 5)]))


def start_server(home: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    port = free_port()
    home.mkdir(exist_ok=True)
    process = subprocess.Popen([sys.executable, "-m", "vigil", "serve", "--port", str(port), "--engine"], cwd=REPO,
                               env=env, stdout=subprocess.DEVNULL, stderr=(home / "serve.log").open("ab"))

    def healthy() -> bool:
        assert process.poll() is None, (home / "serve.log").read_text()
        try:
            return httpx.get(f"http://127.0.0.1:{port}/api/v1/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(healthy, 120, "vigil serve to answer /api/v1/health")
    return process


def test_serve_stopped_waits_for_the_drain_its_engine_resumes(database: str, tmp_path: Path) -> None:
    """A server killed mid-drain left the drain started; a second server's engine takes it over on a tick, and the
    second server gets SIGTERM while the drain is evicting. It is still there a second later, and exits 0 once the
    drain ends, the run closed and recorded executed. Before, it ended at once (the engine's threads are daemons),
    leaving the run started for another process a lease later."""
    place_cluster(database)
    home = tmp_path / "home"
    with held_slurm(tmp_path / "slurm") as slurm:
        server = start_server(home, acting_env(home, database, slurm))
        try:
            crashed_drain(AuditLog(database), at=1_000.0, lease_s=30.0)  # its lease lapsed long ago
            wait_for(slurm.draining, 60, "the engine to resume the drain")
            server.send_signal(signal.SIGTERM)
            with pytest.raises(subprocess.TimeoutExpired):
                server.wait(timeout=1.0)
            slurm.release()
            assert server.wait(timeout=60) == 0, (home / "serve.log").read_text()
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()
    audit = AuditLog(database)
    assert audit.unfinished() == []
    (record,) = audit.actions()
    assert (record.id, record.status) == ("act-drain-n1", ActionStatus.EXECUTED)
    assert record.params["taken_over_from"] == "vigil-api-killed"


def test_serve_stopped_gives_up_on_the_drain_after_one_lease(database: str, tmp_path: Path) -> None:
    """The same with a drain that does not end and a 2 s lease: the server exits 0 about a lease after SIGTERM with
    one warning, leaving the run started under its claim for another process to take over. Before, it ended at
    once without a word."""
    place_cluster(database)
    home = tmp_path / "home"
    with held_slurm(tmp_path / "slurm") as slurm:
        server = start_server(home, acting_env(home, database, slurm, VIGIL_REMEDY_LEASE_S="2",
                                               VIGIL_REMEDY_LEASE_RENEW_S="0.5"))
        try:
            crashed_drain(AuditLog(database), at=1_000.0, lease_s=30.0)
            wait_for(slurm.draining, 60, "the engine to resume the drain")
            server.send_signal(signal.SIGTERM)
            with pytest.raises(subprocess.TimeoutExpired):
                server.wait(timeout=1.0)
            assert server.wait(timeout=60) == 0, (home / "serve.log").read_text()
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()
        log = (home / "serve.log").read_text()
        assert log.count("stopping while interrupted actions are still being resumed after 2 s (one lease)") == 1, log
        (run,) = AuditLog(database).unfinished_runs()
        assert run.key == "act-drain-n1" and run.owner is not None and run.owner.startswith("vigil-api-")
