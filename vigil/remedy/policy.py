"""Remediation policies: which fault (level / type / entity kind) gets which actions, how often.

    defaults: {cooldown: 10m}
    policies:
      - name: gpu-fatal
        match: {minLevel: isolate}
        actions: [cordon, drain]
        cooldown: 30m
        escalation:                       # repeats of the same fault on the same node
          - {after: 2, within: 24h, actions: [reboot]}
          - {after: 3, within: 7d, actions: [vendor_ticket]}

Policies are tried in order; the first that matches decides. Actions must be in the ActionKind
whitelist. A policy that fires again for the same target inside its cooldown yields SKIPPED actions
(kept in the audit log) instead of acting twice.
"""

from __future__ import annotations

import fnmatch
import time
from collections import defaultdict, deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from vigil.config import read_yaml
from vigil.knowledge.actions import action_whitelist
from vigil.model import (
    Action,
    ActionKind,
    ActionStatus,
    Anomaly,
    FaultLevel,
    VigilInputError,
    describe_validation_error,
    job_id,
    node_of,
    parse_entity,
)
from vigil.remedy.jobspec import parse_duration

# Where each action lands, from the whitelist: node actions (and the ones that may target anything, such as a
# vendor ticket) go to the anomaly's node, job actions to its job.
NODE_ACTIONS = frozenset(a for a, entry in action_whitelist().items()
                         if entry.target in ("node", "any") and a is not ActionKind.ALERT)
JOB_ACTIONS = frozenset(a for a, entry in action_whitelist().items() if entry.target == "job")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


def _level(value: Any) -> FaultLevel:
    try:
        return FaultLevel.parse(value)
    except VigilInputError as err:
        raise ValueError(str(err)) from None


class Match(_Strict):
    fault_types: list[str] = Field(default_factory=list, alias="faultTypes")
    min_level: FaultLevel | None = Field(default=None, alias="minLevel")
    max_level: FaultLevel | None = Field(default=None, alias="maxLevel")
    entity_kinds: list[str] = Field(default_factory=list, alias="entityKinds")

    _levels = field_validator("min_level", "max_level", mode="before")(lambda v: None if v is None else _level(v))

    def matches(self, anomaly: Anomaly) -> bool:
        if self.min_level is not None and anomaly.level < self.min_level:
            return False
        if self.max_level is not None and anomaly.level > self.max_level:
            return False
        if self.entity_kinds and parse_entity(anomaly.entity)[0] not in self.entity_kinds:
            return False
        return not self.fault_types or any(fnmatch.fnmatchcase(anomaly.fault_type, p) for p in self.fault_types)


class Escalation(_Strict):
    after: int = Field(ge=2, description="occurrences (this one included) that trigger this step")
    within_s: float = Field(default=86400.0, alias="within")
    actions: list[ActionKind] = Field(min_length=1)

    _within = field_validator("within_s", mode="before")(lambda v: parse_duration(v))


class Policy(_Strict):
    name: str = Field(min_length=1, max_length=100)
    match: Match = Field(default_factory=Match)
    actions: list[ActionKind] = Field(min_length=1)
    cooldown_s: float | None = Field(default=None, alias="cooldown")
    escalation: list[Escalation] = Field(default_factory=list)

    _cooldown = field_validator("cooldown_s", mode="before")(lambda v: None if v is None else parse_duration(v))

    @model_validator(mode="after")
    def _ordered(self) -> Policy:
        afters = [step.after for step in self.escalation]
        if afters != sorted(set(afters)):
            raise ValueError("escalation steps must have strictly increasing 'after'")
        return self


class Defaults(_Strict):
    cooldown_s: float = Field(default=600.0, alias="cooldown")

    _cooldown = field_validator("cooldown_s", mode="before")(lambda v: parse_duration(v))


