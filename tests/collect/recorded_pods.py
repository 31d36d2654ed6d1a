"""The Kubernetes pods the job-placement tests read: a PodList in the API server's JSON shape
(tests/fixtures/collect/training_pods.json, written after the Kubeflow training operator's PyTorchJob pods - no API
server runs here), served by a stand-in for the official client's CoreV1Api, and the nodes the pods run on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubernetes.client import ApiClient, V1PodList

from vigil.model import Gpu, Node

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "collect" / "training_pods.json"


class RecordedCoreApi:
    """Answers list_pod_for_all_namespaces from the recorded PodList, filtered by the label asked for."""

    def __init__(self) -> None:
        self.pods: V1PodList = ApiClient().deserialize(FIXTURE.read_text(), "V1PodList", "application/json")
        self.selectors: list[str] = []

    def list_pod_for_all_namespaces(self, label_selector: str, _request_timeout: float) -> V1PodList:
        self.selectors.append(label_selector)
        items: list[Any] = [p for p in self.pods.items if label_selector in (p.metadata.labels or {})]
        return V1PodList(items=items)


def recorded_nodes() -> list[Node]:
    """The nodes the recorded pods are placed on: n01 to n03, 8 GPUs each."""
    return [Node(name=name, gpus=[Gpu(node=name, index=i) for i in range(8)]) for name in ("n01", "n02", "n03")]
