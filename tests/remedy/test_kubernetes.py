"""The Kubernetes actuator through the official client against a local fake API server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from tests.remedy.kube_server import FakeKube, serve
from vigil.model import Action, ActionKind, ActionStatus, Node, Topology
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
