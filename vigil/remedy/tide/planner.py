"""The tidal plan: per coming interval, serving GPUs for the forecast inference load, then tier 2's
reservation, then what is left to spot training (tier 3) and offline inference (tier 4), with
preemption notices issued a tier's notice lead before its capacity is taken back.

Only healthy GPUs are ever offered: the plan starts from the cluster's size less every GPU on a node
that is not healthy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from vigil.model import FaultLevel, Topology, VigilInputError
from vigil.remedy.tide.forecast import SeasonalBurstForecaster
from vigil.remedy.tide.tiers import TierPolicy


@dataclass(frozen=True)
class Capacity:
    """The cluster's GPUs and those that may not be offered (on nodes below healthy)."""

    total_gpus: int
    unhealthy_gpus: int = 0

    @property
    def healthy_gpus(self) -> int:
        return max(self.total_gpus - self.unhealthy_gpus, 0)


def capacity_of(topology: Topology, health: dict[str, FaultLevel]) -> Capacity:
    """The topology's GPUs; every GPU of a node that, or one of whose GPUs, has an open fault is unhealthy."""

    def sick(entity: str) -> bool:
        return health.get(entity, FaultLevel.HEALTHY) != FaultLevel.HEALTHY

    total = sum(len(node.gpus) for node in topology.nodes)
    unhealthy = sum(
        len(node.gpus) for node in topology.nodes if sick(node.id) or any(sick(gpu.id) for gpu in node.gpus)
    )
    return Capacity(total, unhealthy)


@dataclass(frozen=True)
class Allotment:
    """GPUs per tier for one interval; ``start_s`` is seconds from the plan's start."""

    start_s: float
    forecast_rps: float
    inference_need: int
    tiers: dict[int, int]

    @property
    def shortfall(self) -> int:
        """Serving GPUs the forecast needs but the policy's ceilings or healthy capacity could not give."""
        return max(self.inference_need - self.tiers[1], 0)


@dataclass(frozen=True)
class Notice:
    """Tier ``tier`` must give back ``gpus`` by ``effective_s``; told at ``issued_s`` (seconds from plan start)."""

    tier: int
    gpus: int
    issued_s: float
    effective_s: float


@dataclass
class TidePlan:
    interval_s: float
    healthy_gpus: int
    intervals: list[Allotment] = field(default_factory=list)
    notices: list[Notice] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "interval_s": self.interval_s,
            "healthy_gpus": self.healthy_gpus,
            "intervals": [asdict(a) | {"shortfall": a.shortfall} for a in self.intervals],
            "notices": [asdict(n) for n in self.notices],
        }


def lead_intervals(policy: TierPolicy) -> int:
    """Intervals ahead a tier-3 notice must go out."""
    return math.ceil(policy.tier(3).notice_lead_s / policy.interval_s)


def allot(inference_need: int, policy: TierPolicy, capacity: Capacity) -> dict[int, int]:
    """GPUs per tier for one interval; every tier between its floor and ceiling, all within healthy GPUs."""
    healthy = capacity.healthy_gpus
    if policy.floors() > healthy:
        raise VigilInputError(f"tier floors need {policy.floors()} GPUs, only {healthy} healthy")
    t1, t2, t3, t4 = (policy.tier(n) for n in (1, 2, 3, 4))
    # tier 1 may grow into everything but the other tiers' floors
    inference = min(
        max(inference_need, t1.floor_gpus), t1.ceiling_gpus, healthy - t2.floor_gpus - t3.floor_gpus - t4.floor_gpus
    )
    training = min(t2.ceiling_gpus, healthy - inference - t3.floor_gpus - t4.floor_gpus)
    spot = min(t3.ceiling_gpus, healthy - inference - training - t4.floor_gpus)
    offline = min(t4.ceiling_gpus, healthy - inference - training - spot)
    return {1: inference, 2: training, 3: spot, 4: offline}


def plan(
    history_rps: np.ndarray,
    policy: TierPolicy,
    capacity: Capacity,
    horizon: int | None = None,
    promised_spot: Sequence[int] = (),
) -> TidePlan:
    """Plan the next ``horizon`` intervals from per-interval peak request rates so far.

    ``promised_spot[i]`` is what an earlier plan told tier 3 it holds in interval ``i`` (its notice lead has
    passed): kept unless serving needs it, so tier 3 loses GPUs at short notice only to a burst.

    Serving is sized on the point forecast. Tier 3 is sized on the forecast's envelope and holds, in each
    interval, the least it could hold over the notice lead that follows, so capacity inference will need is
    free when it arrives and a shrink is known a lead ahead; tier 4 takes what is left and yields at once.
    """
    lead = lead_intervals(policy)
    horizon = horizon if horizon is not None else 2 * lead + 1
    if horizon < 1:
        raise VigilInputError("horizon must be at least one interval")
    season = max(int(round(86400.0 / policy.interval_s)), 1)
    forecaster = SeasonalBurstForecaster(season=season).fit(np.asarray(history_rps, dtype=float))
    # forecast past the horizon by the lead, so the last intervals' tier 3 also looks ahead
    forecast = forecaster.predict(horizon + lead)
    reserve = 1.0 + policy.inference.burst_reserve
    envelope = np.maximum(forecaster.predict(horizon + lead, spread=lead + 1), forecast) * reserve
    needs = [policy.inference.gpus_for(float(rps)) for rps in forecast]
    raw = [allot(need, policy, capacity) for need in needs]
    block = policy.tier(3).block_gpus
    spot_room = [allot(policy.inference.gpus_for(float(rps)), policy, capacity)[3] // block * block for rps in envelope]
    result = TidePlan(interval_s=policy.interval_s, healthy_gpus=capacity.healthy_gpus)
    t4 = policy.tier(4)
    for i in range(horizon):
        tiers = dict(raw[i])
        spot = min(spot_room[i : i + lead + 1])
        if i < len(promised_spot):
            spot = max(spot, promised_spot[i])
        # a burst past the envelope takes from tier 3 only what tier 4's floor and the rest cannot give
        room = capacity.healthy_gpus - tiers[1] - tiers[2] - t4.floor_gpus
        if spot > room:
            spot = room // block * block
        spot = max(spot, policy.tier(3).floor_gpus)
        tiers[3] = spot
        tiers[4] = min(t4.ceiling_gpus, capacity.healthy_gpus - tiers[1] - tiers[2] - spot)
        result.intervals.append(Allotment(i * policy.interval_s, float(forecast[i]), needs[i], tiers))
    for previous, current in zip(result.intervals, result.intervals[1:], strict=False):
        for tier in (3, 4):
            given_back = previous.tiers[tier] - current.tiers[tier]
            if given_back > 0:
                lead_s = policy.tier(tier).notice_lead_s
                result.notices.append(Notice(tier, given_back, max(current.start_s - lead_s, 0.0), current.start_s))
    return result
