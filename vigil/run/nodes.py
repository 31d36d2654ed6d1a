"""Several nodes, one verdict: the supervisors of a multi-node job meet in the shared run directory.

Each node runs its own ranks and its own supervisor (``vigil launch --nnodes N --node-rank I``); the
probes of every rank already write their records to the shared directory. On top of that each
supervisor publishes ``node<I>.json`` (its host and its ranks' pids and exit codes), so every node sees
the whole job: an exit on one node is a crash for all. The first supervisor to reach a verdict claims
it (``verdict.claim``, created exclusively); the others then read their own ranks' stacks with py-spy
(it only reaches local processes), leave them in ``stacks.node<I>.json``, wait for the claimer's
``diagnosis.json``, which names the culprit across nodes, and only then stop their ranks (stopped
earlier, they would make the claimer's ranks fail, and that cascade would read as a crash).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vigil.sources.probe.records import write_json_atomic

CLAIM_FILE = "verdict.claim"
NODE_PATTERN = "node{node}.json"
NODE_STACKS_PATTERN = "stacks.node{node}.json"
# Before the first step: each node's py-spy stacks of its own ranks, so any node can split the whole job.
PRE_STEP_STACKS_PATTERN = "prestep.node{node}.json"
# A peer rewrites its file every tick: one older than this node's start by more than this is left over
# from an earlier run in the same directory.
STALE_PEER_S = 5.0


@dataclass
class NodeGroup:
    """This node's place in a job of ``nnodes`` nodes sharing ``out_dir``."""

    out_dir: Path
    nnodes: int
    node_rank: int
    started: float = field(default_factory=time.time)

    def clear_own(self) -> None:
        """Drop what this node left in the shared directory on an earlier run."""
        for pattern in (NODE_PATTERN, NODE_STACKS_PATTERN, PRE_STEP_STACKS_PATTERN):
            (self.out_dir / pattern.format(node=self.node_rank)).unlink(missing_ok=True)

    @property
    def claim_path(self) -> Path:
        return self.out_dir / CLAIM_FILE

    def publish(self, pids: dict[int, int], exit_codes: dict[int, int | None], exit_times: dict[int, float],
                final: bool = False, stopped: set[int] | None = None) -> None:
        payload = {
            "node_rank": self.node_rank,
            "host": socket.gethostname(),
            "heartbeat": time.time(),
            "final": final,
            "stopped": sorted(stopped or ()),
            "ranks": {str(r): {"pid": pid, "exit_code": exit_codes.get(r), "exit_time": exit_times.get(r)}
                      for r, pid in pids.items()},
        }
        write_json_atomic(self.out_dir / NODE_PATTERN.format(node=self.node_rank), json.dumps(payload))

    def peers(self) -> dict[int, dict[str, Any]]:
        """Every other node's last published state, by node rank."""
        nodes = {}
        for node in range(self.nnodes):
            if node == self.node_rank:
                continue
            path = self.out_dir / NODE_PATTERN.format(node=node)
            with contextlib.suppress(FileNotFoundError, json.JSONDecodeError, TypeError, ValueError):
                state = json.loads(path.read_text())
                if float(state.get("heartbeat", 0.0)) >= self.started - STALE_PEER_S:
                    nodes[node] = state
        return nodes

    def remote_exits(self) -> tuple[dict[int, int | None], dict[int, float]]:
        codes: dict[int, int | None] = {}
        times: dict[int, float] = {}
        for node in self.peers().values():
            for rank, state in node.get("ranks", {}).items():
                codes[int(rank)] = state.get("exit_code")
                if state.get("exit_time") is not None:
                    times[int(rank)] = float(state["exit_time"])
        return codes, times

    def claimer(self) -> int | None:
        """The node that claimed this run's verdict; a claim made before this node started is an
        earlier run's (a verdict needs every node running first)."""
        with contextlib.suppress(json.JSONDecodeError, FileNotFoundError, KeyError, TypeError, ValueError):
            claim = json.loads(self.claim_path.read_text())
            if float(claim["ts"]) >= self.started:
                return int(claim["node_rank"])
        return None

    def _create_claim(self, trigger: str) -> bool:
        """Create the claim whole or not at all: written aside, then hard-linked into place (the link fails
        if it exists). A claim created empty and filled after could be read half-written by a peer, taken
        for an earlier run's and removed - and two nodes would both report."""
        aside = self.out_dir / f".claim.node{self.node_rank}.tmp"
        aside.write_text(json.dumps({"node_rank": self.node_rank, "trigger": trigger, "ts": time.time()}))
        try:
            os.link(aside, self.claim_path)
        except FileExistsError:
            return False
        finally:
            aside.unlink(missing_ok=True)
        return True

    def claimed_by_other(self) -> bool:
        claimer = self.claimer()
        return claimer is not None and claimer != self.node_rank

    def claim(self, trigger: str) -> bool:
        """True for the one node that reports this verdict."""
        if self.claim_path.exists() and self.claimer() is None:
            # An earlier run's claim: not this run's, so it does not stand in the way.
            self.claim_path.unlink(missing_ok=True)
        return self._create_claim(trigger)

    def write_stacks(self, stacks: dict[int, dict[str, list[str]]], pattern: str = NODE_STACKS_PATTERN) -> None:
        payload = {str(r): {"threads": t, "ts": time.time()} for r, t in stacks.items()}
        write_json_atomic(self.out_dir / pattern.format(node=self.node_rank), json.dumps(payload))

    def read_stacks(self, pattern: str = NODE_STACKS_PATTERN, since: float = 0.0) -> dict[int, dict[str, list[str]]]:
        """The other nodes' stacks of their ranks (those taken at ``since`` or later)."""
        stacks: dict[int, dict[str, list[str]]] = {}
        for node in range(self.nnodes):
            path = self.out_dir / pattern.format(node=node)
            if node == self.node_rank or not path.exists():
                continue
            with contextlib.suppress(json.JSONDecodeError, FileNotFoundError, KeyError, TypeError, ValueError):
                for rank, entry in json.loads(path.read_text()).items():
                    if float(entry.get("ts", since)) >= since:
                        stacks[int(rank)] = {str(k): list(v) for k, v in entry["threads"].items()}
        return stacks

    def stacks_in(self) -> bool:
        return all((self.out_dir / NODE_STACKS_PATTERN.format(node=n)).exists()
                   for n in range(self.nnodes) if n != self.node_rank)
