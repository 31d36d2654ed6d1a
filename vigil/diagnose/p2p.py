"""Point-to-point progress: one schema for gloo (posted / done) and NCCL proxy counters.

A transfer is split into ``nsteps`` steps. A send goes posted -> transmitted -> done; a recv goes
posted -> received -> transmitted -> done. Each counter says how many steps reached that stage
(NCCL's ``ncclProxySubArgs``). The probe on gloo only sees posted and done, which maps onto the same
counters with one step. Status letters follow NCCL's ``printProxyOp``: I (not fully posted),
G (waiting for the GPU), S (sending), R (waiting to receive), F (flushing), D (done).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from vigil.model import VigilInputError
from vigil.sources.probe.records import P2P, OpRecord

SEND = "send"
RECV = "recv"


@dataclass(frozen=True)
class P2PState:
    rank: int
    peer: int
    direction: str
    seq: int
    channel: int = 0
    nsteps: int = 1
    posted: int = 0
    received: int = 0
    transmitted: int = 0
    done: int = 0
    group: str = "0"
    # When the op was posted and when it was seen done (the probe's clock); 0 where unknown (NCCL proxy counters).
    t_start: float = 0.0
    t_end: float = 0.0

    @property
    def status(self) -> str:
        if self.done >= self.nsteps:
            return "D"
        if self.posted < self.nsteps and self.posted <= self.done:
            return "I"
        if self.direction == SEND:
            if self.transmitted < self.posted:
                return "G"
            return "S"
        if self.received < self.posted:
            return "R"
        if self.transmitted < self.received:
            return "F"
        return "G"


@dataclass
class LinkFinding:
    src: int
    dst: int
    channel: int
    culprit: int | None
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"src": self.src, "dst": self.dst, "channel": self.channel, "culprit": self.culprit,
                "reason": self.reason}


@dataclass
class P2PAnalysis:
    links: list[LinkFinding] = field(default_factory=list)
    rings: dict[int, list[int]] = field(default_factory=dict)
    waiting: dict[int, int] = field(default_factory=dict)

    @property
    def culprit_ranks(self) -> list[int]:
        return sorted({link.culprit for link in self.links if link.culprit is not None})

    @property
    def culprit_links(self) -> list[list[int]]:
        return [[link.src, link.dst] for link in self.links]


def states_from_probe(ops_by_rank: dict[int, list[OpRecord]]) -> list[P2PState]:
    """Gloo: a posted op has all its (one) steps posted; the wire stages are invisible until done."""
    states = []
    for rank, ops in ops_by_rank.items():
        for op in ops:
            if op.kind != P2P or op.peer is None:
                continue
            done = 1 if op.state == "completed" else 0
            # A posted gloo send has its data on the host already: it is "sending" (S) until done.
            transmitted = 1 if op.op == SEND else done
            states.append(
                P2PState(
                    rank=rank, peer=op.peer, direction=op.op, seq=op.seq, posted=1,
                    transmitted=transmitted, received=done, done=done, group=op.group, t_start=op.t_start,
                    t_end=op.t_end or 0.0,
                )
            )
    return states


def states_from_nccl_proxy(records: list[dict[str, Any]]) -> list[P2PState]:
    """NCCL proxy sub-op counters, one dict per (rank, peer, channel, op): the fields of ncclProxySubArgs."""
    states = []
    for index, rec in enumerate(records):
        try:
            direction = str(rec["op"]).lower()
            if direction not in (SEND, RECV):
                raise ValueError(f"op must be send or recv, got {rec['op']!r}")
            states.append(
                P2PState(
                    rank=int(rec["rank"]), peer=int(rec["peer"]), direction=direction,
                    seq=int(rec.get("opCount", rec.get("seq", 0))), channel=int(rec.get("channel", 0)),
                    nsteps=int(rec["nsteps"]), posted=int(rec.get("posted", 0)),
                    received=int(rec.get("received", 0)), transmitted=int(rec.get("transmitted", 0)),
                    done=int(rec.get("done", 0)),
                )
            )
        except (KeyError, ValueError, TypeError) as err:
            raise VigilInputError(f"NCCL proxy state #{index}: bad or missing field ({err})") from None
    return states


def rebuild_rings(states: list[P2PState]) -> dict[int, list[int]]:
    """Per channel, follow send edges from the lowest rank to recover the ring order."""
    successors: dict[int, dict[int, int]] = defaultdict(dict)
    for state in states:
        if state.direction == SEND:
            successors[state.channel][state.rank] = state.peer
        else:
            successors[state.channel].setdefault(state.peer, state.rank)
    rings = {}
    for channel, nxt in successors.items():
        start = min(nxt)
        order = [start]
        while nxt.get(order[-1]) is not None and nxt[order[-1]] not in order:
            order.append(nxt[order[-1]])
        rings[channel] = order
    return rings


def analyse(states: list[P2PState]) -> P2PAnalysis:
    """Name the rank or link where progress stops, explaining away ranks that only wait upstream."""
    sends: dict[tuple[int, int, int, int], P2PState] = {}
    recvs: dict[tuple[int, int, int, int], P2PState] = {}
    for state in states:
        if state.direction == SEND:
            sends[(state.rank, state.peer, state.channel, state.seq)] = state
        else:
            recvs[(state.peer, state.rank, state.channel, state.seq)] = state
    # A rank whose own recv is still waiting is blocked upstream; its stalled sends are explained.
    blocked_upstream = {s.rank for s in states if s.direction == RECV and s.status in ("I", "R")}
    analysis = P2PAnalysis(rings=rebuild_rings(states))
    for key in sorted(set(sends) | set(recvs)):
        src, dst, channel, _ = key
        send, recv = sends.get(key), recvs.get(key)
        if send is not None and recv is None and send.status != "D":
            analysis.links.append(LinkFinding(src, dst, channel, dst, f"rank {dst} never posted the recv"))
            analysis.waiting[src] = dst
        elif recv is not None and send is None and recv.status != "D":
            if src in blocked_upstream:
                analysis.waiting[dst] = src
                continue
            analysis.links.append(LinkFinding(src, dst, channel, src, f"rank {src} never posted the send"))
            analysis.waiting[dst] = src
        elif send is not None and recv is not None:
            _classify_pair(send, recv, blocked_upstream, analysis)
    if len(analysis.culprit_ranks) > 1:
        first = _first_blocker(states, analysis.culprit_ranks)
        if first is not None:
            analysis.links = [link for link in analysis.links if link.culprit is None or link.culprit in first]
    return analysis


def _first_blocker(states: list[P2PState], candidates: list[int]) -> set[int] | None:
    """The culprits among several, by who waits on whom. A rank whose own p2p op is unfinished cannot post its
    later ones: it waits on that op's peer (a gloo send completes once the peer posted the recv), so the ops it
    never posted are a consequence. Follow each candidate's oldest unfinished op to the rank it waits on: a
    rank not waiting in p2p (it moved on) is the culprit. Where the waits close a cycle (a pipeline stage
    waiting to send forward while the next one waits to send its gradients back), the culprit is the receiver
    that took part of the sends its peer posted together (an earlier send of the peer's ended after the
    unmatched one was posted: the receiver matched some and went on without the rest); failing that, the rank
    the cycle's oldest op waits on. None without posting times."""
    oldest: dict[int, P2PState] = {}
    for state in states:
        if state.status == "D" or state.t_start <= 0:
            continue
        if state.rank not in oldest or state.t_start < oldest[state.rank].t_start:
            oldest[state.rank] = state
    if not oldest:
        return None
    ends: set[int] = set()
    for start in candidates:
        chain: list[int] = []
        rank = start
        while rank in oldest and rank not in chain:
            chain.append(rank)
            rank = oldest[rank].peer
        if rank not in oldest:
            ends.add(rank)
        else:
            cycle = chain[chain.index(rank):]
            partial = {oldest[r].peer for r in cycle if _matched_part_of(states, oldest[r])}
            ends |= partial or {oldest[min(cycle, key=lambda r: oldest[r].t_start)].peer}
    return ends if ends and ends <= set(candidates) else None


