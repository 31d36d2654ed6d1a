"""Training jobs and their rank -> node / GPU placement from Kubernetes pods, through the official client.

A pod belongs to a training job by its labels: the Kubeflow training operator's
``training.kubeflow.org/job-name`` with ``training.kubeflow.org/replica-type`` and ``replica-index``
(PyTorchJob: the master is rank 0, worker i is rank i + 1), a JobSet's ``jobset.sigs.k8s.io/jobset-name``
with ``batch.kubernetes.io/job-completion-index``, or Vigil's own ``vigil.io/job`` with ``vigil.io/rank``.
A pod runs one rank per GPU it is granted (``nvidia.com/gpu``). Which physical GPUs the device plugin gave
it is not in the API, so a node's GPUs are handed out in index order to its pods in rank order - exact for
whole-node pods, the usual shape of training jobs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vigil.model import Job, Topology
from vigil.sources.collect.kube_client import kube_api_client

# the label naming the job that the Kubeflow training operator and the JobSet controller put on their pods
KUBEFLOW_JOB_LABEL = "training.kubeflow.org/job-name"
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
JOB_LABELS = (
    (KUBEFLOW_JOB_LABEL, "training.kubeflow.org/replica-index"),
    (JOBSET_LABEL, "batch.kubernetes.io/job-completion-index"),
    ("vigil.io/job", "vigil.io/rank"),
)
REPLICA_TYPE = "training.kubeflow.org/replica-type"
GPU_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True)
class JobPod:
    job: str
    order: tuple[int, int]  # (replica type: master first, index)
    node: str
    gpus: int


def _gpus(pod: Any) -> int:
    total = 0
    for container in pod.spec.containers or []:
        limits = (container.resources.limits or {}) if container.resources else {}
        total += int(limits.get(GPU_RESOURCE, 0) or 0)
    return total


def job_pod(pod: Any) -> JobPod | None:
    """The training-job facts of one V1Pod, or None for a pod of no job, not scheduled or finished."""
    labels = pod.metadata.labels or {}
    if not pod.spec.node_name or (pod.status and pod.status.phase in ("Succeeded", "Failed")):
        return None
    for job_label, index_label in JOB_LABELS:
        if job_label in labels:
            kind = labels.get(REPLICA_TYPE, "").lower()
            index = int(labels.get(index_label, "0") or 0)
            return JobPod(labels[job_label], (0 if kind == "master" else 1, index), pod.spec.node_name, _gpus(pod))
    return None


class KubernetesJobs:
    """Reads pods with ``list_pod_for_all_namespaces`` (CoreV1Api, or a stand-in answering the same call)."""

    def __init__(self, api: Any = None, timeout_s: float = 10.0) -> None:
        if api is None:
            from kubernetes import client

            api = client.CoreV1Api(kube_api_client())
        self.api = api
        self.timeout_s = timeout_s

    def pods(self) -> list[JobPod]:
        found = []
        for job_label, _ in JOB_LABELS:
            answer = self.api.list_pod_for_all_namespaces(label_selector=job_label, _request_timeout=self.timeout_s)
            found += [p for p in (job_pod(item) for item in answer.items) if p is not None]
        return found

    def jobs(self, topology: Topology) -> list[Job]:
        return placements(self.pods(), topology)


def placements(pods: list[JobPod], topology: Topology) -> list[Job]:
    """Each job's ranks on GPUs: pods in rank order, one rank per granted GPU, a node's GPUs in index order."""
    free: dict[str, list[str]] = {n.name: [g.id for g in sorted(n.gpus, key=lambda g: g.index)]
                                  for n in topology.nodes}
    by_job: dict[str, list[JobPod]] = {}
    for pod in pods:
        by_job.setdefault(pod.job, []).append(pod)
    jobs = []
    for name in sorted(by_job):
        placement: list[str] = []
        for pod in sorted(by_job[name], key=lambda p: p.order):
            available = free.get(pod.node, [])
            placement += available[: pod.gpus]
            del available[: pod.gpus]
        jobs.append(Job(id=name, name=name, placement=placement))
    return jobs
