"""The Kubernetes actuator through the official client against a local fake API server."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from tests.remedy.kube_server import FakeKube, serve
from vigil.model import Action, ActionKind, ActionStatus, Node, Topology
from vigil.remedy.actuators.base import ActuatorError
from vigil.remedy.actuators.kubernetes import KubernetesActuator, condition_and_taint
from vigil.remedy.audit import AuditLog
from vigil.remedy.guard import BlastRadiusGuard
from vigil.remedy.lifecycle import LifecycleStore, NodeState
from vigil.remedy.remediator import Remediator


@pytest.fixture
def kube() -> Iterator[tuple[FakeKube, KubernetesActuator]]:
    fake = FakeKube()
    for name in ("n1", "n2"):
        fake.add_node(name)
    fake.add_pod("ml-training", "trainer-0", "n1")
    fake.add_pod("ml-training", "trainer-1", "n1")
    fake.add_pod("kube-system", "kube-proxy-x", "n1")
    fake.add_pod("monitoring", "dcgm-exporter-x", "n1", owner_kind="DaemonSet")
    fake.add_pod("ml-training", "trainer-2", "n2")
    fake.pdb_protected.add(("ml-training", "trainer-1"))
    with serve(fake) as url:
        configuration = client.Configuration(host=url)
        yield fake, KubernetesActuator(client.ApiClient(configuration))


def action(kind: ActionKind, node: str = "n1", fault: str = "xid_79") -> Action:
    return Action(
        ts=0.0,
        kind=kind,
        target=f"node/{node}",
        reason="GPU fell off the bus",
        params={"fault_type": fault, "level": "isolate"},
    )


def test_cordon_sets_flag_nvsentinel_taint_condition_and_label(
    kube: tuple[FakeKube, KubernetesActuator],
) -> None:
    fake, actuator = kube
    assert not actuator.is_satisfied(action(ActionKind.CORDON))
    actuator.execute(action(ActionKind.CORDON))
    node = fake.nodes["n1"]
    assert node["spec"]["unschedulable"] is True
    assert {"key": "nvidia.com/gpu-xid-error", "value": "true", "effect": "NoSchedule"} in node["spec"]["taints"]
    condition = next(c for c in node["status"]["conditions"] if c["type"] == "SysLogsXIDError")
    assert condition["status"] == "True" and "RecommendedAction:" in condition["message"]
    assert any(c["type"] == "Ready" for c in node["status"]["conditions"])  # merged by type, not replaced
    assert node["metadata"]["labels"]["vigil.dev/state"] == "cordoned"
    assert actuator.is_satisfied(action(ActionKind.CORDON))
    patch_types = {method for method, path, _ in fake.requests if path.startswith("/api/v1/nodes/n1")}
    assert patch_types == {"GET", "PATCH"}

    actuator.execute(action(ActionKind.UNCORDON))
    assert fake.nodes["n1"]["spec"]["unschedulable"] is False
    assert fake.nodes["n1"]["spec"]["taints"] == []
    cleared = next(c for c in fake.nodes["n1"]["status"]["conditions"] if c["type"] == "SysLogsXIDError")
    assert cleared["status"] == "False"


def test_drain_evicts_and_respects_pod_disruption_budgets(kube: tuple[FakeKube, KubernetesActuator]) -> None:
    fake, actuator = kube
    result = actuator.execute(action(ActionKind.DRAIN))
    assert "evicted 1" in result and "ml-training/trainer-1" in result and "kept 2" in result
    remaining = {p["metadata"]["name"] for p in fake.pods if p["spec"]["nodeName"] == "n1"}
    assert remaining == {"trainer-1", "kube-proxy-x", "dcgm-exporter-x"}
    evictions = [path for method, path, _ in fake.requests if path.endswith("/eviction")]
    assert len(evictions) == 2  # never the system or DaemonSet pods; never a DELETE
    assert not any(method == "DELETE" for method, _, _ in fake.requests)


def test_reboot_creates_one_janitor_cr(kube: tuple[FakeKube, KubernetesActuator]) -> None:
    fake, actuator = kube
    assert not actuator.is_satisfied(action(ActionKind.REBOOT))
    actuator.execute(action(ActionKind.REBOOT))
    assert fake.reboots["vigil-reboot-n1"]["spec"]["nodeName"] == "n1"
    assert actuator.is_satisfied(action(ActionKind.REBOOT))


def test_remediator_dry_run_by_default_then_idempotent_live(
    kube: tuple[FakeKube, KubernetesActuator], tmp_path: Path
) -> None:
    fake, actuator = kube
    audit = AuditLog(f"sqlite:///{tmp_path}/r.db")
    lifecycle = LifecycleStore(f"sqlite:///{tmp_path}/r.db")
    topology = Topology(nodes=[Node(name="n1", switch="s1"), Node(name="n2", switch="s1")])
    guard = BlastRadiusGuard(topology, lifecycle, max_share=0.5, max_share_per_switch=0.5)
    dry = Remediator([actuator], audit, lifecycle=lifecycle, guard=guard)
    proposed = dry.execute(action(ActionKind.CORDON))
    assert proposed.status is ActionStatus.PROPOSED and proposed.dry_run
    assert "would cordon node n1" in proposed.result
    assert "unschedulable" not in fake.nodes["n1"]["spec"]

    live = Remediator(
        [actuator],
        audit,
        lifecycle=lifecycle,
        guard=BlastRadiusGuard(topology, lifecycle, max_share=0.5),
        dry_run=False,
    )
    first = live.execute(action(ActionKind.CORDON))
    second = live.execute(action(ActionKind.CORDON))
    assert (first.status, second.status) == (ActionStatus.EXECUTED, ActionStatus.SKIPPED)
    assert lifecycle.status("node/n1").state is NodeState.CORDONED
    refused = live.execute(action(ActionKind.CORDON, node="n2"))
    assert refused.status is ActionStatus.REFUSED and "blast radius" in refused.result
    assert "unschedulable" not in fake.nodes["n2"]["spec"]
    assert [a.status for a in audit.actions()] == [
        ActionStatus.PROPOSED,
        ActionStatus.EXECUTED,
        ActionStatus.SKIPPED,
        ActionStatus.REFUSED,
    ]


def test_api_errors_become_failed_actions(kube: tuple[FakeKube, KubernetesActuator], tmp_path: Path) -> None:
    _, actuator = kube
    live = Remediator([actuator], AuditLog(f"sqlite:///{tmp_path}/r.db"), dry_run=False)
    failed = live.execute(action(ActionKind.CORDON, node="ghost"))
    assert failed.status is ActionStatus.FAILED and "HTTP 404" in failed.result


def test_fault_types_map_to_nvsentinel_conditions() -> None:
    assert condition_and_taint("nvlink_crc_storm") == ("GpuNvlinkWatch", "nvidia.com/gpu-nvlink-error")
    assert condition_and_taint("ecc_dbe") == ("GpuMemWatch", "nvidia.com/gpu-error")
    assert condition_and_taint("something_new") == ("DCGMError", "nvidia.com/gpu-error")


def test_drain_held_by_a_budget_is_retried(kube: tuple[FakeKube, KubernetesActuator], tmp_path: Path) -> None:
    fake, actuator = kube
    url = f"sqlite:///{tmp_path}/r.db"
    lifecycle = LifecycleStore(url)
    live = Remediator([actuator], AuditLog(url), lifecycle=lifecycle, dry_run=False)
    first = live.execute(action(ActionKind.DRAIN))
    assert first.status is ActionStatus.EXECUTED and "blocked by PodDisruptionBudget" in first.result
    assert lifecycle.status("node/n1").state is NodeState.DRAINING
    fake.pdb_protected.clear()  # the budget allows it now (e.g. a replacement pod became ready)
    second = live.execute(action(ActionKind.DRAIN))
    assert second.status is ActionStatus.EXECUTED and "evicted 1" in second.result and "blocked" not in second.result
    assert {p["metadata"]["name"] for p in fake.pods if p["spec"]["nodeName"] == "n1"} == {
        "kube-proxy-x",
        "dcgm-exporter-x",
    }


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
AFTER_START = dt.datetime(2026, 12, 1, 7, 0, tzinfo=dt.UTC).timestamp()  # the recorded pods started at 06:00


@pytest.fixture
def training(kube: tuple[FakeKube, KubernetesActuator]) -> tuple[FakeKube, KubernetesActuator]:
    """The fake cluster with a two-node PyTorchJob (master on n1, worker on n2) and a batch/v1 Job's pods."""
    fake, actuator = kube
    for pod in json.loads((FIXTURES / "remedy" / "kube" / "pytorchjob-pods.json").read_text()):
        fake.add_pod_object(pod)
    for pod in json.loads((FIXTURES / "tide" / "kube" / "pods.json").read_text()):
        fake.add_pod_object(pod)
    fake.add_node("gpu-node-000")
    fake.add_node("gpu-node-001")
    return fake, actuator


