"""Kubernetes node conditions and node events, through the official ``kubernetes`` client.

Only inside a cluster (``KUBERNETES_SERVICE_HOST`` set, service-account token mounted): the DaemonSet's
ClusterRole allows ``get nodes`` and ``list events``. The API object is a constructor argument so tests
feed real ``kubernetes.client`` model objects (V1Node, CoreV1Event) through a recording stand-in; no API
server runs on the development machine.

Conditions become points ``vigil_node_condition{condition=...}`` (1 = the condition holds), which stays low
cardinality because condition types are a fixed, small set per cluster. A condition turning bad becomes an
event of kind ``k8s`` (Ready False/Unknown -> reason NodeNotReady; pressure, NetworkUnavailable, and
NVSentinel / node-problem-detector conditions such as GpuXidError -> reason = the condition type). Warning
events about the node become ``k8s`` events with their own reason, each reported once, and so does the node
lifecycle controller's NodeNotReady (a Normal event that means the node is lost).

``decode_event`` reads one Event object in the API's own JSON (``involvedObject``, ``reason``, ``message``,
``type``, ``firstTimestamp`` ...): the client's model objects are serialised to it first, and any other
source of raw Event objects (a recorded ``kubectl get events -o json``, the fake cluster of ``vigil demo``)
goes through the same function.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from vigil.model import Event, FaultLevel, node_id
from vigil.sources.collect.base import Collection, Source, default_node_name
from vigil.sources.collect.kube_client import kube_api_client

# Condition types whose "True" is the healthy state; every other type is a problem when True.
HEALTHY_WHEN_TRUE = {"Ready"}
PRESSURE = {"MemoryPressure", "DiskPressure", "PIDPressure"}
SEEN_EVENTS_KEPT = 4096
# Normal events that still say a node is in trouble: the node lifecycle controller writes NodeNotReady as Normal.
NODE_TROUBLE_REASONS = {"NodeNotReady"}


def in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def _timestamp(value: datetime | None, default: float) -> float:
    return value.timestamp() if value is not None else default


def _api_timestamp(value: object, default: float) -> float:
    """An API timestamp (RFC 3339, ``2026-03-02T10:04:05Z``) as epoch seconds; ``default`` when absent or bad."""
    if not isinstance(value, str) or not value:
        return default
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return default


def event_key(raw: Mapping[str, Any]) -> str:
    """One occurrence of an Event object: its uid and count (the API bumps ``count`` when it happens again)."""
    metadata = raw.get("metadata") or {}
    return f"{metadata.get('uid') or metadata.get('name')}/{raw.get('count') or 1}"


def decode_event(raw: Mapping[str, Any], now: float) -> Event | None:
    """A ``k8s`` event on the node an Event object is about; None for events about other objects and for
    routine Normal events."""
    involved = raw.get("involvedObject") or {}
    reason = str(raw.get("reason") or "")
    if involved.get("kind") != "Node" or not involved.get("name"):
        return None
    if raw.get("type") != "Warning" and reason not in NODE_TROUBLE_REASONS:
        return None
    source = raw.get("source") or {}
    return Event(
        ts=_api_timestamp(raw.get("lastTimestamp") or raw.get("eventTime") or raw.get("firstTimestamp"), now),
        entity=node_id(str(involved["name"])),
        kind="k8s",
        source="kubernetes",
        level=FaultLevel.OBSERVE,
        message=f"{reason}: {raw.get('message') or ''}"[:8192],
        attrs={"reason": reason, "count": raw.get("count") or 1, "component": source.get("component") or ""},
    )


class KubernetesSource(Source):
    name = "kubernetes"
    kind = "kube"

    def __init__(self, node: str | None = None, api: Any = None, lookback_s: float = 3600.0) -> None:
        super().__init__()
        self.node = node or default_node_name()
        self._api = api
        self.lookback_s = lookback_s
        self._bad: dict[str, bool] = {}
        self._seen: deque[str] = deque(maxlen=SEEN_EVENTS_KEPT)
        self._seen_set: set[str] = set()
        self._started: float | None = None

    def _core(self) -> Any:
        if self._api is None:
            from kubernetes import client

            self._api = client.CoreV1Api(kube_api_client())
        return self._api

    def collect(self, now: float) -> Collection:
        out = Collection(status=f"Kubernetes node {self.node}")
        if self._started is None:
            self._started = now
        try:
            api = self._core()
            node = api.read_node(self.node, _request_timeout=10)
            events = api.list_event_for_all_namespaces(
                field_selector=f"involvedObject.kind=Node,involvedObject.name={self.node}",
                _request_timeout=10,
            )
        except Exception as err:  # the client raises ApiException, urllib3 and config errors alike
            self.problems.report("api", f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
            out.status = f"Kubernetes API unavailable ({type(err).__name__})"
            return out
        self._conditions(out, now, node)
        self._events(out, now, events.items or [])
        return out

    def _conditions(self, out: Collection, now: float, node: Any) -> None:
        entity = node_id(self.node)
        out.add("vigil_node_unschedulable", entity, int(bool(node.spec and node.spec.unschedulable)))
        for condition in (node.status.conditions if node.status else None) or []:
            kind = condition.type
            holds = condition.status == "True"
            bad = (condition.status != "True") if kind in HEALTHY_WHEN_TRUE else holds
            out.add("vigil_node_condition", entity, int(holds), condition=kind)
            if kind == "Ready":
                out.add("vigil_node_kubelet_ready", entity, int(holds))
            if bad and not self._bad.get(kind, False):
                out.events.append(self._condition_event(now, entity, condition))
            self._bad[kind] = bad

    def _condition_event(self, now: float, entity: str, condition: Any) -> Event:
        """Kind "k8s" like every Kubernetes fact; ``reason`` NodeNotReady for Ready (the node controller's own
        reason for it, which the rule detector reads), else the condition type; ``signature`` says which."""
        kind = condition.type
        if kind == "Ready":
            signature, reason, level = "kubelet_down", "NodeNotReady", FaultLevel.DRAIN
        elif kind in PRESSURE:
            signature, reason, level = "node_pressure", kind, FaultLevel.DEGRADED
        elif kind == "NetworkUnavailable":
            signature, reason, level = "node_network_unavailable", kind, FaultLevel.DRAIN
        else:
            signature, reason, level = "node_condition", kind, FaultLevel.DEGRADED
        return Event(
            ts=_timestamp(condition.last_transition_time, now),
            entity=entity,
            kind="k8s",
            source="kubernetes",
            level=level,
            message=f"{kind}={condition.status}: {condition.reason or ''} {condition.message or ''}".strip(),
            attrs={
                "signature": signature,
                "reason": reason,
                "condition": kind,
                "status": condition.status,
                "condition_reason": condition.reason or "",
            },
        )

    def _events(self, out: Collection, now: float, items: list[Any]) -> None:
        not_before = (self._started or now) - self.lookback_s
        serialise = None
        for item in items:
            if not isinstance(item, Mapping):
                if serialise is None:
                    from kubernetes.client import ApiClient

                    serialise = ApiClient().sanitize_for_serialization
                item = serialise(item)
            key = event_key(item)
            if key in self._seen_set:
                continue
            event = decode_event(item, now)
            if event is None or event.ts < not_before:
                continue
            if len(self._seen) == self._seen.maxlen:
                self._seen_set.discard(self._seen[0])
            self._seen.append(key)
            self._seen_set.add(key)
            out.events.append(event)
