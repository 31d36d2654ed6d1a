"""Straggler detection from collective wait times, without comparing clocks across hosts.

In a synchronous collective the last rank to arrive waits the least. A rank that arrives last in
most recent collectives, by a margin that matters next to the step time, is the straggler. Under
DDP or FSDP only one or two of a step's collectives show the lag (the rest run in lockstep once
everyone has arrived), so the window counts the collectives that made ranks wait, not all of them.
The finding also carries each rank's total wait: the slow rank computes longest and waits least.

A share alone is not evidence on a short window: with three ranks and random per-step jitter, some
rank is last in six of eight collectives about one run in seventeen. The finding therefore also
needs the share to be unlikely under "every rank is equally likely to be last" (a one-sided binomial
test, Bonferroni-corrected over the ranks), at a false-alarm rate of one run in a thousand.

What lag matters depends on the step: 50 ms is noise next to a 2 s step and a quarter of a 0.13 s one.
With the job's median step time known, a lag counts from ``STEP_SHARE`` of it (never under
``MIN_LAG_FLOOR_S``, never over the 50 ms used without step times).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from scipy.stats import binom

from vigil.detect.collectives import collective_ops
from vigil.sources.probe.records import OpRecord, RankSnapshot

# A lag counts from this share of the job's median step time (a rank that makes its peers wait a tenth of
# every step costs the job a tenth of its time), bounded below by MIN_LAG_FLOOR_S (timer and scheduling
# noise on a loaded machine) and above by the 50 ms default. Chosen on the DDP / FSDP2 straggler rows of
# bench/hang.py after a new FSDP2 scenario (30 ms lag, 0.13 s steps) went unseen under the fixed 50 ms.
STEP_SHARE = 0.1
MIN_LAG_FLOOR_S = 0.01


@dataclass
class StragglerFinding:
    rank: int
    last_share: float
    collectives: int
    median_lag_s: float
    median_wait_others_s: float
    wait_by_rank: dict[int, float] = field(default_factory=dict)

    def describe(self) -> str:
        return (
            f"rank {self.rank} arrived last in {self.last_share:.0%} of {self.collectives} collectives; "
            f"its peers waited a median {self.median_lag_s * 1000:.0f} ms longer for it"
        )


def find_straggler(
    ops_by_rank: dict[int, list[OpRecord]],
    window: int = 30,
    min_collectives: int = 8,
    min_share: float = 0.7,
    min_lag_s: float = 0.05,
    false_alarm: float = 1e-3,
    step_s: float | None = None,
    since: float | None = None,
) -> StragglerFinding | None:
    """The consistently-last rank over the last ``window`` completed collectives that made ranks wait;
    ``step_s``: the job's median step time, which scales the lag that counts; ``since``: collectives a rank
    began before this time (the end of every rank's first step, :func:`first_step_end`) are left out."""
    if step_s is not None and step_s > 0:
        min_lag_s = min(min_lag_s, max(MIN_LAG_FLOOR_S, STEP_SHARE * step_s))
    last_counts: Counter[int] = Counter()
    world = 0
    lags: dict[int, list[float]] = {}
    others_waits: list[float] = []
    total_wait: Counter[int] = Counter()
    counted = 0
    for table in collective_ops(ops_by_rank).values():
        ranks = sorted(table)
        if len(ranks) < 2:
            continue
        world = max(world, len(ranks))
        common = sorted(set.intersection(*(set(table[r]) for r in ranks)))
        done = [s for s in common if all(table[r][s].state == "completed" for r in ranks)
                and (since is None or all(table[r][s].t_start >= since for r in ranks))]
        lagging = []
        for seq in done:
            waits = {r: table[r][seq].duration_s or 0.0 for r in ranks}
            total_wait.update(waits)
            last = min(waits, key=lambda r: waits[r])
            others = [w for r, w in waits.items() if r != last]
            lag = statistics.median(others) - waits[last]
            # Collectives everyone reaches together say nothing about who is slow.
            if lag >= min_lag_s:
                lagging.append((last, lag, others))
        for last, lag, others in lagging[-window:]:
            last_counts[last] += 1
            lags.setdefault(last, []).append(lag)
            others_waits.extend(others)
            counted += 1
    if counted < min_collectives or not last_counts:
        return None
    rank, count = last_counts.most_common(1)[0]
    share = count / counted
    lag = statistics.median(lags[rank])
    if share < min_share or _chance_of(count, counted, world) > false_alarm:
        return None
    return StragglerFinding(
        rank=rank,
        last_share=share,
        collectives=counted,
        median_lag_s=lag,
        median_wait_others_s=statistics.median(others_waits) if others_waits else 0.0,
        wait_by_rank={r: round(w, 4) for r, w in sorted(total_wait.items())},
    )


def _chance_of(count: int, counted: int, world: int) -> float:
    """How likely some rank is last at least ``count`` times in ``counted`` collectives by chance alone."""
    tail = float(binom.sf(count - 1, counted, 1.0 / world))
    return min(1.0, world * tail)


def first_step_end(snapshots: Iterable[RankSnapshot]) -> float | None:
    """When every rank had finished its first optimizer step, or None before that. The collectives before it
    (DDP's parameter broadcast, the first step's buckets) show how far apart the ranks started - imports,
    rendezvous, the first batch - not which one is slow: on a 12-step job they made a 0.4 s straggler look
    like chance. A rank whose early step times were dropped (a long job) stepped long before the window."""
    ends = []
    for snap in snapshots:
        if snap.last_step is None:
            return None
        known = snap.steps == len(snap.step_times) + 1
        ends.append(snap.last_step - sum(snap.step_times) if known else float("-inf"))
    return max(ends) if ends else None


def median_step_s(step_times: list[list[float]]) -> float | None:
    """The job's median step time over every rank's recent steps, or None before any step."""
    times = [t for per_rank in step_times for t in per_rank]
    return statistics.median(times) if times else None
