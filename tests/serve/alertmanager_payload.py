"""An Alertmanager webhook notification (version 4) in Alertmanager's own JSON shape: one firing alert with an Xid,
one resolved thermal warning, for the server tests that receive alerts."""

from __future__ import annotations

from typing import Any

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
