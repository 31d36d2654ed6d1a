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
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field

from scipy.stats import binom

from vigil.detect.collectives import collective_ops
from vigil.sources.probe.records import OpRecord


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
) -> StragglerFinding | None:
    """The consistently-last rank over the last ``window`` completed collectives that made ranks wait."""
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
        done = [s for s in common if all(table[r][s].state == "completed" for r in ranks)]
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