def job_action(kind: ActionKind, target: str = "job/ml-training:llama-ft", nodes: list[str] | None = None,
               ts: float = AFTER_START) -> Action:
    return Action(ts=ts, kind=kind, target=target, reason="GPU fell off the bus",
                  params={"fault_type": "xid_79", **({"nodes": nodes} if nodes is not None else {})})


def pod_names(fake: FakeKube, namespace: str) -> set[str]:
    return {p["metadata"]["name"] for p in fake.pods if p["metadata"]["namespace"] == namespace}


def deletes(fake: FakeKube) -> list[str]:
    return [path.rsplit("/", 1)[-1] for method, path, _ in fake.requests if method == "DELETE"]


def test_restart_job_deletes_the_jobs_pods_for_its_controller_to_recreate(
    training: tuple[FakeKube, KubernetesActuator],
) -> None:
    fake, actuator = training
    result = actuator.execute(job_action(ActionKind.RESTART_JOB))
    assert sorted(deletes(fake)) == ["llama-ft-master-0", "llama-ft-worker-0"]
    assert "deleted 2 pods of job ml-training/llama-ft (on n1, n2)" in result
    assert pod_names(fake, "ml-training") == {"trainer-0", "trainer-1", "trainer-2"}  # other pods stay
    # a batch/v1 Job's pods are found by their own label; its neighbours' are left
    actuator.execute(job_action(ActionKind.RESTART_JOB, target="job/ml:train-spot-a"))
    assert pod_names(fake, "ml") == {"train-spot-b-0-q9m4d", "train-spot-b-1-q9m4d", "batch-embed-0-q9m4d",
                                     "batch-embed-1-q9m4d"}


