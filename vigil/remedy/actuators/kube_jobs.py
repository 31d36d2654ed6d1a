"""Training jobs on Kubernetes as the actuators find them, shared by the Kubernetes and the Kueue actuator.

A job target is ``job/<namespace>:<name>``. Its object is a batch/v1 Job, a Kubeflow PyTorchJob, a JobSet, a
Kubeflow TFJob or an MPIJob (``JOB_KINDS``, looked up in that order; an MPIJob as the MPI Operator's
``kubeflow.org/v2beta1``, then as the training operator's ``kubeflow.org/v1``); its pods carry the label that
object's controller puts on them (``JOB_POD_LABELS``: the training operator and the MPI Operator both put
``training.kubeflow.org/job-name``), and a job Kueue manages has a Workload labelled with the object's uid
(``kueue.x-k8s.io/job-uid``, for every job kind Kueue integrates).

- a preemption notice annotates the job object and its pods ``vigil.dev/preempt-at`` (the deadline, RFC 3339)
  and ``vigil.dev/preempt-signal``; a pod reads its annotations through a Downward API volume, which the kubelet
  refreshes, and checkpoints;
- a preemption deactivates the job's Kueue Workload (``spec.active: false``: Kueue evicts it and keeps it
  queued); without a Workload the job object itself is suspended (``spec.suspend: true`` on a Job or a JobSet,
  ``spec.runPolicy.suspend: true`` on a PyTorchJob, TFJob or MPIJob): its controller deletes the pods and keeps
  the job;
- resuming undoes either;
- a quota is a Kueue ClusterQueue's ``nominalQuota``: ``params.queue`` gets ``params.units`` of
  ``params.resource`` (``nvidia.com/gpu``) in the flavor that holds it, or in ``params.flavor`` when the queue
  has the resource in several flavors (then it must be named: the same number in each would multiply the
  quota); read, then a JSON merge patch of ``spec.resourceGroups``, which Kueue accepts on a live queue.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Any

from vigil.model import Action, parse_entity
from vigil.remedy.actuators.base import ActuatorError
from vigil.sources.collect.kube_jobs import JOBSET_LABEL, KUBEFLOW_JOB_LABEL

KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta1"
GPU_RESOURCE = "nvidia.com/gpu"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
NOTICE_AT = "vigil.dev/preempt-at"
NOTICE_SIGNAL = "vigil.dev/preempt-signal"
MERGE_PATCH = "application/merge-patch+json"
_K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
# a resource name (k8s.io/apimachinery's qualified name): an optional DNS-subdomain prefix and a name
_RESOURCE_NAME = re.compile(r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


@dataclass(frozen=True)
class JobKind:
    """A kind of job object: where the API serves it, the label on its pods, where its suspend flag is."""

    kind: str
    group: str
    version: str
    plural: str
    pod_label: str
    suspend: tuple[str, ...]

    def __str__(self) -> str:
        return self.kind


RUN_POLICY_SUSPEND = ("spec", "runPolicy", "suspend")
JOB_KINDS = (
    JobKind("Job", "batch", "v1", "jobs", JOB_NAME_LABEL, ("spec", "suspend")),
    JobKind("PyTorchJob", "kubeflow.org", "v1", "pytorchjobs", KUBEFLOW_JOB_LABEL, RUN_POLICY_SUSPEND),
    JobKind("JobSet", "jobset.x-k8s.io", "v1alpha2", "jobsets", JOBSET_LABEL, ("spec", "suspend")),
    # training-operator v1.9: TFJobSpec.runPolicy (RunPolicy.suspend), replicas under spec.tfReplicaSpecs
    JobKind("TFJob", "kubeflow.org", "v1", "tfjobs", KUBEFLOW_JOB_LABEL, RUN_POLICY_SUSPEND),
    # the MPI Operator (v0.4 and later): MPIJobSpec.runPolicy.suspend, replicas under spec.mpiReplicaSpecs; its
    # workers and its launcher Job's pod template carry training.kubeflow.org/job-name
    JobKind("MPIJob", "kubeflow.org", "v2beta1", "mpijobs", KUBEFLOW_JOB_LABEL, RUN_POLICY_SUSPEND),
    # the training operator's own MPIJob (v1.9; one CRD mpijobs.kubeflow.org, so a cluster serves one of the two)
    JobKind("MPIJob", "kubeflow.org", "v1", "mpijobs", KUBEFLOW_JOB_LABEL, RUN_POLICY_SUSPEND),
)
# the kinds by name, each once (MPIJob is served under two versions)
JOB_KIND_NAMES = tuple(dict.fromkeys(kind.kind for kind in JOB_KINDS))
# the label each job controller puts on its pods, naming the job: batch/v1 Job; Kubeflow's PyTorchJob, TFJob and
# MPIJob; JobSet
JOB_POD_LABELS = tuple(dict.fromkeys(kind.pod_label for kind in JOB_KINDS))


def job_ref(target: str) -> tuple[str, str]:
    """``job/<namespace>:<name>`` as (namespace, name)."""
    namespace, _, name = parse_entity(target)[1][0].partition(":")
    if not _K8S_NAME.match(namespace) or not _K8S_NAME.match(name):
        raise ActuatorError(f"{target}: a Kubernetes job is named job/<namespace>:<name>")
    return namespace, name


def notice_deadline(action: Action) -> str:
    """When the preemption takes effect (``params.effective_ts``, else the action's time), RFC 3339 UTC."""
    effective = float(action.params.get("effective_ts", action.ts))
    return dt.datetime.fromtimestamp(effective, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _nested(obj: dict[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        obj = obj.get(key) if isinstance(obj, dict) else None  # type: ignore[assignment]
    return obj


def _patch_at(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    patch: Any = value
    for key in reversed(path):
        patch = {key: patch}
    return dict(patch)


@dataclass(frozen=True)
class Declined:
    """The API server's answer was an HTTP error the caller expects and handles (``KubeJobs._call``'s
    ``expected``): 404 not there, 409 exists already, 429 a PodDisruptionBudget forbids an eviction now."""

    status: int


class KubeJobs:
    """Job lookups and changes on the official client's ``core`` (CoreV1Api) and ``custom`` (CustomObjectsApi)."""

    client: Any
    core: Any
    custom: Any

    def _call(self, what: str, fn: Any, *args: Any, expected: tuple[int, ...] = (), **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``, its answer; an HTTP error whose status is ``expected`` comes back as
        ``Declined``. Any other HTTP error, and an API server that cannot be reached, fail the action in one
        line naming ``what``."""
        # unreachable: urllib3's errors once the client's retries are spent (MaxRetryError over a refused
        # connection or a timeout, which is no OSError), and OSError
        from urllib3.exceptions import HTTPError

        try:
            return fn(*args, **kwargs)
        except self.client.exceptions.ApiException as err:
            if err.status in expected:
                return Declined(err.status)
            raise ActuatorError(f"{what}: HTTP {err.status} {err.reason}") from None
        except (OSError, HTTPError) as err:
            raise ActuatorError(f"{what}: {err}") from None

    def _job_pods(self, namespace: str, name: str) -> list[Any]:
        """The job's pods, by the first of ``JOB_POD_LABELS`` that finds any."""
        for label in JOB_POD_LABELS:
            pods = self._call(f"list pods of job {namespace}/{name}", self.core.list_namespaced_pod, namespace,
                              label_selector=f"{label}={name}").items
            if pods:
                return list(pods)
        return []

    def _job_object(self, namespace: str, name: str) -> tuple[JobKind, dict[str, Any]] | None:
        """The job object (the first of ``JOB_KINDS`` the API has under that name), or None."""
        for kind in JOB_KINDS:
            found = self._call(f"read {kind} {namespace}/{name}", self.custom.get_namespaced_custom_object,
                               kind.group, kind.version, namespace, kind.plural, name, expected=(404,))
            if not isinstance(found, Declined):  # 404: not this kind (or its CRD is not installed)
                return kind, dict(found)
        return None

    def _require_job(self, namespace: str, name: str) -> tuple[JobKind, dict[str, Any]]:
        found = self._job_object(namespace, name)
        if found is None:
            raise ActuatorError(f"job {namespace}/{name} is not a {', '.join(JOB_KIND_NAMES[:-1])} or "
                                f"{JOB_KIND_NAMES[-1]} in the API")
        return found

    def _workload_of(self, namespace: str, job: dict[str, Any]) -> dict[str, Any] | None:
        """The Kueue Workload of a job object (label ``kueue.x-k8s.io/job-uid``), or None."""
        uid = job.get("metadata", {}).get("uid")
        if not uid:
            return None
        found = self._call(f"list workloads in {namespace}", self.custom.list_namespaced_custom_object, KUEUE_GROUP,
                           KUEUE_VERSION, namespace, "workloads", label_selector=f"{JOB_UID_LABEL}={uid}",
                           expected=(404,))
        if isinstance(found, Declined):  # Kueue is not installed
            return None
        items = found.get("items", [])
        return dict(items[0]) if items else None

    def _patch_job(self, kind: JobKind, namespace: str, name: str, patch: dict[str, Any], what: str) -> None:
        self._call(f"{what} {kind} {namespace}/{name}", self.custom.patch_namespaced_custom_object, kind.group,
                   kind.version, namespace, kind.plural, name, patch, _content_type=MERGE_PATCH)

    # ------------------------------------------------------------------ notice

    def describe_notice(self, action: Action) -> str:
        namespace, name = job_ref(action.target)
        return (f"annotate job {namespace}/{name} and its pods (label {' or '.join(JOB_POD_LABELS)}) "
                f"{NOTICE_AT}={notice_deadline(action)}")

    def send_notice(self, action: Action) -> str:
        """Annotate the job object and every pod of the job with the deadline and the signal."""
        namespace, name = job_ref(action.target)
        deadline = notice_deadline(action)
        signal = str(action.params.get("signal", "USR1"))
        patch = {"metadata": {"annotations": {NOTICE_AT: deadline, NOTICE_SIGNAL: signal}}}
        found = self._job_object(namespace, name)
        pods = self._job_pods(namespace, name)
        if found is None and not pods:
            raise ActuatorError(f"job {namespace}/{name} has no job object ({', '.join(JOB_KIND_NAMES)}) and no "
                                f"pods (labels {', '.join(JOB_POD_LABELS)})")
        if found is not None:
            self._patch_job(found[0], namespace, name, patch, "annotate")
        for pod in pods:
            self._call(f"annotate pod {namespace}/{pod.metadata.name}", self.core.patch_namespaced_pod,
                       pod.metadata.name, namespace, patch, _content_type=MERGE_PATCH)
        what = f"{found[0]} {namespace}/{name}" if found is not None else f"job {namespace}/{name}"
        return f"notice to {what} and {len(pods)} pods: checkpoint before {deadline}"

    # ------------------------------------------------------------------ preempt / resume

    def is_preempted(self, namespace: str, name: str) -> bool | None:
        """True when the job is held (its Workload inactive, or, without one, the object suspended); None when
        there is no such job."""
        found = self._job_object(namespace, name)
        if found is None:
            return None
        kind, job = found
        workload = self._workload_of(namespace, job)
        if workload is not None:
            return workload.get("spec", {}).get("active", True) is False
        return _nested(job, kind.suspend) is True

    def set_held(self, namespace: str, name: str, held: bool, *, kueue_only: bool = False) -> str:
        """Preempt (``held``) or resume the job: its Kueue Workload's ``spec.active``, or without a Workload the
        object's suspend flag (refused with ``kueue_only``)."""
        kind, job = self._require_job(namespace, name)
        workload = self._workload_of(namespace, job)
        if workload is not None:
            workload_name = workload["metadata"]["name"]
            self._call(f"{'deactivate' if held else 'activate'} Workload {namespace}/{workload_name}",
                       self.custom.patch_namespaced_custom_object, KUEUE_GROUP, KUEUE_VERSION, namespace, "workloads",
                       workload_name, {"spec": {"active": not held}}, _content_type=MERGE_PATCH)
            if held:
                return f"Workload {namespace}/{workload_name} deactivated: Kueue evicts {kind} {namespace}/{name}"
            return f"Workload {namespace}/{workload_name} active again: Kueue admits {kind} {namespace}/{name} by quota"
        if kueue_only:
            raise ActuatorError(f"job {namespace}/{name} has no Kueue Workload")
        self._patch_job(kind, namespace, name, _patch_at(kind.suspend, held), "suspend" if held else "resume")
        flag = ".".join(kind.suspend)
        if held:
            return f"{kind} {namespace}/{name} suspended ({flag}=true): its controller stops the pods, the job stays"
        return f"{kind} {namespace}/{name} resumed ({flag}=false): its controller starts the pods again"

    # ------------------------------------------------------------------ quota

    @staticmethod
    def quota(action: Action) -> tuple[str, str, int]:
        """(ClusterQueue, resource, units) of a set_quota, checked (``params.flavor`` too, when given)."""
        queue, resource = action.params.get("queue"), action.params.get("resource", GPU_RESOURCE)
        units, flavor = action.params.get("units"), action.params.get("flavor")
        if not isinstance(queue, str) or not _K8S_NAME.match(queue):
            raise ActuatorError(f"set_quota needs params.queue, a ClusterQueue name, got {queue!r}")
        if not isinstance(resource, str) or not _RESOURCE_NAME.match(resource):
            raise ActuatorError(f"set_quota needs params.resource, a resource name (nvidia.com/gpu, cpu), "
                                f"got {resource!r}")
        if not isinstance(units, int) or isinstance(units, bool) or units < 0:
            raise ActuatorError(f"set_quota needs params.units, a count of at least 0, got {units!r}")
        if flavor is not None and (not isinstance(flavor, str) or not _K8S_NAME.match(flavor)):
            raise ActuatorError(f"set_quota params.flavor must be a ResourceFlavor name, got {flavor!r}")
        return queue, resource, units

    def describe_quota(self, action: Action) -> str:
        queue, resource, units = self.quota(action)
        flavor = action.params.get("flavor")
        return f"set ClusterQueue {queue} nominalQuota {resource}={units}" + (f" in flavor {flavor}" if flavor else "")

    def _cluster_queue(self, name: str) -> dict[str, Any]:
        return dict(self._call(f"read ClusterQueue {name}", self.custom.get_cluster_custom_object,
                               KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", name))

    @staticmethod
    def _quotas(queue_name: str, spec: dict[str, Any], resource: str, flavor: str | None) -> list[dict[str, Any]]:
        """The quota entries of ``resource`` a set_quota sets: the one flavor's that has it, or ``flavor``'s."""
        held = [(f.get("name", ""), r) for group in spec.get("resourceGroups", []) for f in group.get("flavors", [])
                for r in f.get("resources", []) if r.get("name") == resource]
        names = ", ".join(name for name, _ in held)
        if flavor is not None:
            chosen = [r for name, r in held if name == flavor]
            if not chosen:
                raise ActuatorError(f"ClusterQueue {queue_name} has no quota for {resource} in flavor {flavor}"
                                    + (f" (it has one in {names})" if held else ""))
            return chosen
        if not held:
            raise ActuatorError(f"ClusterQueue {queue_name} has no quota for {resource}")
        if len(held) > 1:
            raise ActuatorError(f"ClusterQueue {queue_name} has {resource} in flavors {names}: name one "
                                "(params.flavor, --flavor)")
        return [held[0][1]]

    def quota_problem(self, action: Action) -> str | None:
        """Why the ClusterQueue cannot take this set_quota as given (no such queue, resource or flavor, or a
        flavor to name), read from the API; None when it can, or when the API cannot tell (the action then
        fails or succeeds on its own)."""
        queue, resource, _ = self.quota(action)
        try:
            found = self._call(f"read ClusterQueue {queue}", self.custom.get_cluster_custom_object, KUEUE_GROUP,
                               KUEUE_VERSION, "clusterqueues", queue, expected=(404,))
        except ActuatorError:  # the API cannot tell
            return None
        if isinstance(found, Declined):
            return f"no ClusterQueue {queue} in the API"
        try:
            self._quotas(queue, dict(found).get("spec", {}), resource, action.params.get("flavor"))
        except ActuatorError as err:
            return str(err)
        return None

    def quota_is_set(self, action: Action) -> bool:
        queue, resource, units = self.quota(action)
        quotas = self._quotas(queue, self._cluster_queue(queue).get("spec", {}), resource,
                              action.params.get("flavor"))
        return all(str(r.get("nominalQuota")) == str(units) for r in quotas)

    def set_quota(self, action: Action) -> str:
        queue, resource, units = self.quota(action)
        spec = self._cluster_queue(queue).get("spec", {})
        groups = spec.get("resourceGroups", [])
        flavor = action.params.get("flavor")
        for quota in self._quotas(queue, spec, resource, flavor):
            quota["nominalQuota"] = units
        self._call(f"patch ClusterQueue {queue}", self.custom.patch_cluster_custom_object, KUEUE_GROUP,
                   KUEUE_VERSION, "clusterqueues", queue, {"spec": {"resourceGroups": groups}},
                   _content_type=MERGE_PATCH)
        return f"ClusterQueue {queue} nominalQuota {resource}={units}" + (f" in flavor {flavor}" if flavor else "")
