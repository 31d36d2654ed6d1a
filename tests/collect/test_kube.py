"""Kubernetes node conditions and events, with real kubernetes.client model objects (no API server here)."""

from __future__ import annotations

from datetime import UTC, datetime

from kubernetes.client import (
    ApiClient,
    CoreV1Event,
    CoreV1EventList,
    V1EventSource,
    V1Node,
    V1NodeCondition,
    V1NodeSpec,
    V1NodeStatus,
    V1ObjectMeta,
    V1ObjectReference,
)
from kubernetes.client.exceptions import ApiException

from vigil.model import FaultLevel
from vigil.sources.collect.kube import KubernetesSource, decode_event

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


class RecordingCoreApi:
    """Answers read_node / list_event_for_all_namespaces like CoreV1Api and records the selectors asked."""

    def __init__(self) -> None:
        self.conditions = [V1NodeCondition(type="Ready", status="True", last_transition_time=T0)]
        self.unschedulable = False
        self.events: list[CoreV1Event] = []
        self.selectors: list[str] = []
        self.fail = False

    def read_node(self, name: str, _request_timeout: float) -> V1Node:
        if self.fail:
            raise ApiException(status=503, reason="Service Unavailable")
        return V1Node(
            metadata=V1ObjectMeta(name=name),
            spec=V1NodeSpec(unschedulable=self.unschedulable),
            status=V1NodeStatus(conditions=self.conditions),
        )

    def list_event_for_all_namespaces(self, field_selector: str, _request_timeout: float) -> CoreV1EventList:
        self.selectors.append(field_selector)
        return CoreV1EventList(items=self.events)


def event(uid: str, reason: str, kind: str = "Warning", count: int = 1) -> CoreV1Event:
    return CoreV1Event(
        metadata=V1ObjectMeta(name=f"n01.{uid}", uid=uid),
        involved_object=V1ObjectReference(kind="Node", name="n01"),
        reason=reason,
        message="details",
        type=kind,
        count=count,
        last_timestamp=T0,
        source=V1EventSource(component="kubelet"),
    )


def test_conditions_become_points_and_bad_transitions_events() -> None:
    api = RecordingCoreApi()
    source = KubernetesSource(node="n01", api=api)
    out = source.collect(T0.timestamp())
    assert {(p.metric, p.labels): p.value for p in out.points}[("vigil_node_condition", (("condition", "Ready"),))] == 1
    assert out.events == []
    assert api.selectors == ["involvedObject.kind=Node,involvedObject.name=n01"]
    api.conditions = [
        V1NodeCondition(type="Ready", status="Unknown", reason="NodeStatusUnknown", last_transition_time=T0),
        V1NodeCondition(type="DiskPressure", status="True", last_transition_time=T0),
        V1NodeCondition(type="GpuXidError", status="True", reason="Xid79", last_transition_time=T0),
    ]
    events = source.collect(T0.timestamp() + 10).events
    assert [(e.kind, e.attrs["reason"], e.attrs["signature"], e.level) for e in events] == [
        ("k8s", "NodeNotReady", "kubelet_down", FaultLevel.DRAIN),
        ("k8s", "DiskPressure", "node_pressure", FaultLevel.DEGRADED),
        ("k8s", "GpuXidError", "node_condition", FaultLevel.DEGRADED),
    ]
    assert source.collect(T0.timestamp() + 20).events == []


def test_warning_events_reported_once_and_normal_ones_ignored() -> None:
    api = RecordingCoreApi()
    api.events = [event("a", "NodeNotReady"), event("b", "Starting", kind="Normal")]
    source = KubernetesSource(node="n01", api=api)
    first = source.collect(T0.timestamp())
    assert [(e.kind, e.attrs["reason"]) for e in first.events] == [("k8s", "NodeNotReady")]
    assert source.collect(T0.timestamp()).events == []
    api.events = [event("a", "NodeNotReady", count=2)]
    assert len(source.collect(T0.timestamp()).events) == 1  # the same event happening again


def test_api_errors_are_counted_not_raised() -> None:
    api = RecordingCoreApi()
    api.fail = True
    source = KubernetesSource(node="n01", api=api)
    out = source.collect(0.0)
    assert "unavailable" in out.status and source.problems.counts["api"] == 1


def test_outside_a_cluster_the_real_client_fails_cleanly(monkeypatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    source = KubernetesSource(node="n01")
    out = source.collect(0.0)
    assert "unavailable" in out.status and source.problems.counts["api"] == 1


def test_raw_event_objects_decode_as_the_client_objects_do() -> None:
    # The node lifecycle controller's NodeNotReady is a Normal event in the API's JSON; it still means trouble.
    lost = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "n07.17c2a", "namespace": "default",
                                                              "uid": "5d1e"},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": "n07", "uid": "n07"},
            "reason": "NodeNotReady", "message": "Node n07 status is now: NodeNotReady",
            "source": {"component": "node-controller"}, "firstTimestamp": "2026-03-02T10:04:05Z",
            "lastTimestamp": "2026-03-02T10:04:05Z", "count": 1, "type": "Normal"}
    decoded = decode_event(lost, now=0.0)
    assert decoded is not None
    assert (decoded.entity, decoded.kind, decoded.attrs["reason"], decoded.attrs["component"]) == (
        "node/n07", "k8s", "NodeNotReady", "node-controller")
    assert decoded.ts == datetime(2026, 3, 2, 10, 4, 5, tzinfo=UTC).timestamp()
    pod = {**lost, "involvedObject": {"kind": "Pod", "name": "trainer-0", "namespace": "ml"}, "type": "Warning",
           "reason": "BackOff"}
    assert decode_event(pod, now=0.0) is None  # the node source reads events about nodes only
    assert decode_event({**lost, "reason": "Starting"}, now=0.0) is None
    api = RecordingCoreApi()
    api.events = [event("a", "NodeNotReady")]
    from_client = KubernetesSource(node="n01", api=api).collect(T0.timestamp()).events
    assert from_client == [decode_event(ApiClient().sanitize_for_serialization(api.events[0]), now=0.0)]
