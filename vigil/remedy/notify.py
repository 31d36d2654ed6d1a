"""Tell people about incidents: Alertmanager's API v2 (``POST /api/v2/alerts``) and a Slack-compatible webhook.

An incident is one Alertmanager alert whose labels (alertname, severity, node, gpu, nic, fault, incident) stay
the same for its whole life, so Alertmanager deduplicates repeats and groups and routes it like any other
alert. Alertmanager resolves an alert on its own once ``endsAt`` passes, so an open incident is re-sent
before that (``repeat_s``) and a resolved one is sent once with ``endsAt`` set to when it ended.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Protocol

import httpx

from vigil.model import FaultLevel, Incident, IncidentStatus, parse_entity

log = logging.getLogger("vigil.notify")

ALERT_NAME = "VigilIncident"
SEVERITY = {
    FaultLevel.OBSERVE: "info",
    FaultLevel.DEGRADED: "warning",
    FaultLevel.DRAIN: "error",
    FaultLevel.ISOLATE: "critical",
}


class Notifier(Protocol):
    name: str

    def send(self, incidents: Sequence[Incident], now: float) -> None: ...


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat().replace("+00:00", "Z")


def incident_labels(incident: Incident) -> dict[str, str]:
    """Few, bounded labels (never the title or a timestamp): what the incident is about and how bad."""
    labels = {
        "alertname": ALERT_NAME,
        "severity": SEVERITY.get(incident.level, "info"),
        "fault": incident.fault_types[0] if incident.fault_types else "unknown",
        "incident": incident.id,
    }
    kind, parts = parse_entity(incident.scope)
    if kind in ("node", "gpu", "nic"):
        labels["node"] = parts[0]
    if kind == "gpu":
        labels["gpu"] = parts[1]
    elif kind == "nic":
        labels["nic"] = parts[1]
    elif kind in ("job", "rank"):
        labels["job_id"] = parts[0]
    elif kind == "switch":
        labels["switch"] = parts[0]
    return labels


class AlertmanagerNotifier:
    """Pushes incidents to Alertmanager's API v2; ``resend_s`` must stay below its ``resolve_timeout``."""

    name = "alertmanager"

    def __init__(self, url: str, external_url: str = "", timeout_s: float = 5.0, resend_s: float = 60.0) -> None:
        self.url = url.rstrip("/") + "/api/v2/alerts"
        self.external_url = external_url.rstrip("/")
        self.resend_s = resend_s
        self._client = httpx.Client(timeout=timeout_s)

    def alert(self, incident: Incident, now: float) -> dict[str, object]:
        body: dict[str, object] = {
            "labels": incident_labels(incident),
            "annotations": {"summary": incident.title, "entities": ", ".join(incident.entities[:20])},
            "startsAt": _iso(incident.start),
        }
        if incident.status is IncidentStatus.RESOLVED:
            body["endsAt"] = _iso(max(incident.end, incident.start))
        else:
            # Open: valid until the next re-send (plus slack); Alertmanager resolves it if Vigil goes quiet.
            body["endsAt"] = _iso(now + 3 * self.resend_s)
        if self.external_url:
            body["generatorURL"] = f"{self.external_url}/incidents/{incident.id}"
        return body

    def send(self, incidents: Sequence[Incident], now: float) -> None:
        if not incidents:
            return
        response = self._client.post(self.url, json=[self.alert(i, now) for i in incidents])
        response.raise_for_status()


class WebhookNotifier:
    """A Slack-compatible incoming webhook: one ``{"text": ...}`` message per new or resolved incident."""

    name = "webhook"

    def __init__(self, url: str, external_url: str = "", timeout_s: float = 5.0) -> None:
        self.url = url
        self.external_url = external_url.rstrip("/")
        self.resend_s = float("inf")
        self._client = httpx.Client(timeout=timeout_s)

    def text(self, incident: Incident) -> str:
        state = "resolved" if incident.status is IncidentStatus.RESOLVED else incident.level.label
        link = f" <{self.external_url}/incidents/{incident.id}|{incident.id}>" if self.external_url else ""
        return f"[{state}] {incident.title}{link}"

    def send(self, incidents: Sequence[Incident], now: float) -> None:
        for incident in incidents:
            self._client.post(self.url, json={"text": self.text(incident)}).raise_for_status()
