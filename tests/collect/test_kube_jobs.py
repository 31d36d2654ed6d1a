"""Job placement from Kubernetes pods: a recorded PodList in the API server's JSON shape (tests/collect/
recorded_pods.py) decoded by the official client's own deserializer, then placed on the registered GPUs."""

from __future__ import annotations

import json
from pathlib import Path

from tests.collect.recorded_pods import FIXTURE, RecordedCoreApi, recorded_nodes
from vigil.model import Topology
from vigil.sources.collect.kube_jobs import KubernetesJobs


def test_pods_place_ranks_on_nodes_and_gpus() -> None:
    topology = Topology(nodes=recorded_nodes())
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
    for node in recorded_nodes():
        store.register_node(node)
    engine = Engine(store, settings, notifiers=[], kube_jobs=KubernetesJobs(RecordedCoreApi()))
    engine.tick()
    topology = store.topology()
    assert topology is not None and sorted(j.id for j in topology.jobs) == ["eval", "llama-ft"]
    version = store.topology_version()
    engine._next_kube = 0.0
    engine.tick()
    assert store.topology_version() == version  # the same pods: no new version
