"""The tiers on Kubernetes through the official client, against a local server answering with objects in the
real API's shapes (tests/fixtures/tide/kube): PriorityClasses and Kueue queues created once, ClusterQueue
quotas set per interval, notices as annotations, preemption by deactivating the Kueue Workload."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
import yaml
from kubernetes import client

from tests.conftest import REPO
from tests.remedy.kube_server import serve
from tests.tide.kube_api import RecordedApi
from tests.tide.tide_inputs import plan_of
from vigil.model import Action, ActionKind, ActionStatus, new_id
from vigil.remedy.actuators.base import ActuatorError
from vigil.remedy.actuators.kueue import NOTICE_AT, KueueActuator, job_ref
from vigil.remedy.audit import AuditLog
from vigil.remedy.remediator import Remediator
from vigil.remedy.tide.act import tide_actions
from vigil.remedy.tide.kube import admitted_tier_jobs, cluster_queues, kueue_objects, priority_classes
from vigil.remedy.tide.tiers import load_tier_policy

POLICY = load_tier_policy()
QUEUE = "/apis/kueue.x-k8s.io/v1beta1/clusterqueues/vigil-spot-training"


def fresh(actions: list[Action]) -> list[Action]:
    """The same actions as new records (the audit log keeps one record per action id)."""
    return [a.model_copy(update={"id": new_id("act")}) for a in actions]


@pytest.fixture
def kube() -> Iterator[tuple[RecordedApi, KueueActuator]]:
    api = RecordedApi("clusterqueues.json", "jobs.json", "workloads.json", "pods.json")
    with serve(api) as url:  # type: ignore[arg-type]
        yield api, KueueActuator(client.ApiClient(client.Configuration(host=url)))


def test_admitted_jobs_of_the_preemptible_tiers_with_their_gpus(kube: tuple[RecordedApi, KueueActuator]) -> None:
    _, kueue = kube
    jobs = {j.id: (j.tier, j.units) for j in admitted_tier_jobs(kueue.workloads(), POLICY)}
    assert jobs == {"ml:train-spot-a": (3, 16), "ml:train-spot-b": (3, 32), "ml:batch-embed": (4, 8)}


def test_plan_becomes_quota_notice_and_preemption_dry_run_then_for_real(
    kube: tuple[RecordedApi, KueueActuator], tmp_path: object
) -> None:
    api, kueue = kube
    jobs = admitted_tier_jobs(kueue.workloads(), POLICY)
    # tier 3 holds 48 and drops to 16 within the notice lead; tier 4 loses its 8 now
    actions = tide_actions(plan_of([48, 48, 16, 16], [0, 0, 0, 0]), POLICY, jobs, [], 1_764_576_000.0,
                           cluster="prod", queues=cluster_queues(POLICY), resource="nvidia.com/gpu")
    assert [(a.kind, a.target) for a in actions] == [
        (ActionKind.SET_QUOTA, "cluster/prod"), (ActionKind.SET_QUOTA, "cluster/prod"),
        (ActionKind.PREEMPT_NOTICE, "job/ml:train-spot-b"), (ActionKind.PREEMPT, "job/ml:batch-embed")]

    audit = AuditLog(f"sqlite:///{tmp_path}/audit.db")
    before = len(api.requests)
    proposed = Remediator([kueue], audit, dry_run=True).execute_all(actions)
    assert [a.status for a in proposed] == [ActionStatus.PROPOSED] * 4
    assert proposed[0].result == "dry-run: would set ClusterQueue vigil-spot-training nominalQuota nvidia.com/gpu=48"
    assert not [r for r in api.requests[before:] if r[0] != "GET"], "a dry-run changes nothing"

    done = Remediator([kueue], audit, dry_run=False).execute_all(fresh(actions))
    assert [a.status for a in done] == [ActionStatus.EXECUTED] * 4, [a.result for a in done]
    patches = [r for r in api.requests if r[0] == "PATCH"]
    assert (QUEUE, {"spec": {"resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
        {"name": "vigil-gpu", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 48,
                                             "borrowingLimit": "0"}]}]}]}}) in [(p, b) for _, p, b in patches]
    assert api.objects[QUEUE]["spec"]["preemption"]["reclaimWithinCohort"] == "Never"  # the rest untouched
    job = api.objects["/apis/batch/v1/namespaces/ml/jobs/train-spot-b"]
    assert job["metadata"]["annotations"][NOTICE_AT] == "2025-12-01T08:15:00Z"  # the notice lead ahead
    noticed = [p for key, p in api.objects.items() if "/pods/train-spot-b-" in key]
    assert len(noticed) == 2 and all(NOTICE_AT in p["metadata"]["annotations"] for p in noticed)
    assert all(NOTICE_AT not in p["metadata"]["annotations"] for key, p in api.objects.items()
               if "/pods/train-spot-a-" in key)
    workload = api.objects["/apis/kueue.x-k8s.io/v1beta1/namespaces/ml/workloads/job-batch-embed-0b9f4"]
    assert workload["spec"]["active"] is False

    assert admitted_tier_jobs(kueue.workloads(), POLICY, inactive=True)[0].id == "ml:batch-embed"
    resume = Action(ts=0.0, kind=ActionKind.RESTART_JOB, target="job/ml:batch-embed")
    (resumed,) = Remediator([kueue], audit, dry_run=False).execute_all([resume])
    path = "/apis/kueue.x-k8s.io/v1beta1/namespaces/ml/workloads/job-batch-embed-0b9f4"
    assert resumed.status is ActionStatus.EXECUTED and api.objects[path]["spec"]["active"] is True
    (again_resumed,) = Remediator([kueue], audit, dry_run=False).execute_all(fresh([resume]))
    assert again_resumed.status is ActionStatus.SKIPPED
    api.objects[path]["spec"]["active"] = False

    # idempotent: the quota is there and the workload inactive, per the API
    again = Remediator([kueue], audit, dry_run=False).execute_all(
        fresh([a for a in actions if a.kind is not ActionKind.PREEMPT_NOTICE]))
    assert [a.status for a in again] == [ActionStatus.SKIPPED] * 3, [
        a.result for a in again]
    assert len(audit.actions()) == 4 + 4 + 2 + 3


def test_api_refusals_and_bad_targets_fail_the_action_not_the_process(kube: tuple[RecordedApi, KueueActuator],
                                                                     tmp_path: object) -> None:
    _, kueue = kube
    missing = Action(ts=0.0, kind=ActionKind.SET_QUOTA, target="cluster/prod",
                     params={"queue": "vigil-nope", "resource": "nvidia.com/gpu", "units": 8})
    (failed,) = Remediator([kueue], AuditLog(f"sqlite:///{tmp_path}/a.db"), dry_run=False).execute_all([missing])
    assert failed.status is ActionStatus.FAILED and "HTTP 404" in failed.result
    with pytest.raises(ActuatorError, match="namespace"):
        job_ref("job/train-spot-a")
    no_gpu_quota = missing.model_copy(update={"params": {"queue": "vigil-spot-training", "resource": "cpu",
                                                          "units": 8}})
    with pytest.raises(ActuatorError, match="no quota for cpu"):
        kueue.execute(no_gpu_quota)


def test_setup_creates_priority_classes_and_queues_once() -> None:
    api = RecordedApi()
    objects = priority_classes(POLICY) + kueue_objects(POLICY, ["ml"])
    with serve(api) as url:  # type: ignore[arg-type]
        kueue = KueueActuator(client.ApiClient(client.Configuration(host=url)))
        first = kueue.ensure(objects)
        second = kueue.ensure(objects)
    assert len(first) == 4 + 1 + 4 + 4 and all(r.endswith("created") for r in first)
    assert all(r.endswith("exists") for r in second)
    spot_class = api.objects["/apis/scheduling.k8s.io/v1/priorityclasses/vigil-tier3-spot-training"]
    assert (spot_class["value"], spot_class["preemptionPolicy"]) == (100000, "PreemptLowerPriority")
    offline = api.objects["/apis/scheduling.k8s.io/v1/priorityclasses/vigil-tier4-offline-inference"]
    assert offline["preemptionPolicy"] == "Never"
    serving = api.objects["/apis/kueue.x-k8s.io/v1beta1/clusterqueues/vigil-online-inference"]["spec"]
    assert serving["preemption"]["reclaimWithinCohort"] == "Any" and serving["cohort"] == "vigil-tide"
    local = api.objects["/apis/kueue.x-k8s.io/v1beta1/namespaces/ml/localqueues/spot-training"]
    assert local["spec"]["clusterQueue"] == "vigil-spot-training"


def test_cli_prints_the_manifests_without_execute() -> None:
    done = subprocess.run([sys.executable, "-m", "vigil", "tide", "kube-setup", "--namespace", "ml"],
                          capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120)
    assert done.returncode == 0, done.stderr
    kinds = [doc["kind"] for doc in yaml.safe_load_all(done.stdout)]
    assert kinds.count("PriorityClass") == 4 and kinds.count("ClusterQueue") == 4 and kinds.count("LocalQueue") == 4
    bad = subprocess.run([sys.executable, "-m", "vigil", "tide", "apply", "--trace", "x.csv", "--backend", "nomad"],
                         capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120)
    assert bad.returncode == 2 and "--backend must be slurm or kubernetes" in bad.stderr
