"""Kueue actuator for tidal plans, on the official ``kubernetes`` client.

- set_quota on ``cluster/<name>``: the ClusterQueue ``params.queue`` gets ``nominalQuota = params.units`` for
  ``params.resource`` (``nvidia.com/gpu``) in every flavor (read, then a JSON merge patch of
  ``spec.resourceGroups``, which Kueue accepts on a live queue);
- preempt_notice on ``job/<namespace>:<name>``: the batch/v1 Job and its pods are annotated
  ``vigil.dev/preempt-at`` (the deadline, RFC 3339) and ``vigil.dev/preempt-signal``; a pod reads its
  annotations through a Downward API volume, which the kubelet refreshes, and checkpoints;
- preempt on the same target: the Job's Kueue Workload (label ``kueue.x-k8s.io/job-uid``) is deactivated
  (``spec.active: false``): Kueue evicts it (pods get SIGTERM and their terminationGracePeriodSeconds) and it
  stays queued, inactive, until it is set active again;
- restart_job on the same target: the Workload is set active again, and Kueue admits it when quota allows.

No API server runs in Vigil's CI: the tests run this code against a local server answering with JSON in the
real API's shapes (tests/fixtures/tide/kube).
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from vigil.model import Action, ActionKind, parse_entity
from vigil.remedy.actuators.base import Actuator, ActuatorError
from vigil.sources.collect.kube_client import kube_api_client

KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta1"
GPU_RESOURCE = "nvidia.com/gpu"
NOTICE_AT = "vigil.dev/preempt-at"
NOTICE_SIGNAL = "vigil.dev/preempt-signal"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
MERGE_PATCH = "application/merge-patch+json"
_K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def job_ref(target: str) -> tuple[str, str]:
    """``job/<namespace>:<name>`` as (namespace, name)."""
    namespace, _, name = parse_entity(target)[1][0].partition(":")
    if not _K8S_NAME.match(namespace) or not _K8S_NAME.match(name):
        raise ActuatorError(f"{target}: a Kubernetes job is named job/<namespace>:<name>")
    return namespace, name


class KueueActuator(Actuator):
    name = "kueue"
    kinds = frozenset({ActionKind.SET_QUOTA, ActionKind.PREEMPT_NOTICE, ActionKind.PREEMPT, ActionKind.RESTART_JOB})
    target_kinds = frozenset({"cluster", "job"})

    def __init__(self, api_client: Any | None = None) -> None:
        """``api_client``: a ``kubernetes.client.ApiClient``; None loads in-cluster config or kubeconfig."""
        from kubernetes import client

        api_client = api_client if api_client is not None else kube_api_client()
        self.client = client
        self.core = client.CoreV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.scheduling = client.SchedulingV1Api(api_client)

    def ensure(self, objects: list[dict[str, Any]]) -> list[str]:
        """Create the tiers' PriorityClasses and Kueue objects; one that exists already is left as it is."""
        plural = {"ResourceFlavor": "resourceflavors", "ClusterQueue": "clusterqueues", "LocalQueue": "localqueues"}
        results = []
        for body in objects:
            kind, metadata = body["kind"], body["metadata"]
            what = f"{kind} {metadata.get('namespace', '') + '/' if 'namespace' in metadata else ''}{metadata['name']}"
            try:
                if kind == "PriorityClass":
                    # the client serializes a dict body as it is; the stub asks for its model class
                    self.scheduling.create_priority_class(body)  # type: ignore[arg-type]
                elif "namespace" in metadata:
                    self.custom.create_namespaced_custom_object(KUEUE_GROUP, KUEUE_VERSION, metadata["namespace"],
                                                                plural[kind], body)
                else:
                    self.custom.create_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, plural[kind], body)
            except self.client.exceptions.ApiException as err:
                if err.status != 409:
                    raise ActuatorError(f"create {what}: HTTP {err.status} {err.reason}") from None
                results.append(f"{what} exists")
                continue
            except OSError as err:
                raise ActuatorError(f"create {what}: {err}") from None
            results.append(f"{what} created")
        return results

    def workloads(self) -> list[dict[str, Any]]:
        """Every Kueue Workload in the cluster."""
        found = self._call("list workloads", self.custom.list_cluster_custom_object, KUEUE_GROUP, KUEUE_VERSION,
                           "workloads")
        return list(found.get("items", []))

    def accepts(self, action: Action) -> bool:
        kind = parse_entity(action.target)[0]
        return action.kind in self.kinds and kind == ("cluster" if action.kind is ActionKind.SET_QUOTA else "job")

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except self.client.exceptions.ApiException as err:
            raise ActuatorError(f"{what}: HTTP {err.status} {err.reason}") from None
        except OSError as err:
            raise ActuatorError(f"{what}: {err}") from None

    # ------------------------------------------------------------------ quota

    @staticmethod
    def quota(action: Action) -> tuple[str, str, int]:
        queue, resource = action.params.get("queue"), action.params.get("resource", GPU_RESOURCE)
        units = action.params.get("units")
        if not isinstance(queue, str) or not _K8S_NAME.match(queue):
            raise ActuatorError(f"set_quota needs params.queue, a ClusterQueue name, got {queue!r}")
        if not isinstance(resource, str) or not resource:
            raise ActuatorError(f"set_quota needs params.resource, a resource name, got {resource!r}")
        if not isinstance(units, int) or isinstance(units, bool) or units < 0:
            raise ActuatorError(f"set_quota needs params.units, a count of at least 0, got {units!r}")
        return queue, resource, units

    def _cluster_queue(self, name: str) -> dict[str, Any]:
        return dict(self._call(f"read ClusterQueue {name}", self.custom.get_cluster_custom_object,
                               KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", name))

    @staticmethod
    def _quotas(queue: dict[str, Any], resource: str) -> list[dict[str, Any]]:
        return [r for group in queue.get("spec", {}).get("resourceGroups", [])
                for flavor in group.get("flavors", []) for r in flavor.get("resources", [])
                if r.get("name") == resource]

    # ------------------------------------------------------------------ jobs

    def _workload(self, namespace: str, job: str) -> dict[str, Any] | None:
        uid = self._call(f"read job {namespace}/{job}", self.batch.read_namespaced_job, job, namespace).metadata.uid
        found = self._call(f"list workloads of {namespace}/{job}", self.custom.list_namespaced_custom_object,
                           KUEUE_GROUP, KUEUE_VERSION, namespace, "workloads", label_selector=f"{JOB_UID_LABEL}={uid}")
        items = found.get("items", [])
        return dict(items[0]) if items else None

    # ------------------------------------------------------------------ interface

    def describe(self, action: Action) -> str:
        if action.kind is ActionKind.SET_QUOTA:
            queue, resource, units = self.quota(action)
            return f"set ClusterQueue {queue} nominalQuota {resource}={units}"
        namespace, name = job_ref(action.target)
        if action.kind is ActionKind.PREEMPT_NOTICE:
            return f"annotate job {namespace}/{name} and its pods {NOTICE_AT}={self._deadline(action)}"
        if action.kind is ActionKind.RESTART_JOB:
            return f"activate the Kueue Workload of job {namespace}/{name} (spec.active=true)"
        return f"deactivate the Kueue Workload of job {namespace}/{name} (spec.active=false)"

    @staticmethod
    def _deadline(action: Action) -> str:
        effective = float(action.params.get("effective_ts", action.ts))
        return dt.datetime.fromtimestamp(effective, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def is_satisfied(self, action: Action) -> bool:
        if action.kind is ActionKind.SET_QUOTA:
            queue, resource, units = self.quota(action)
            quotas = self._quotas(self._cluster_queue(queue), resource)
            return bool(quotas) and all(str(r.get("nominalQuota")) == str(units) for r in quotas)
        if action.kind in (ActionKind.PREEMPT, ActionKind.RESTART_JOB):
            workload = self._workload(*job_ref(action.target))
            active = workload is not None and workload.get("spec", {}).get("active", True) is not False
            return not active if action.kind is ActionKind.PREEMPT else active
        return False

    def execute(self, action: Action) -> str:
        if action.kind is ActionKind.SET_QUOTA:
            queue, resource, units = self.quota(action)
            spec = self._cluster_queue(queue).get("spec", {})
            groups = spec.get("resourceGroups", [])
            if not self._quotas({"spec": spec}, resource):
                raise ActuatorError(f"ClusterQueue {queue} has no quota for {resource}")
            for quota in self._quotas({"spec": spec}, resource):
                quota["nominalQuota"] = units
            self._call(f"patch ClusterQueue {queue}", self.custom.patch_cluster_custom_object, KUEUE_GROUP,
                       KUEUE_VERSION, "clusterqueues", queue, {"spec": {"resourceGroups": groups}})
            return f"ClusterQueue {queue} nominalQuota {resource}={units}"
        namespace, name = job_ref(action.target)
        if action.kind is ActionKind.PREEMPT_NOTICE:
            deadline = self._deadline(action)
            signal = str(action.params.get("signal", "USR1"))
            patch = {"metadata": {"annotations": {NOTICE_AT: deadline, NOTICE_SIGNAL: signal}}}
            self._call(f"annotate job {namespace}/{name}", self.batch.patch_namespaced_job, name, namespace, patch,
                       _content_type=MERGE_PATCH)
            pods = self._call(f"list pods of job {namespace}/{name}", self.core.list_namespaced_pod, namespace,
                              label_selector=f"{JOB_NAME_LABEL}={name}").items
            for pod in pods:
                self._call(f"annotate pod {namespace}/{pod.metadata.name}", self.core.patch_namespaced_pod,
                           pod.metadata.name, namespace, patch, _content_type=MERGE_PATCH)
            return f"notice to job {namespace}/{name} and {len(pods)} pods: checkpoint before {deadline}"
        workload = self._workload(namespace, name)
        if workload is None:
            raise ActuatorError(f"job {namespace}/{name} has no Kueue Workload")
        workload_name = workload["metadata"]["name"]
        active = action.kind is ActionKind.RESTART_JOB
        self._call(f"{'activate' if active else 'deactivate'} Workload {namespace}/{workload_name}",
                   self.custom.patch_namespaced_custom_object, KUEUE_GROUP, KUEUE_VERSION, namespace, "workloads",
                   workload_name, {"spec": {"active": active}})
        if active:
            return f"Workload {namespace}/{workload_name} active again: Kueue admits job {namespace}/{name} by quota"
        return f"Workload {namespace}/{workload_name} deactivated: Kueue evicts job {namespace}/{name}"
