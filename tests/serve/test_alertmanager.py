"""Alertmanager webhook payloads (version 4) into events."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from vigil.faces.api.alertmanager import alert_entity, alerts_to_events, parse_payload
from vigil.model import FaultLevel, VigilInputError

# The shape of alertmanager notify/webhook/webhook.go's Message (v0.34: notification_reason, routeLabels).
PAYLOAD: dict[str, Any] = {
    "version": "4",
    "groupKey": '{}:{alertname="GpuXid"}',
    "truncatedAlerts": 0,
    "status": "firing",
    "receiver": "vigil",
    "groupLabels": {"alertname": "GpuXid"},
    "commonLabels": {"alertname": "GpuXid", "severity": "critical"},
    "commonAnnotations": {},
    "externalURL": "http://alertmanager:9093",
    "notification_reason": "new alerts",
    "routeLabels": {"team": "infra"},
    "alerts": [
        {
            "status": "firing",
            "labels": {"Hostname": "n003", "gpu": "5", "xid": "79"},
            "annotations": {"summary": "GPU has fallen off the bus"},
            "startsAt": "2026-01-01T00:10:00.000Z",
            "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "http://prometheus:9090/graph?g0.expr=...",
            "fingerprint": "a1b2c3",
        },
        {
            "status": "resolved",
            "labels": {"instance": "n004:9400", "severity": "warning"},
            "annotations": {"description": "thermal throttling"},
            "startsAt": "2026-01-01T00:00:00Z",
            "endsAt": "2026-01-01T00:05:00Z",
            "fingerprint": "d4e5f6",
            "futureField": {"nested": True},
        },
    ],
}


def test_payload_with_unknown_fields_becomes_events() -> None:
    events = alerts_to_events(parse_payload(PAYLOAD))
    assert [e.entity for e in events] == ["gpu/n003/5", "node/n004"]
    firing, resolved = events
    assert firing.kind == "alert_firing" and firing.level is FaultLevel.ISOLATE
    assert firing.message == "GpuXid: GPU has fallen off the bus"
    assert firing.attrs["labels"]["xid"] == "79" and firing.attrs["fingerprint"] == "a1b2c3"
    assert firing.ts == pytest.approx(1767226200.0)
    assert resolved.kind == "alert_resolved" and resolved.level is FaultLevel.HEALTHY
    assert resolved.ts == pytest.approx(1767225900.0)  # stamped with its end


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda p: p.update(version="3"), "version"),
        (lambda p: p.pop("alerts"), "alerts"),
        (lambda p: p["alerts"][0].update(status="exploded"), "status"),
        (lambda p: p["alerts"][0].update(startsAt="yesterday"), "startsAt"),
    ],
)
def test_bad_payload_is_one_clear_error(mutate: Any, message: str) -> None:
    payload = copy.deepcopy(PAYLOAD)
    mutate(payload)
    with pytest.raises(VigilInputError, match=message) as info:
        parse_payload(payload)
    assert "\n" not in str(info.value)


def test_entity_falls_back_to_job_then_cluster() -> None:
    assert alert_entity({"job_id": "j7"}) == "job/j7"
    assert alert_entity({"Hostname": "bad host;rm -rf"}, cluster="c1") == "cluster/c1"
    assert alert_entity({}) == "cluster/vigil"
