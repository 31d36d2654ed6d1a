"""The tiers on Kubernetes: a PriorityClass per tier and Kueue queues, one ClusterQueue per tier in one cohort.

- PriorityClass ``vigil-tier<N>-<tier name>``: values 1000000 / 900000 / 100000 / 1000; tiers 1-3 may preempt
  lower priorities (``PreemptLowerPriority``), tier 4 never preempts (``Never``);
- ResourceFlavor ``vigil-gpu`` and ClusterQueue ``vigil-<tier name>`` in cohort ``vigil-tide``, quota in
  ``nvidia.com/gpu``: tiers 1 and 2 hold their floors as nominal quota and reclaim what they lent
  (``reclaimWithinCohort: Any``); tiers 3 and 4 hold what the plan gives them (``set_quota`` each interval)
  and may not borrow (``borrowingLimit: 0``), so a lower quota is a ceiling Kueue keeps;
- a LocalQueue named after the tier in each workload namespace points at its ClusterQueue.

Vigil writes these with the official ``kubernetes`` client (SchedulingV1Api, CustomObjectsApi); the per-interval
changes go through ``KueueActuator`` (vigil/remedy/actuators/kueue.py).
"""

from __future__ import annotations

from typing import Any

from vigil.remedy.actuators.kube_jobs import JOB_KINDS
from vigil.remedy.actuators.kueue import GPU_RESOURCE, KUEUE_GROUP, KUEUE_VERSION
from vigil.remedy.tide.act import TierJob
from vigil.remedy.tide.tiers import TierPolicy

FLAVOR = "vigil-gpu"
COHORT = "vigil-tide"
PRIORITY_VALUE = {1: 1_000_000, 2: 900_000, 3: 100_000, 4: 1_000}
MANAGED = {"app.kubernetes.io/managed-by": "vigil"}


def priority_class_name(tier: int, name: str) -> str:
    return f"vigil-tier{tier}-{name}"


def cluster_queue_name(name: str) -> str:
    return f"vigil-{name}"


def cluster_queues(policy: TierPolicy) -> dict[int, str]:
    return {t.tier: cluster_queue_name(t.name) for t in policy.tiers}


def priority_classes(policy: TierPolicy) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": priority_class_name(t.tier, t.name), "labels": dict(MANAGED)},
            "value": PRIORITY_VALUE[t.tier],
            "globalDefault": False,
            "preemptionPolicy": "Never" if t.tier == 4 else "PreemptLowerPriority",
            "description": f"Vigil tier {t.tier} ({t.name})"
            + ("; preempted after a notice" if t.tier == 3 else "; preempted at any moment" if t.tier == 4 else ""),
        }
        for t in sorted(policy.tiers, key=lambda t: t.tier)
    ]


def kueue_objects(policy: TierPolicy, namespaces: list[str]) -> list[dict[str, Any]]:
    """The ResourceFlavor, a ClusterQueue per tier and a LocalQueue per tier in each of ``namespaces``."""
    api = f"{KUEUE_GROUP}/{KUEUE_VERSION}"
    objects: list[dict[str, Any]] = [
        {"apiVersion": api, "kind": "ResourceFlavor", "metadata": {"name": FLAVOR, "labels": dict(MANAGED)}, "spec": {}}
    ]
    for tier in sorted(policy.tiers, key=lambda t: t.tier):
        quota: dict[str, Any] = {"name": GPU_RESOURCE, "nominalQuota": tier.floor_gpus}
        if tier.preemptible:
            quota["borrowingLimit"] = 0
        objects.append({
            "apiVersion": api,
            "kind": "ClusterQueue",
            "metadata": {"name": cluster_queue_name(tier.name), "labels": dict(MANAGED)},
            "spec": {
                "cohort": COHORT,
                "namespaceSelector": {},
                "queueingStrategy": "BestEffortFIFO",
                "resourceGroups": [{"coveredResources": [GPU_RESOURCE],
                                    "flavors": [{"name": FLAVOR, "resources": [quota]}]}],
                "preemption": {
                    "withinClusterQueue": "LowerPriority",
                    "reclaimWithinCohort": "Never" if tier.preemptible else "Any",
                },
            },
        })
    for namespace in namespaces:
        for tier in sorted(policy.tiers, key=lambda t: t.tier):
            objects.append({
                "apiVersion": api,
                "kind": "LocalQueue",
                "metadata": {"name": tier.name, "namespace": namespace, "labels": dict(MANAGED)},
                "spec": {"clusterQueue": cluster_queue_name(tier.name)},
            })
    return objects


def _gpus(pod_set: dict[str, Any], resource: str) -> int:
    per_pod = 0
    for container in pod_set.get("template", {}).get("spec", {}).get("containers", []):
        resources = container.get("resources", {})
        value = resources.get("limits", {}).get(resource, resources.get("requests", {}).get(resource, 0))
        per_pod += int(value)
    return per_pod * int(pod_set.get("count", 1))


# the owners of a Workload that the actuators can notify and preempt: batch/v1 Job, PyTorchJob, JobSet, TFJob,
# MPIJob
JOB_KIND_NAMES = frozenset(kind.kind for kind in JOB_KINDS)


def admitted_tier_jobs(workloads: list[dict[str, Any]], policy: TierPolicy, resource: str = GPU_RESOURCE,
                       *, inactive: bool = False) -> list[TierJob]:
    """Jobs of tiers 3 and 4 that Kueue admitted, from Workload objects: the tier from the ClusterQueue that
    admitted it, the job from its owner (a Job, PyTorchJob, JobSet, TFJob or MPIJob: ``job/<namespace>:<name>``),
    units from its pod sets' requests.
    With ``inactive``: the deactivated ones instead, their tier from the LocalQueue they were submitted to."""
    by_queue = {name: tier for tier, name in cluster_queues(policy).items()}
    by_local_queue = {t.name: t.tier for t in policy.tiers}
    jobs = []
    for workload in workloads:
        metadata, status, spec = workload.get("metadata", {}), workload.get("status", {}), workload.get("spec", {})
        admission = status.get("admission") or {}
        active = spec.get("active", True) is not False
        if inactive:
            tier = None if active else by_local_queue.get(spec.get("queueName", ""))
        else:
            tier = by_queue.get(admission.get("clusterQueue", "")) if active else None
        owners = [o for o in metadata.get("ownerReferences", []) if o.get("kind") in JOB_KIND_NAMES]
        if tier not in (3, 4) or not owners:
            continue
        units = sum(_gpus(pod_set, resource) for pod_set in spec.get("podSets", []))
        jobs.append(TierJob(f"{metadata.get('namespace', 'default')}:{owners[0]['name']}", owners[0]["name"], tier,
                            units, metadata.get("creationTimestamp", "")))
    return jobs
