"""Kubernetes actuator, on the official ``kubernetes`` client, speaking NVIDIA NVSentinel's vocabulary.

- cordon: ``spec.unschedulable = true`` plus an NVSentinel-style taint (``nvidia.com/gpu-error``,
  ``nvidia.com/gpu-xid-error``, ``nvidia.com/gpu-nvlink-error`` - NoSchedule, or PreferNoSchedule for
  degraded faults), a node condition named like NVSentinel's (``GpuMemWatch``, ``SysLogsXIDError``,
  ...) with the message form ``[fault] text - RecommendedAction: ACTION``, and a ``vigil.dev/state``
  label.
- drain: evict (never delete) every pod on the node through the Eviction API, so PodDisruptionBudgets
  hold; system namespaces, DaemonSet pods and mirror pods are left, as ``kubectl drain`` does. A pod a
  PDB protects (HTTP 429) stays, and the drain reports it as blocked rather than forcing it.
- reboot: a ``janitor.dgxc.nvidia.com/v1alpha1`` ``RebootNode`` custom resource (NVSentinel's
  janitor), created once per node (an existing one makes the action idempotent).
- uncordon: clears the flag, Vigil's taints and the condition.
- restart_job on ``job/<namespace>:<name>``: deletes the job's pods (found by the labels a batch/v1 Job, a
  Kubeflow PyTorchJob, TFJob or MPIJob, or a JobSet puts on them), so its controller creates them again and
  the ranks resume from the last checkpoint together, as collectives require. Only pods created before the action are
  deleted: an interrupted restart that runs again leaves the new pods alone.
- migrate_job on the same target: the bad nodes (``params.nodes``, plus the job's nodes already
  unschedulable) are cordoned first, then the pods are deleted as for a restart; the scheduler places the
  new pods on other nodes.
- preempt_notice, preempt and set_quota (``vigil.remedy.actuators.kube_jobs``): the notice annotates the job
  object and its pods; preempt deactivates the job's Kueue Workload, or, for a job Kueue does not manage,
  suspends the Job / JobSet (``spec.suspend``) or PyTorchJob / TFJob / MPIJob (``spec.runPolicy.suspend``);
  restart_job of a job held that way resumes it; set_quota sets a Kueue ClusterQueue's ``nominalQuota``.

No API server runs in Vigil's CI: the tests run this code against a small local HTTP server that
implements the endpoints used here.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from vigil.model import Action, ActionKind, parse_entity
from vigil.remedy.actuators.base import Actuator, ActuatorError, migration_nodes
from vigil.remedy.actuators.kube_jobs import JOB_POD_LABELS, Declined, KubeJobs, job_ref
from vigil.sources.collect.kube_client import kube_api_client

STATE_LABEL = "vigil.dev/state"
VIGIL_TAINT_KEYS = frozenset({"nvidia.com/gpu-error", "nvidia.com/gpu-xid-error", "nvidia.com/gpu-nvlink-error"})
SYSTEM_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease"})
JANITOR_GROUP, JANITOR_VERSION, REBOOT_PLURAL = "janitor.dgxc.nvidia.com", "v1alpha1", "rebootnodes"
STRATEGIC_MERGE = "application/strategic-merge-patch+json"
__all__ = ["JOB_POD_LABELS", "KubernetesActuator", "condition_and_taint"]

# fault-type prefix -> (NVSentinel condition type, taint key)
_CONDITION_BY_FAULT: list[tuple[str, str, str]] = [
    ("xid", "SysLogsXIDError", "nvidia.com/gpu-xid-error"),
    ("fallen_off_bus", "SysLogsGPUFallenOff", "nvidia.com/gpu-error"),
    ("nvlink", "GpuNvlinkWatch", "nvidia.com/gpu-nvlink-error"),
    ("ecc", "GpuMemWatch", "nvidia.com/gpu-error"),
    ("row_remap", "GpuMemWatch", "nvidia.com/gpu-error"),
    ("memory", "GpuMemWatch", "nvidia.com/gpu-error"),
    ("thermal", "GpuThermalWatch", "nvidia.com/gpu-error"),
    ("pcie", "GpuPcieWatch", "nvidia.com/gpu-error"),
    ("power", "GpuPowerWatch", "nvidia.com/gpu-error"),
    ("driver", "GpuDriverWatch", "nvidia.com/gpu-error"),
    ("nvswitch", "NVSwitchFatalError", "nvidia.com/gpu-error"),
]
_RECOMMENDED_ACTION = {
    ActionKind.CORDON: "NONE",
    ActionKind.DRAIN: "COMPONENT_RESET",
    ActionKind.REBOOT: "RESTART_BM",
    ActionKind.RESET_GPU: "COMPONENT_RESET",
}


def condition_and_taint(fault_type: str) -> tuple[str, str]:
    """NVSentinel's condition type and taint key for a Vigil fault type (DCGMError / gpu-error otherwise)."""
    lowered = fault_type.lower()
    for prefix, condition, taint in _CONDITION_BY_FAULT:
        if prefix in lowered:
            return condition, taint
    return "DCGMError", "nvidia.com/gpu-error"


