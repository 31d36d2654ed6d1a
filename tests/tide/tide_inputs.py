"""The inputs the tide tests hand to the planner and the actuators: the default tier policy with some fields
changed, written to a file, and a plan of spot and offline GPUs per interval."""

from __future__ import annotations

from pathlib import Path

import yaml

from vigil.remedy.tide.planner import Allotment, TidePlan
from vigil.remedy.tide.tiers import DEFAULT_TIERS


def write_policy(path: Path, **changes: object) -> Path:
    raw = yaml.safe_load(DEFAULT_TIERS.read_text())
    for key, value in changes.items():
        tier, field = key.split("_", 1) if key.startswith("t") and key[1].isdigit() else ("", key)
        if tier:
            next(t for t in raw["tiers"] if t["tier"] == int(tier[1:]))[field] = value
        else:
            raw[field] = value
    path.write_text(yaml.safe_dump(raw))
    return path


def plan_of(spot: list[int], offline: list[int] | None = None) -> TidePlan:
    offline = offline or [0] * len(spot)
    return TidePlan(300.0, 1000, [Allotment(300.0 * i, 0.0, 0, {1: 0, 2: 0, 3: s, 4: o})
                                  for i, (s, o) in enumerate(zip(spot, offline, strict=True))])
