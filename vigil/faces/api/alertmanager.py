"""Alertmanager webhook receiver: payload version 4 turned into Vigil events.

The payload (prometheus/alertmanager notify/webhook/webhook.go, template/template.go) is read leniently:
unknown fields are kept out of the way rather than rejected, because Alertmanager adds keys over versions
(``notification_reason`` from v0.32, ``routeLabels`` from v0.34). What an event is about comes from the
alert's labels: ``Hostname``/``hostname``/``node``/``instance`` name the node, ``gpu`` the GPU index,
``job_id`` a training job (Prometheus' own ``job`` label is the scrape job, not a training job).
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vigil.model import Event, FaultLevel, VigilInputError, describe_validation_error, gpu_id, job_id, node_id

SUPPORTED_VERSION = "4"
_NAME_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-]*$")
_SEVERITY_LEVELS = {
    "critical": FaultLevel.ISOLATE,
    "page": FaultLevel.ISOLATE,
    "error": FaultLevel.DRAIN,
    "major": FaultLevel.DRAIN,
    "warning": FaultLevel.DEGRADED,
    "minor": FaultLevel.DEGRADED,
    "info": FaultLevel.OBSERVE,
    "none": FaultLevel.OBSERVE,
}


class Alert(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    status: Literal["firing", "resolved"]
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    starts_at: datetime = Field(alias="startsAt")
    ends_at: datetime | None = Field(default=None, alias="endsAt")
    generator_url: str = Field(default="", alias="generatorURL")
    fingerprint: str = ""


class AlertmanagerPayload(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    version: str
    group_key: str = Field(default="", alias="groupKey")
    truncated_alerts: int = Field(default=0, alias="truncatedAlerts")
    status: Literal["firing", "resolved"]
    receiver: str = ""
    group_labels: dict[str, str] = Field(default_factory=dict, alias="groupLabels")
    common_labels: dict[str, str] = Field(default_factory=dict, alias="commonLabels")
    common_annotations: dict[str, str] = Field(default_factory=dict, alias="commonAnnotations")
    external_url: str = Field(default="", alias="externalURL")
    alerts: list[Alert]


def parse_payload(data: Any) -> AlertmanagerPayload:
    """Validate a webhook body; a wrong version or a malformed alert is one clear error."""
    if not isinstance(data, dict):
        raise VigilInputError("alertmanager payload: expected a JSON object")
    try:
        payload = AlertmanagerPayload.model_validate(data)
    except ValidationError as err:
        raise VigilInputError(f"alertmanager payload: {describe_validation_error(err)}") from None
    if payload.version != SUPPORTED_VERSION:
        raise VigilInputError(
            f"alertmanager payload: field 'version' is {payload.version!r}; this receiver reads version 4"
        )
    return payload


def _host(labels: dict[str, str]) -> str | None:
    for key in ("Hostname", "hostname", "node", "nodename", "instance"):
        value = labels.get(key)
        if value:
            host = value.split(":", 1)[0] if key == "instance" else value
            if _NAME_OK.match(host):
                return host
    return None


def alert_entity(labels: dict[str, str], cluster: str = "vigil") -> str:
    """The most specific entity an alert's labels name; the cluster when they name none."""
    host = _host(labels)
    gpu = labels.get("gpu", "")
    if host and gpu.isdigit():
        return gpu_id(host, int(gpu))
    if host:
        return node_id(host)
    job = labels.get("job_id", "")
    if job and _NAME_OK.match(job):
        return job_id(job)
    return f"cluster/{cluster}"


def alert_level(labels: dict[str, str], status: str) -> FaultLevel:
    if status == "resolved":
        return FaultLevel.HEALTHY
    return _SEVERITY_LEVELS.get(labels.get("severity", "").lower(), FaultLevel.OBSERVE)


def alerts_to_events(payload: AlertmanagerPayload, cluster: str = "vigil") -> list[Event]:
    """One event per alert, kind ``alert_firing`` / ``alert_resolved``, stamped with its start (or end)."""
    events = []
    for alert in payload.alerts:
        labels = {**payload.common_labels, **alert.labels}
        annotations = {**payload.common_annotations, **alert.annotations}
        ended = alert.status == "resolved" and alert.ends_at is not None and alert.ends_at.year > 1
        ts = (alert.ends_at if ended and alert.ends_at else alert.starts_at).timestamp()
        name = labels.get("alertname", "alert")
        message = annotations.get("summary") or annotations.get("description") or name
        events.append(
            Event(
                ts=ts,
                entity=alert_entity(labels, cluster),
                kind=f"alert_{alert.status}",
                source="alertmanager",
                message=f"{name}: {message}"[:8192],
                level=alert_level(labels, alert.status),
                attrs={
                    "alertname": name,
                    "labels": labels,
                    "annotations": annotations,
                    "fingerprint": alert.fingerprint,
                    "group_key": payload.group_key,
                    "receiver": payload.receiver,
                    "generator_url": alert.generator_url,
                },
            )
        )
    return events