class KubernetesActuator(KubeJobs, Actuator):
    name = "kubernetes"
    kinds = frozenset({ActionKind.CORDON, ActionKind.UNCORDON, ActionKind.DRAIN, ActionKind.REBOOT,
                       ActionKind.RESTART_JOB, ActionKind.MIGRATE_JOB, ActionKind.PREEMPT_NOTICE, ActionKind.PREEMPT,
                       ActionKind.SET_QUOTA})
    target_kinds = frozenset({"node", "job", "cluster"})
    job_kinds = frozenset({ActionKind.RESTART_JOB, ActionKind.MIGRATE_JOB, ActionKind.PREEMPT_NOTICE,
                           ActionKind.PREEMPT})

    def accepts(self, action: Action) -> bool:
        kind, parts = parse_entity(action.target)
        if action.kind in self.job_kinds:
            return kind == "job" and len(parts) == 1
        if action.kind is ActionKind.SET_QUOTA:
            return kind == "cluster"
        return action.kind in self.kinds and kind == "node"

    def __init__(self, api_client: Any | None = None, *, eviction_grace_s: int | None = None) -> None:
        """``api_client``: a ``kubernetes.client.ApiClient``; None loads kubeconfig or in-cluster config."""
        from kubernetes import client

        api_client = api_client if api_client is not None else kube_api_client()
        self.client = client
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.eviction_grace_s = eviction_grace_s

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def node_name(action: Action) -> str:
        return parse_entity(action.target)[1][0]

    def _node(self, name: str) -> Any:
        return self._call(f"read node {name}", self.core.read_node, name)

    # ------------------------------------------------------------------ interface

    def describe(self, action: Action) -> str:
        if action.kind is ActionKind.SET_QUOTA:
            return self.describe_quota(action)
        if action.kind in self.job_kinds:
            return self.describe_job(action)
        name = self.node_name(action)
        fault = str(action.params.get("fault_type", ""))
        condition, taint = condition_and_taint(fault)
        if action.kind is ActionKind.CORDON:
            return f"cordon node {name}, taint {taint}=true:{self._effect(action)}, set condition {condition}"
        if action.kind is ActionKind.UNCORDON:
            return f"uncordon node {name}, remove Vigil taints and condition"
        if action.kind is ActionKind.DRAIN:
            return f"evict all non-system pods from node {name} (PodDisruptionBudgets respected)"
        return f"create {JANITOR_GROUP}/{JANITOR_VERSION} RebootNode for node {name}"

    def is_satisfied(self, action: Action) -> bool:
        if action.kind is ActionKind.SET_QUOTA:
            return self.quota_is_set(action)
        if action.kind is ActionKind.PREEMPT:
            return self.is_preempted(*job_ref(action.target)) is True
        if action.kind in self.job_kinds:
            return False
        name = self.node_name(action)
        if action.kind is ActionKind.REBOOT:
            found = self._call(f"read RebootNode for {name}", self.custom.get_cluster_custom_object, JANITOR_GROUP,
                               JANITOR_VERSION, REBOOT_PLURAL, _cr_name(name), expected=(404,))
            return not isinstance(found, Declined)
        if action.kind is ActionKind.DRAIN:
            return False
        unschedulable = bool(self._node(name).spec.unschedulable)
        return unschedulable if action.kind is ActionKind.CORDON else not unschedulable

    def execute(self, action: Action) -> str:
        if action.kind is ActionKind.SET_QUOTA:
            return self.set_quota(action)
        if action.kind is ActionKind.PREEMPT_NOTICE:
            return self.send_notice(action)
        if action.kind is ActionKind.PREEMPT:
            return self.set_held(*job_ref(action.target), held=True)
        if action.kind in self.job_kinds:
            return self._restart(action)
        name = self.node_name(action)
        if action.kind is ActionKind.CORDON:
            return self._cordon(name, action)
        if action.kind is ActionKind.UNCORDON:
            return self._uncordon(name)
        if action.kind is ActionKind.DRAIN:
            return self._drain(name)
        if action.kind is ActionKind.REBOOT:
            return self._reboot(name, action)
        raise ActuatorError(f"kubernetes actuator cannot {action.kind.value}")

    # ------------------------------------------------------------------ actions

    @staticmethod
    def _effect(action: Action) -> str:
        return "PreferNoSchedule" if action.params.get("level") == "degraded" else "NoSchedule"

    def _cordon(self, name: str, action: Action) -> str:
        fault = str(action.params.get("fault_type", "unknown"))
        condition_type, taint_key = condition_and_taint(fault)
        node = self._node(name)
        taints = [t.to_dict() for t in (node.spec.taints or []) if t.key != taint_key]
        taints.append({"key": taint_key, "value": "true", "effect": self._effect(action)})
        patch = {
            "metadata": {"labels": {STATE_LABEL: "cordoned"}},
            "spec": {"unschedulable": True, "taints": taints},
        }
        self._call(f"cordon node {name}", self.core.patch_node, name, patch, _content_type=STRATEGIC_MERGE)
        recommended = _RECOMMENDED_ACTION.get(action.kind, "NONE")
        condition = {
            "type": condition_type,
            "status": "True",
            "reason": "VigilFaultQuarantine",
            "message": f"[{fault}] {action.reason} - RecommendedAction: {recommended}"[:1024],
        }
        self._call(
            f"set condition on node {name}",
            self.core.patch_node_status,
            name,
            {"status": {"conditions": [condition]}},
            _content_type=STRATEGIC_MERGE,
        )
        return f"cordoned node {name}, taint {taint_key}, condition {condition_type}"

    def _uncordon(self, name: str) -> str:
        node = self._node(name)
        taints = [t.to_dict() for t in (node.spec.taints or []) if t.key not in VIGIL_TAINT_KEYS]
        patch = {
            "metadata": {"labels": {STATE_LABEL: "healthy"}},
            "spec": {"unschedulable": False, "taints": taints},
        }
        self._call(f"uncordon node {name}", self.core.patch_node, name, patch, _content_type=STRATEGIC_MERGE)
        cleared = [
            {
                "type": c.type,
                "status": "False",
                "reason": "VigilSelfCheckPassed",
                "message": "returned to service",
            }
            for c in (node.status.conditions or [])
            if c.reason == "VigilFaultQuarantine"
        ]
        if cleared:
            self._call(
                f"clear conditions on node {name}",
                self.core.patch_node_status,
                name,
                {"status": {"conditions": cleared}},
                _content_type=STRATEGIC_MERGE,
            )
        return f"uncordoned node {name}"

    def _drain(self, name: str) -> str:
        pods = self._call(
            f"list pods on {name}",
            self.core.list_pod_for_all_namespaces,
            field_selector=f"spec.nodeName={name}",
        ).items
        evicted, blocked, kept = [], [], 0
        for pod in pods:
            meta = pod.metadata
            owners = meta.owner_references or []
            mirror = "kubernetes.io/config.mirror" in (meta.annotations or {})
            if meta.namespace in SYSTEM_NAMESPACES or mirror or any(o.kind == "DaemonSet" for o in owners):
                kept += 1
                continue
            delete_options = (
                self.client.V1DeleteOptions(grace_period_seconds=self.eviction_grace_s)
                if self.eviction_grace_s is not None
                else None
            )
            eviction = self.client.V1Eviction(
                metadata=self.client.V1ObjectMeta(name=meta.name, namespace=meta.namespace),
                delete_options=delete_options,
            )
            pod = f"{meta.namespace}/{meta.name}"
            answer = self._call(f"evict {pod}", self.core.create_namespaced_pod_eviction, meta.name, meta.namespace,
                                eviction, expected=(404, 429))
            if answer == Declined(429):  # a PodDisruptionBudget forbids it now; retry on the next pass
                blocked.append(pod)
            elif not isinstance(answer, Declined):  # 404: gone already
                evicted.append(pod)
        self._call(
            f"label node {name}",
            self.core.patch_node,
            name,
            {"metadata": {"labels": {STATE_LABEL: "draining"}}},
            _content_type=STRATEGIC_MERGE,
        )
        result = f"drain {name}: evicted {len(evicted)}, kept {kept} system/daemon pods"
        if blocked:
            result += f", blocked by PodDisruptionBudget: {', '.join(blocked)}"
        return result

    def _reboot(self, name: str, action: Action) -> str:
        body = {
            "apiVersion": f"{JANITOR_GROUP}/{JANITOR_VERSION}",
            "kind": "RebootNode",
            "metadata": {"name": _cr_name(name), "labels": {"app.kubernetes.io/managed-by": "vigil"}},
            "spec": {"nodeName": name, "force": False},
        }
        self._call(
            f"create RebootNode for {name}",
            self.custom.create_cluster_custom_object,
            JANITOR_GROUP,
            JANITOR_VERSION,
            REBOOT_PLURAL,
            body,
        )
        self._call(
            f"label node {name}",
            self.core.patch_node,
            name,
            {"metadata": {"labels": {STATE_LABEL: "repairing"}}},
            _content_type=STRATEGIC_MERGE,
        )
        return f"RebootNode {_cr_name(name)} created for node {name}"


    # ------------------------------------------------------------------ job actions

    def describe_job(self, action: Action) -> str:
        namespace, name = job_ref(action.target)
        if action.kind is ActionKind.PREEMPT_NOTICE:
            return self.describe_notice(action)
        if action.kind is ActionKind.PREEMPT:
            return (f"deactivate the Kueue Workload of job {namespace}/{name} (spec.active=false); without one, "
                    "suspend its Job or JobSet (spec.suspend=true) or PyTorchJob, TFJob or MPIJob "
                    "(spec.runPolicy.suspend=true)")
        delete = (f"delete the pods of job {namespace}/{name} created before now (label "
                  f"{' or '.join(label + '=' + name for label in JOB_POD_LABELS)}); its controller recreates them")
        if action.kind is ActionKind.RESTART_JOB:
            return delete + "; a job preempted by Vigil (Workload inactive or suspended) is resumed instead"
        named = migration_nodes(action)
        if named:
            return f"cordon node {', '.join(named)}, then {delete} on other nodes"
        return f"{delete} off its cordoned nodes (refused when none of its nodes is cordoned)"

    def _restart(self, action: Action) -> str:
        namespace, name = job_ref(action.target)
        started = dt.datetime.fromtimestamp(action.ts, dt.UTC)
        pods = [pod for pod in self._job_pods(namespace, name)
                if pod.metadata.creation_timestamp is None or pod.metadata.creation_timestamp < started]
        if not pods and action.kind is ActionKind.RESTART_JOB and self.is_preempted(namespace, name):
            return self.set_held(namespace, name, held=False)
        if not pods:
            raise ActuatorError(f"job {namespace}/{name} has no pods created before the action (labels "
                                f"{', '.join(JOB_POD_LABELS)}); Vigil restarts a job its controller still runs")
        cordoned: list[str] = []
        if action.kind is ActionKind.MIGRATE_JOB:
            named = migration_nodes(action)
            hosts = sorted({pod.spec.node_name for pod in pods if pod.spec.node_name} - set(named))
            already = [host for host in hosts if self._node(host).spec.unschedulable]
            if not named and not already:
                raise ActuatorError(f"job {namespace}/{name} runs on {', '.join(hosts) or 'no node'} and none is "
                                    "cordoned: name the bad node (--node node/NAME), or restart_job to restart it")
            for node in named:
                if not self._node(node).spec.unschedulable:
                    self._cordon(node, action)
                    cordoned.append(node)
        for pod in pods:  # a 404 is a pod gone already: its controller is recreating it
            self._call(f"delete pod {namespace}/{pod.metadata.name}", self.core.delete_namespaced_pod,
                       pod.metadata.name, namespace, expected=(404,))
        where = sorted({pod.spec.node_name for pod in pods if pod.spec.node_name})
        result = f"deleted {len(pods)} pods of job {namespace}/{name} (on {', '.join(where) or 'no node'})"
        if cordoned:
            result = f"cordoned {', '.join(cordoned)}; " + result
        return result + ": its controller recreates them"


def _cr_name(node: str) -> str:
    return f"vigil-reboot-{node}".lower()[:253]