class PolicySet(_Strict):
    defaults: Defaults = Field(default_factory=Defaults)
    policies: list[Policy] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_names(self) -> PolicySet:
        names = [p.name for p in self.policies]
        duplicated = sorted({n for n in names if names.count(n) > 1})
        if duplicated:
            raise ValueError(f"policy names must be unique; repeated: {', '.join(duplicated)}")
        return self

    @classmethod
    def from_dict(cls, data: Any, source: str = "policies") -> PolicySet:
        if not isinstance(data, dict):
            raise VigilInputError(f"{source}: expected a mapping with a 'policies' list")
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            raise VigilInputError(f"{source}: {describe_validation_error(err)}") from None


def load_policies(path: str | Path | None = None) -> PolicySet:
    """Policies from a YAML file; without one, the built-in defaults (vigil/remedy/default_policies.yaml)."""
    path = Path(path) if path is not None else Path(__file__).with_name("default_policies.yaml")
    return PolicySet.from_dict(read_yaml(path, "policy file"), source=f"policy file {path}")


def action_target(kind: ActionKind, entity: str) -> str | None:
    """The entity an action of ``kind`` applies to, derived from the faulty entity (None: not applicable)."""
    entity_kind, parts = parse_entity(entity)
    if kind in NODE_ACTIONS:
        return node_of(entity)
    if kind is ActionKind.RESET_GPU:
        return entity if entity_kind == "gpu" else None
    if kind in JOB_ACTIONS:
        return job_id(parts[0]) if entity_kind in ("job", "rank") else None
    return entity


class PolicyEngine:
    """Turns anomalies into proposed actions; remembers occurrences for cooldown and escalation."""

    def __init__(self, policies: PolicySet, clock: Callable[[], float] = time.time) -> None:
        self.policies = policies
        self.clock = clock
        self._occurrences: dict[tuple[str, str], deque[float]] = defaultdict(deque)
        self._last_fired: dict[tuple[str, str, int], float] = {}

    def policy_for(self, anomaly: Anomaly) -> Policy | None:
        return next((p for p in self.policies.policies if p.match.matches(anomaly)), None)

    def plan(self, anomaly: Anomaly, incident_id: str | None = None) -> list[Action]:
        policy = self.policy_for(anomaly)
        if policy is None:
            return []
        now = self.clock()
        scope = node_of(anomaly.entity) or anomaly.entity
        seen = self._occurrences[(policy.name, scope)]
        seen.append(now)
        horizon = max([step.within_s for step in policy.escalation], default=0.0)
        while seen and seen[0] < now - horizon:
            seen.popleft()
        kinds, level, step_note = policy.actions, 0, ""
        for index, step in enumerate(policy.escalation, start=1):
            if sum(1 for t in seen if t >= now - step.within_s) >= step.after:
                kinds, level = step.actions, index
                step_note = f"; escalation {index} ({step.after}x within {step.within_s:g}s)"
        cooldown = policy.cooldown_s if policy.cooldown_s is not None else self.policies.defaults.cooldown_s
        last = self._last_fired.get((policy.name, scope, level))
        cooling = last is not None and now - last < cooldown
        if not cooling:
            self._last_fired[(policy.name, scope, level)] = now
        reason = f"policy {policy.name}: {anomaly.fault_type} at level {anomaly.level.label} on {anomaly.entity}"
        actions = []
        for kind in kinds:
            target = action_target(kind, anomaly.entity)
            if target is None:
                continue
            action = Action(
                ts=now,
                kind=kind,
                target=target,
                incident_id=incident_id,
                reason=reason + step_note,
                params={
                    "policy": policy.name,
                    "anomaly": anomaly.id,
                    "fault_type": anomaly.fault_type,
                    "level": anomaly.level.label,
                    "escalation": level,
                },
            )
            if cooling:
                action.status = ActionStatus.SKIPPED
                action.result = f"cooldown: policy {policy.name} acted on {scope} {now - (last or now):.0f}s ago"
            actions.append(action)
        return actions
