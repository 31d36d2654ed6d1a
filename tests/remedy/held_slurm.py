"""A fake Slurm whose drains wait until the test lets each go (a FIFO: no sleeps), for real `vigil serve` and
`vigil engine` processes resuming a drain, and the settings of a process that executes through it."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.serve.conftest import REPO, TOKEN
from vigil.model import Action, ActionKind, Node, Topology
from vigil.remedy.audit import AuditLog
from vigil.store.sql import Store

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
    node = dict(arg.split("=", 1) for arg in sys.argv[2:] if "=" in arg)["nodename"]
    try:  # an earlier drain of the node still running: two drains at once (a run started beside one left running)
        earlier = open(os.path.join(state_dir, "draining-" + node)).read()
        if earlier and open(f"/proc/{earlier}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
            with open(os.path.join(state_dir, "calls.log"), "a") as log:
                log.write(f"overlap {node}: {os.getpid()} started while {earlier} runs\\n")
    except OSError:
        pass
    with open(os.path.join(state_dir, "draining-" + node), "w") as mark:
        mark.write(str(os.getpid()))
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

    def draining(self, node: str = "n1") -> bool:
        mark = self.state_dir / f"draining-{node}"
        return mark.exists() and mark.read_text() != ""  # its pid written: the drain is reading the FIFO next

    def drain_pid(self, node: str = "n1") -> int:
        """The pid of the scontrol draining ``node`` (the process the server or engine started)."""
        return int((self.state_dir / f"draining-{node}").read_text())

    def drain_running(self, node: str = "n1") -> bool:
        """Whether the scontrol draining ``node`` still runs (not a zombie, and that scontrol: its pid not reused)."""
        proc = Path("/proc") / str(self.drain_pid(node))
        try:
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            command = (proc / "cmdline").read_bytes()
        except FileNotFoundError:
            return False
        return state != "Z" and str(self.state_dir / "bin" / "scontrol").encode() in command

    def release(self) -> None:
        """Let the drain reading now end (blocks until one reads)."""
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
    with contextlib.closing(Store(database)) as store:
        store.place_nodes(Topology(nodes=[Node(name=f"n{i}") for i in range(1, 5)]))


def crashed_drain_of(database: str, node: str) -> None:
    """A drain of ``node`` a killed server left started, its lease lapsed long ago."""
    action = Action(id=f"act-drain-{node}", ts=0.0, kind=ActionKind.DRAIN, target=f"node/{node}", reason="Xid 79",
                    params={"idempotency_key": f"act-drain-{node}"})
    assert AuditLog(database).begin(action.id, action, owner="vigil-api-killed", now=1_000.0,
                                    lease_expires=1_030.0) is None
