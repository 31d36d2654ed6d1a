from __future__ import annotations

from pathlib import Path

import pytest

from vigil.model import ActionKind, ActionStatus, Anomaly, FaultLevel, VigilInputError
from vigil.remedy.policy import PolicyEngine, PolicySet, action_target, load_policies


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def anomaly(entity: str, fault_type: str, level: FaultLevel) -> Anomaly:
    return Anomaly(entity=entity, start=0, end=0, detector="test", fault_type=fault_type, level=level)


def test_default_policies_load_and_route_by_level_and_type() -> None:
    engine = PolicyEngine(load_policies(), clock=Clock())
    isolate = engine.plan(anomaly("gpu/n1/3", "xid_79", FaultLevel.ISOLATE))
    assert [(a.kind, a.target) for a in isolate] == [
        (ActionKind.CORDON, "node/n1"),
        (ActionKind.DRAIN, "node/n1"),
        (ActionKind.COLLECT_LOGS, "node/n1"),
    ]
    assert "xid_79" in isolate[0].reason and isolate[0].params["policy"] == "isolate-now"
    crash = engine.plan(anomaly("job/j7/rank/5", "rank_exit", FaultLevel.DRAIN))
    assert [(a.kind, a.target) for a in crash] == [(ActionKind.RESTART_JOB, "job/j7")]
    observe = engine.plan(anomaly("gpu/n2/0", "xid_13", FaultLevel.OBSERVE))
    assert [a.kind for a in observe] == [ActionKind.ALERT]
    assert engine.plan(anomaly("node/n3", "ok", FaultLevel.HEALTHY)) == []


def test_cooldown_skips_and_escalation_overrides() -> None:
    clock = Clock()
    engine = PolicyEngine(load_policies(), clock=clock)
    first = engine.plan(anomaly("gpu/n1/0", "xid_119", FaultLevel.DRAIN))
    assert [a.kind for a in first] == [ActionKind.CORDON, ActionKind.DRAIN]
    clock.now += 60
    # Second occurrence within 24h escalates to a reboot (a new escalation level, so no cooldown).
    second = engine.plan(anomaly("gpu/n1/1", "xid_119", FaultLevel.DRAIN))
    assert [(a.kind, a.status) for a in second] == [(ActionKind.REBOOT, ActionStatus.PROPOSED)]
    assert "escalation 1" in second[0].reason
    clock.now += 60
    third = engine.plan(anomaly("gpu/n1/1", "xid_119", FaultLevel.DRAIN))
    assert [a.kind for a in third] == [ActionKind.VENDOR_TICKET]
    clock.now += 60
    fourth = engine.plan(anomaly("gpu/n1/1", "xid_119", FaultLevel.DRAIN))
    assert [a.status for a in fourth] == [ActionStatus.SKIPPED]
    assert "cooldown" in fourth[0].result
    # Another node is independent.
    other = engine.plan(anomaly("gpu/n2/0", "xid_119", FaultLevel.DRAIN))
    assert [a.status for a in other] == [ActionStatus.PROPOSED, ActionStatus.PROPOSED]
    # After the cooldown and the escalation windows, the base actions come back.
    clock.now += 8 * 86400
    later = engine.plan(anomaly("gpu/n1/1", "xid_119", FaultLevel.DRAIN))
    assert [(a.kind, a.status) for a in later] == [
        (ActionKind.CORDON, ActionStatus.PROPOSED),
        (ActionKind.DRAIN, ActionStatus.PROPOSED),
    ]


def test_action_targets() -> None:
    assert action_target(ActionKind.RESET_GPU, "gpu/n1/2") == "gpu/n1/2"
    assert action_target(ActionKind.RESET_GPU, "node/n1") is None
    assert action_target(ActionKind.CORDON, "nic/n4/mlx5_0") == "node/n4"
    assert action_target(ActionKind.MIGRATE_JOB, "job/j1/rank/0") == "job/j1"
    assert action_target(ActionKind.ALERT, "switch/leaf1") == "switch/leaf1"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("policies: []", "policies"),
        ("policies: [{name: a, actions: [format_disk]}]", "actions"),
        ("policies: [{name: a, actions: [alert], match: {minLevel: apocalypse}}]", "bad fault level"),
        ("policies: [{name: a, actions: [alert], cooldown: soon}]", "bad duration"),
        ("policies: [{name: a, actions: [alert]}, {name: a, actions: [cordon]}]", "repeated: a"),
        ("policies: [{name: a, actions: [alert], typo: 1}]", "typo"),
        (
            "policies: [{name: a, actions: [alert], escalation: [{after: 3, actions: [reboot]}, "
            "{after: 2, actions: [cordon]}]}]",
            "increasing",
        ),
        ("- just a list", "expected a mapping"),
        ("policies: [unclosed", "not valid YAML"),
    ],
)
def test_bad_policy_files_get_one_line_errors(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "policies.yaml"
    path.write_text(text)
    with pytest.raises(VigilInputError, match=message) as err:
        load_policies(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)


def test_missing_policy_file() -> None:
    with pytest.raises(VigilInputError, match="does not exist"):
        load_policies("/nonexistent/policies.yaml")


def test_glob_fault_types_and_entity_kinds() -> None:
    policies = PolicySet.from_dict(
        {
            "policies": [
                {
                    "name": "nvlink",
                    "match": {"faultTypes": ["nvlink_*"], "entityKinds": ["gpu"]},
                    "actions": ["reset_gpu"],
                },
                {"name": "rest", "actions": ["alert"]},
            ]
        }
    )
    engine = PolicyEngine(policies, clock=Clock())
    assert [a.kind for a in engine.plan(anomaly("gpu/n1/1", "nvlink_crc", FaultLevel.DEGRADED))] == [
        ActionKind.RESET_GPU
    ]
    assert [a.kind for a in engine.plan(anomaly("node/n1", "nvlink_crc", FaultLevel.DEGRADED))] == [ActionKind.ALERT]