def test_a_restart_run_again_leaves_the_recreated_pods_alone(training: tuple[FakeKube, KubernetesActuator]) -> None:
    fake, actuator = training
    before_start = dt.datetime(2026, 12, 1, 5, 0, tzinfo=dt.UTC).timestamp()
    with pytest.raises(ActuatorError, match="has no pods created before the action"):
        actuator.execute(job_action(ActionKind.RESTART_JOB, ts=before_start))
    with pytest.raises(ActuatorError, match="has no pods created before the action"):
        actuator.execute(job_action(ActionKind.RESTART_JOB, target="job/ml-training:nosuchjob"))
    assert deletes(fake) == []


def test_migrate_job_cordons_the_bad_node_then_restarts_the_job_through_the_guard(
    training: tuple[FakeKube, KubernetesActuator], tmp_path: Path
) -> None:
    fake, actuator = training
    url = f"sqlite:///{tmp_path}/r.db"
    lifecycle, audit = LifecycleStore(url), AuditLog(url)
    topology = Topology(nodes=[Node(name=f"n{i}", switch="s1") for i in range(1, 5)])
    guard = BlastRadiusGuard(topology, lifecycle, max_share=0.25, max_share_per_switch=1.0)  # one node of 4
    proposed = Remediator([actuator], audit, lifecycle=lifecycle, guard=guard).execute(
        job_action(ActionKind.MIGRATE_JOB, nodes=["node/n1"]))
    assert proposed.status is ActionStatus.PROPOSED
    assert "cordon node n1, then delete the pods of job ml-training/llama-ft" in proposed.result
    assert deletes(fake) == [] and "unschedulable" not in fake.nodes["n1"]["spec"]

    live = Remediator([actuator], audit, lifecycle=lifecycle, dry_run=False,
                      guard=BlastRadiusGuard(topology, lifecycle, max_share=0.25, max_share_per_switch=1.0))
    done = live.execute(job_action(ActionKind.MIGRATE_JOB, nodes=["node/n1"]))
    assert done.status is ActionStatus.EXECUTED, done.result
    assert done.result.startswith("cordoned n1; deleted 2 pods of job ml-training/llama-ft")
    assert fake.nodes["n1"]["spec"]["unschedulable"] is True
    assert {"key": "nvidia.com/gpu-xid-error", "value": "true", "effect": "NoSchedule"} in fake.nodes["n1"]["spec"][
        "taints"]
    # the cordon went before the deletes, so the recreated pods cannot land on n1 again
    order = [(method, path) for method, path, _ in fake.requests if method in ("PATCH", "DELETE")]
    assert order[0] == ("PATCH", "/api/v1/nodes/n1") and order[-1][0] == "DELETE"
    assert lifecycle.status("node/n1").state is NodeState.CORDONED
    # a second bad node would exceed the blast radius: refused, nothing cordoned or deleted
    fake.add_pod_object(json.loads((FIXTURES / "remedy" / "kube" / "pytorchjob-pods.json").read_text())[1])
    refused = live.execute(job_action(ActionKind.MIGRATE_JOB, nodes=["node/n2"]))
    assert refused.status is ActionStatus.REFUSED and "blast radius" in refused.result
    assert "unschedulable" not in fake.nodes["n2"]["spec"] and len(deletes(fake)) == 2
    assert [a.status for a in audit.actions()] == [ActionStatus.PROPOSED, ActionStatus.EXECUTED,
                                                   ActionStatus.REFUSED]


