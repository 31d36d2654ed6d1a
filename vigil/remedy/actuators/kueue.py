"""Kueue actuator for tidal plans, on the official ``kubernetes`` client.

- set_quota on ``cluster/<name>``: the ClusterQueue ``params.queue`` gets ``nominalQuota = params.units`` for
  ``params.resource`` (``nvidia.com/gpu``) in the flavor that has it, or in ``params.flavor`` when several do
  (read, then a JSON merge patch of ``spec.resourceGroups``, which Kueue accepts on a live queue);
- preempt_notice on ``job/<namespace>:<name>``: the job object (a batch/v1 Job, a Kubeflow PyTorchJob, TFJob or
  MPIJob, or a JobSet) and its pods, found by the label each controller puts on them, are annotated
  ``vigil.dev/preempt-at`` (the deadline, RFC 3339) and ``vigil.dev/preempt-signal``; a pod reads its
  annotations through a Downward API volume, which the kubelet refreshes, and checkpoints
  (``vigil.remedy.actuators.kube_jobs``);
- preempt on the same target: the job's Kueue Workload (label ``kueue.x-k8s.io/job-uid``) is deactivated
  (``spec.active: false``): Kueue evicts it (pods get SIGTERM and their terminationGracePeriodSeconds) and it
  stays queued, inactive, until it is set active again;
- restart_job on the same target: the Workload is set active again, and Kueue admits it when quota allows.

No API server runs in Vigil's CI: the tests run this code against a local server answering with JSON in the
real API's shapes (tests/fixtures/tide/kube).
"""

from __future__ import annotations

from typing import Any

from vigil.model import Action, ActionKind, parse_entity
from vigil.remedy.actuators.base import Actuator
from vigil.remedy.actuators.kube_jobs import (
    GPU_RESOURCE,
    JOB_NAME_LABEL,
    JOB_UID_LABEL,
    KUEUE_GROUP,
    KUEUE_VERSION,
    MERGE_PATCH,
    NOTICE_AT,
    NOTICE_SIGNAL,
    Declined,
    KubeJobs,
    job_ref,
)
from vigil.sources.collect.kube_client import kube_api_client

__all__ = ["GPU_RESOURCE", "JOB_NAME_LABEL", "JOB_UID_LABEL", "KUEUE_GROUP", "KUEUE_VERSION", "MERGE_PATCH",
           "NOTICE_AT", "NOTICE_SIGNAL", "KueueActuator", "job_ref"]


class KueueActuator(KubeJobs, Actuator):
    name = "kueue"
    kinds = frozenset({ActionKind.SET_QUOTA, ActionKind.PREEMPT_NOTICE, ActionKind.PREEMPT, ActionKind.RESTART_JOB})
    target_kinds = frozenset({"cluster", "job"})

    def __init__(self, api_client: Any | None = None) -> None:
        """``api_client``: a ``kubernetes.client.ApiClient``; None loads in-cluster config or kubeconfig."""
        from kubernetes import client

        api_client = api_client if api_client is not None else kube_api_client()
        self.client = client
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.scheduling = client.SchedulingV1Api(api_client)

    def ensure(self, objects: list[dict[str, Any]]) -> list[str]:
        """Create the tiers' PriorityClasses and Kueue objects; one that exists already is left as it is."""
        plural = {"ResourceFlavor": "resourceflavors", "ClusterQueue": "clusterqueues", "LocalQueue": "localqueues"}
        results = []
        for body in objects:
            kind, metadata = body["kind"], body["metadata"]
            what = f"{kind} {metadata.get('namespace', '') + '/' if 'namespace' in metadata else ''}{metadata['name']}"
            create: Any
            where: tuple[str, ...]  # the arguments before the body
            if kind == "PriorityClass":  # the client serializes a dict body as it is
                create, where = self.scheduling.create_priority_class, ()
            elif "namespace" in metadata:
                create = self.custom.create_namespaced_custom_object
                where = (KUEUE_GROUP, KUEUE_VERSION, metadata["namespace"], plural[kind])
            else:
                create, where = self.custom.create_cluster_custom_object, (KUEUE_GROUP, KUEUE_VERSION, plural[kind])
            answer = self._call(f"create {what}", create, *where, body, expected=(409,))
            results.append(f"{what} exists" if isinstance(answer, Declined) else f"{what} created")
        return results

    def workloads(self) -> list[dict[str, Any]]:
        """Every Kueue Workload in the cluster."""
        found = self._call("list workloads", self.custom.list_cluster_custom_object, KUEUE_GROUP, KUEUE_VERSION,
                           "workloads")
        return list(found.get("items", []))

    def accepts(self, action: Action) -> bool:
        kind = parse_entity(action.target)[0]
        return action.kind in self.kinds and kind == ("cluster" if action.kind is ActionKind.SET_QUOTA else "job")

    # ------------------------------------------------------------------ interface

    def describe(self, action: Action) -> str:
        if action.kind is ActionKind.SET_QUOTA:
            return self.describe_quota(action)
        namespace, name = job_ref(action.target)
        if action.kind is ActionKind.PREEMPT_NOTICE:
            return self.describe_notice(action)
        if action.kind is ActionKind.RESTART_JOB:
            return f"activate the Kueue Workload of job {namespace}/{name} (spec.active=true)"
        return f"deactivate the Kueue Workload of job {namespace}/{name} (spec.active=false)"

    def is_satisfied(self, action: Action) -> bool:
        if action.kind is ActionKind.SET_QUOTA:
            return self.quota_is_set(action)
        if action.kind in (ActionKind.PREEMPT, ActionKind.RESTART_JOB):
            namespace, name = job_ref(action.target)
            found = self._job_object(namespace, name)
            workload = self._workload_of(namespace, found[1]) if found is not None else None
            if workload is None:  # no such job, or Kueue does not manage it: execute says which
                return False
            active = workload.get("spec", {}).get("active", True) is not False
            return not active if action.kind is ActionKind.PREEMPT else active
        return False

    def execute(self, action: Action) -> str:
        if action.kind is ActionKind.SET_QUOTA:
            return self.set_quota(action)
        if action.kind is ActionKind.PREEMPT_NOTICE:
            return self.send_notice(action)
        namespace, name = job_ref(action.target)
        return self.set_held(namespace, name, action.kind is ActionKind.PREEMPT, kueue_only=True)
