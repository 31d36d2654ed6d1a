"""The rank a job-wide collective timeout leaves out: the one the others wait for.

When a collective hangs, the watchdog of every rank that entered it (ProcessGroupNCCL's, c10d's) times it out
and logs it with the collective's sequence number ("Watchdog caught collective operation timeout:
WorkNCCL(SeqNum=18231, OpType=ALLREDUCE, ...)"). The rank that never entered it - stuck in its data loader, in
another collective, in a CUDA call - has nothing to time out and logs nothing. An SRE reads the logs that way:
all ranks but one report the same SeqNum, so the one that did not is the suspect. RCA reads its evidence the
same way (``silent_ranks``, the peer:silent_rank symptom); ``CollectiveTimeouts`` reads the live rank-log events.

Silence is evidence only where it is the rank's own:
- the peers' lines name the collective (its SeqNum, per process group), and nearly all of the job's ranks
  (``REPORTING_SHARE`` of a world of at least ``MIN_WORLD``) report that one;
- exactly one rank is silent: several silent ranks are a node's worth, a lost log stream or a process group,
  not one culprit, and keep the job's scope;
- the silent rank is placed in the job, its node has not been down (within ``LOOKBACK_S`` before the
  peers' timeouts, or since), it did not crash before them, and its node's logs arrive (a rank on that
  node, itself or a node-mate, wrote a line the decoder names in that time): a crashed node or a node
  whose logs are missing is silent for another reason.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from vigil.model import Event, Topology, node_of, parse_entity, rank_id

MIN_WORLD = 4
REPORTING_SHARE = 0.75
# The symptoms (signatures.yaml) of a rank's watchdog timing out a collective it entered.
TIMEOUT_SYMPTOMS = frozenset({"nccl_timeout", "watchdog_timeout"})
# The peers' watchdogs fire within seconds of each other (they entered the collective within a step of each
# other); a timeout line still on its way must not make a rank look silent.
SETTLE_S = 30.0
# How far back a crash of the silent rank or its node, and its node's last line, count: the longest
# collective timeout jobs commonly set (torch's default is 10 minutes, long checkpoints get 30).
LOOKBACK_S = 1800.0

T = TypeVar("T")


def silent_ranks(world: Sequence[T], reporting: Collection[T], max_silent: int) -> list[T]:
    """The ranks of ``world`` missing from ``reporting`` when nearly all of it reports an error and at most
    ``max_silent`` do not; none otherwise."""
    silent = [r for r in world if r not in reporting]
    if len(world) < MIN_WORLD or not silent or len(silent) > max_silent or len(reporting) < REPORTING_SHARE * len(
            world):
        return []
    return silent


@dataclass
class SilentRank:
    """A verdict: ``rank`` is the one rank of its job that did not time out the collective its peers did."""

    rank: str
    ts: float
    summary: str
    attrs: dict[str, object]


@dataclass
class _Collective:
    first_ts: float
    op: str
    reporting: set[str] = field(default_factory=set)


class CollectiveTimeouts:
    """Rank-log events in, silent-rank verdicts out: ``add`` each tick's events, then ``judge``."""

    def __init__(self, topology: Topology, settle_s: float = SETTLE_S, lookback_s: float = LOOKBACK_S) -> None:
        self.settle_s = settle_s
        self.lookback_s = lookback_s
        self._open: dict[tuple[str, str, int], _Collective] = {}
        self._last_line: dict[str, float] = {}  # node -> last decoded rank line from a rank placed there
        self._down: dict[str, float] = {}  # node -> last time it was seen down
        self._crashed: dict[str, float] = {}  # rank -> when the launcher reported it crashed
        self.set_topology(topology)

    def set_topology(self, topology: Topology) -> None:
        self._world = {job.entity: [rank_id(job.id, r) for r in range(len(job.placement))] for job in topology.jobs}
        # a placement's GPU id names its node, inventoried or not
        self._node_of = {rank_id(job.id, r): node_of(gpu) or "" for job in topology.jobs
                         for r, gpu in enumerate(job.placement)}

    def add(self, events: Iterable[Event], down_nodes: Iterable[str], now: float) -> None:
        for node in down_nodes:
            self._down[node] = now
        for event in events:
            if event.kind == "job" and event.attrs.get("reason") == "crashed" and event.attrs.get("rank") is not None:
                self._crashed[rank_id(event.entity.removeprefix("job/"), int(str(event.attrs["rank"])))] = event.ts
            elif event.kind == "rank_exit" and event.attrs.get("exit_code") not in (None, 0):
                self._crashed[event.entity] = event.ts
            if event.kind != "rank_log" or parse_entity(event.entity)[0] != "rank":
                continue
            placed_on = self._node_of.get(event.entity)
            if placed_on:
                self._last_line[placed_on] = max(self._last_line.get(placed_on, event.ts), event.ts)
            seq = event.attrs.get("seq")
            if event.attrs.get("symptom") not in TIMEOUT_SYMPTOMS or not isinstance(seq, int):
                continue
            job = "job/" + parse_entity(event.entity)[1][0]
            key = (job, str(event.attrs.get("process_group", "")), seq)
            collective = self._open.setdefault(key, _Collective(first_ts=event.ts, op=str(event.attrs.get("op", ""))))
            collective.reporting.add(event.entity)

    def judge(self, now: float) -> list[SilentRank]:
        """Verdicts on the collectives whose peers have had ``settle_s`` to report; each is judged once."""
        # Crashes older than two look-backs can no longer decide a verdict (a timeout arriving up to a look-back
        # late still sees its own look-back): forgotten, so a long-running engine keeps one entry per recent crash.
        horizon = now - 2 * self.lookback_s
        self._crashed = {rank: ts for rank, ts in self._crashed.items() if ts >= horizon}
        found = []
        for key, collective in list(self._open.items()):
            if now - collective.first_ts < self.settle_s:
                continue
            del self._open[key]
            job, group, seq = key
            world = self._world.get(job, [])
            silent = silent_ranks(world, collective.reporting, max_silent=1)
            if not silent or not self._alive(silent[0], collective.first_ts):
                continue
            rank = silent[0]
            op = f" ({collective.op})" if collective.op else ""
            where = f" of process group {group}" if group else ""
            summary = (f"{len(collective.reporting)} of {len(world)} ranks of {job} timed out in collective "
                       f"SeqNum {seq}{op}{where}; {rank} did not: the collective waits for it")
            found.append(SilentRank(rank=rank, ts=collective.first_ts, summary=summary, attrs={
                "signal": "silent_rank", "seq": seq, "op": collective.op, "process_group": group,
                "reporting": len(collective.reporting), "world": len(world), "node": self._node_of.get(rank, "")}))
        return found

    def _alive(self, rank: str, at: float) -> bool:
        """The rank is silent on its own account: placed on a node that was not down, not crashed, and whose
        logs arrive."""
        node = self._node_of.get(rank)
        since, never = at - self.lookback_s, -float("inf")
        # a rank that exits after its peers' timeouts was taken down with the job, not before it
        if not node or self._down.get(node, never) >= since or since <= self._crashed.get(rank, never) <= at:
            return False
        return self._last_line.get(node, never) >= since
