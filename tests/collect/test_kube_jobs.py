"""Job placement from Kubernetes pods: a PodList in the API server's JSON shape (tests/fixtures/collect/
training_pods.json, written after the Kubeflow training operator's PyTorchJob pods - no API server runs here)
decoded by the official client's own deserializer, then placed on the registered GPUs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kubernetes.client import ApiClient, V1PodList

from vigil.model import Gpu, Node, Topology
from vigil.sources.collect.kube_jobs import KubernetesJobs

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


def test_pods_place_ranks_on_nodes_and_gpus() -> None:
    topology = Topology(nodes=[Node(name=n, gpus=[Gpu(node=n, index=i) for i in range(8)])
                               for n in ("n01", "n02", "n03")])
    api = RecordedCoreApi()
    jobs = {j.id: j for j in KubernetesJobs(api).jobs(topology)}
    assert json.loads(FIXTURE.read_text())["kind"] == "PodList"
    # master first (ranks 0-7 on n01), then worker 0 (ranks 8-15 on n02); the pending worker has no node yet
    assert jobs["llama-ft"].placement == [f"gpu/n01/{i}" for i in range(8)] + [f"gpu/n02/{i}" for i in range(8)]
    # two 2-GPU pods on one node share it without overlap
    assert jobs["eval"].placement == ["gpu/n03/0", "gpu/n03/1", "gpu/n03/2", "gpu/n03/3"]
    assert "training.kubeflow.org/job-name" in api.selectors and "vigil.io/job" in api.selectors


def test_engine_keeps_the_topology_jobs_from_pods(tmp_path: Path) -> None:
    from vigil.config import Settings
    from vigil.run.engine import Engine
    from vigil.store.sql import Store

    settings = Settings(home=tmp_path, kube_jobs_poll_s=30)
    store = Store(settings.database_url())
    for name in ("n01", "n02", "n03"):
        store.register_node(Node(name=name, gpus=[Gpu(node=name, index=i) for i in range(8)]))
    engine = Engine(store, settings, notifiers=[], kube_jobs=KubernetesJobs(RecordedCoreApi()))
    engine.tick()
    topology = store.topology()
    assert topology is not None and sorted(j.id for j in topology.jobs) == ["eval", "llama-ft"]
    version = store.topology_version()
    engine._next_kube = 0.0
    engine.tick()
    assert store.topology_version() == version  # the same pods: no new version