def test_migrate_job_without_a_named_node_needs_one_of_its_nodes_cordoned(
    training: tuple[FakeKube, KubernetesActuator],
) -> None:
    fake, actuator = training
    with pytest.raises(ActuatorError, match="runs on n1, n2 and none is cordoned: name the bad node"):
        actuator.execute(job_action(ActionKind.MIGRATE_JOB))
    assert deletes(fake) == []
    actuator.execute(action(ActionKind.CORDON, node="n2"))  # the plan's cordon step, done first
    result = actuator.execute(job_action(ActionKind.MIGRATE_JOB))
    assert result.startswith("deleted 2 pods") and sorted(deletes(fake)) == ["llama-ft-master-0", "llama-ft-worker-0"]


def test_job_actions_take_only_namespaced_job_targets(kube: tuple[FakeKube, KubernetesActuator]) -> None:
    _, actuator = kube
    assert actuator.accepts(job_action(ActionKind.RESTART_JOB))
    assert not actuator.accepts(job_action(ActionKind.RESTART_JOB, target="job/llama-ft/rank/3"))
    assert not actuator.accepts(job_action(ActionKind.CORDON))
    with pytest.raises(ActuatorError, match=r"job/<namespace>:<name>"):
        actuator.execute(job_action(ActionKind.RESTART_JOB, target="job/4242"))
