"""The silent-rank detector's memory in a long-running engine: it keeps what can still decide a verdict."""

from __future__ import annotations

from vigil.detect.silent_rank import LOOKBACK_S, CollectiveTimeouts
from vigil.model import Event, Topology


def _crash(ts: float, job: int) -> Event:
    return Event(ts=ts, entity=f"job/j{job}/rank/0", kind="rank_exit", attrs={"exit_code": 1})


def test_crashes_older_than_two_lookbacks_are_forgotten_and_recent_ones_kept() -> None:
    timeouts = CollectiveTimeouts(Topology())
    # a month of one crashed job every ten minutes
    crashes = [_crash(600.0 * i, i) for i in range(4320)]
    now = crashes[-1].ts
    timeouts.add(crashes, [], now)
    timeouts.judge(now)
    kept = timeouts._crashed
    assert set(kept) == {c.entity for c in crashes if c.ts >= now - 2 * LOOKBACK_S}
    assert len(kept) == 7  # the last hour's (two look-backs of 30 minutes), not all 4,320