def _matched_part_of(states: list[P2PState], pending: P2PState) -> bool:
    """A pending send whose receiver matched earlier sends posted together with it: one of the sender's earlier
    sends to that peer ended (was waited on) after this one was posted."""
    if pending.direction != SEND or pending.t_start <= 0:
        return False
    return any(
        s.rank == pending.rank and s.peer == pending.peer and s.direction == SEND and s.seq < pending.seq
        and s.status == "D" and s.t_end >= pending.t_start
        for s in states
    )


def _classify_pair(send: P2PState, recv: P2PState, blocked: set[int], analysis: P2PAnalysis) -> None:
    src, dst, channel = send.rank, recv.rank, send.channel
    if send.status == "D" and recv.status == "D":
        return
    if send.status == "G":
        if src not in blocked:
            analysis.links.append(
                LinkFinding(src, dst, channel, src, f"rank {src} never produced the data to send")
            )
        analysis.waiting[dst] = src
    elif send.status == "S" and recv.status == "R":
        # Both ends are posted and the sender has data on the wire, yet nothing arrives: the link.
        # A finished send with a pending recv is only the receiver not having looked yet.
        analysis.links.append(LinkFinding(src, dst, channel, None, f"data sent by {src} does not arrive at {dst}"))
        analysis.waiting[dst] = src
    elif recv.status == "G" and dst not in blocked:
        analysis.links.append(LinkFinding(src, dst, channel, dst, f"rank {dst} never consumed received data"))
        analysis.waiting[src] = dst
