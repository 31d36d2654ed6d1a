"""Blast-radius guard: never take more than a set share of the cluster, or of one switch, out of service.

Out of service = any node the lifecycle store holds outside healthy / suspect, plus nodes this guard
has admitted and not yet seen recorded. A bounded dry run (`vigil remedy apply`) counts what it *would*
have done, so a dry-run flood shows the same refusals a live one would; the dry runs of a long-running server
or engine (execute_actions off) are only judged, never held, since nothing they propose ever comes back into
service. Shares are rounded down: with 10% of 25
nodes, two nodes may be out at once, never three. Nodes missing from the topology are refused,
because their share cannot be judged.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

from vigil.model import ActionKind, Topology, node_id
from vigil.remedy.lifecycle import LifecycleStore

# Actions that take capacity away; everything else passes the guard.
CAPACITY_ACTIONS = frozenset({ActionKind.CORDON, ActionKind.DRAIN, ActionKind.REBOOT})


@dataclass(frozen=True)
class Verdict:
    admitted: bool
    reason: str


class BlastRadiusGuard:
    def __init__(
        self,
        topology: Topology,
        lifecycle: LifecycleStore | None = None,
        *,
        max_share: float = 0.1,
        max_share_per_switch: float = 0.5,
    ) -> None:
        if not 0.0 <= max_share <= 1.0 or not 0.0 <= max_share_per_switch <= 1.0:
            raise ValueError("blast-radius shares must be between 0 and 1")
        self.lifecycle = lifecycle
        self.max_share = max_share
        self.max_share_per_switch = max_share_per_switch
        self._switch_of = {node_id(n.name): n.switch for n in topology.nodes}
        self._switch_sizes: dict[str, int] = {}
        for switch in self._switch_of.values():
            self._switch_sizes[switch] = self._switch_sizes.get(switch, 0) + 1
        # node -> the actions holding it (their ids; "" for a caller that names none). Each action releases only its
        # own hold: two actions of one process may hold one node, and the first to fail must not free the other's.
        self._held: dict[str, set[str]] = {}
        self._lock = threading.Lock()

    @property
    def cluster_limit(self) -> int:
        return math.floor(self.max_share * len(self._switch_of) + 1e-9)

    def switch_limit(self, switch: str) -> int:
        return math.floor(self.max_share_per_switch * self._switch_sizes.get(switch, 0) + 1e-9)

    def out_of_service(self) -> set[str]:
        return self._stored_out() | set(self._held)

    def _stored_out(self) -> set[str]:
        return self.lifecycle.out_of_service() if self.lifecycle is not None else set()

    def admit(self, node: str, *, owner: str = "") -> Verdict:
        """Reserve ``node`` for a capacity-taking action, or say which limit forbids it."""
        return self.admit_all([node], owner=owner)

    def admit_all(self, nodes: list[str], *, reserve: bool = True, owner: str = "") -> Verdict:
        """Admit every node, each judged as if the ones before it were out, or none: the first refusal.

        With ``reserve`` the admitted nodes are held for ``owner`` (the action's id) until it releases them, also
        those another action holds already; without it the verdict is only what the guard would say now (a dry run
        of a long-running server), and nothing is held."""
        with self._lock:
            stored = self._stored_out()
            out = stored | set(self._held)
            verdict = Verdict(True, "within blast radius")
            for node in nodes:
                verdict = self._judge(node, out)
                if not verdict.admitted:
                    return verdict
                out.add(node)
            if reserve:
                for node in dict.fromkeys(nodes):
                    if node not in stored:
                        self._held.setdefault(node, set()).add(owner)
            return verdict

    def _judge(self, node: str, out: set[str]) -> Verdict:
        if node not in self._switch_of:
            return Verdict(False, f"{node} is not in the topology; blast radius cannot be judged")
        if node in out:
            return Verdict(True, f"{node} already out of service")
        if len(out) + 1 > self.cluster_limit:
            return Verdict(
                False,
                f"blast radius: {len(out)} of {len(self._switch_of)} nodes already out of service; "
                f"limit {self.cluster_limit} ({self.max_share:.0%} of the cluster)",
            )
        switch = self._switch_of[node]
        if switch:
            on_switch = sum(1 for n in out if self._switch_of.get(n) == switch)
            limit = self.switch_limit(switch)
            if on_switch + 1 > limit:
                return Verdict(
                    False,
                    f"blast radius: {on_switch} of {self._switch_sizes[switch]} nodes under switch "
                    f"{switch} already out of service; limit {limit} ({self.max_share_per_switch:.0%})",
                )
        return Verdict(True, "within blast radius")

    def release(self, node: str, *, owner: str | None = None) -> None:
        """Forget ``owner``'s hold on ``node`` (its action failed, or another process holds the run), keeping any
        other action's; with no ``owner``, every hold on it (the node is back in service)."""
        with self._lock:
            holders = self._held.get(node, set())
            if owner is None:
                holders.clear()
            else:
                holders.discard(owner)
            if not holders:
                self._held.pop(node, None)
