"""Preemption notices, preemption, restarts and quotas on Kubernetes for batch/v1 Jobs, PyTorchJobs, JobSets, TFJobs
and MPIJobs (the MPI Operator's v2beta1 and the training operator's v1), through the official client against a
local server answering with objects in the API's shapes (tests/fixtures/tide/kube, tests/fixtures/remedy/kube; no
API server runs here)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from typer.testing import CliRunner

from tests.remedy.kube_server import serve, use_kubeconfig
from tests.tide.kube_api import RecordedApi
from vigil.config import settings
from vigil.faces.cli.remedy import app
from vigil.model import Action, ActionKind, ActionStatus, Node, Topology, new_id
from vigil.remedy.actuators.base import ActuatorError
from vigil.remedy.actuators.kubernetes import KubernetesActuator
from vigil.remedy.actuators.kueue import NOTICE_AT, NOTICE_SIGNAL, KueueActuator
from vigil.remedy.audit import AuditLog
from vigil.remedy.remediator import Remediator

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "remedy" / "kube"
PYTORCHJOB = "/apis/kubeflow.org/v1/namespaces/ml-training/pytorchjobs/llama-ft"
JOBSET = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/ml/jobsets/rl-rollout"
JOBSET_WORKLOAD = "/apis/kueue.x-k8s.io/v1beta1/namespaces/ml/workloads/jobset-rl-rollout-3e9a1"
BATCH_JOB = "/apis/batch/v1/namespaces/ml/jobs/train-spot-a"
BATCH_WORKLOAD = "/apis/kueue.x-k8s.io/v1beta1/namespaces/ml/workloads/job-train-spot-a-5c1d2"
QUEUE = "/apis/kueue.x-k8s.io/v1beta1/clusterqueues/vigil-spot-training"
TFJOB = "/apis/kubeflow.org/v1/namespaces/ml-training/tfjobs/tf-resnet"
MPIJOB = "/apis/kubeflow.org/v2beta1/namespaces/ml/mpijobs/mpi-allreduce"
MPIJOB_WORKLOAD = "/apis/kueue.x-k8s.io/v1beta1/namespaces/ml/workloads/mpijob-mpi-allreduce-8c2d4"
MPIJOB_V1 = "/apis/kubeflow.org/v1/namespaces/legacy/mpijobs/hvd-bert"
KUBEFLOW_TARGETS = ("job/ml-training:tf-resnet", "job/ml:mpi-allreduce", "job/legacy:hvd-bert")


def recorded() -> RecordedApi:
    api = RecordedApi("clusterqueues.json", "jobs.json", "workloads.json", "pods.json")
    api.add(json.loads((FIXTURES / "pytorchjob-pods.json").read_text()))
    api.add(json.loads((FIXTURES / "training-jobs.json").read_text()))
    api.add(json.loads((FIXTURES / "kubeflow-jobs.json").read_text()))
    return api


@pytest.fixture
def api_url() -> Iterator[tuple[RecordedApi, str]]:
    api = recorded()
    with serve(api) as url:  # type: ignore[arg-type]
        yield api, url


def job_action(kind: ActionKind, target: str, **params: object) -> Action:
    return Action(ts=1_764_576_000.0, kind=kind, target=target, reason="tier 3 loses its GPUs",
                  params={"effective_ts": 1_764_576_900.0, **params})


def annotated_pods(api: RecordedApi, prefix: str) -> list[str]:
    return sorted(key.rsplit("/", 1)[-1] for key, obj in api.objects.items()
                  if f"/pods/{prefix}" in key and NOTICE_AT in obj["metadata"].get("annotations", {}))


@pytest.mark.parametrize("actuator_class", [KueueActuator, KubernetesActuator])
def test_a_notice_reaches_the_pods_of_a_job_a_pytorchjob_and_a_jobset(
    api_url: tuple[RecordedApi, str], actuator_class: type[KueueActuator] | type[KubernetesActuator]
) -> None:
    api, url = api_url
    actuator = actuator_class(client.ApiClient(client.Configuration(host=url)))
    result = actuator.execute(job_action(ActionKind.PREEMPT_NOTICE, "job/ml-training:llama-ft"))
    assert result == "notice to PyTorchJob ml-training/llama-ft and 2 pods: checkpoint before 2025-12-01T08:15:00Z"
    assert annotated_pods(api, "llama-ft-") == ["llama-ft-master-0", "llama-ft-worker-0"]
    assert api.objects[PYTORCHJOB]["metadata"]["annotations"] == {NOTICE_AT: "2025-12-01T08:15:00Z",
                                                                   NOTICE_SIGNAL: "USR1"}
    result = actuator.execute(job_action(ActionKind.PREEMPT_NOTICE, "job/ml:rl-rollout", signal="TERM"))
    assert result.startswith("notice to JobSet ml/rl-rollout and 2 pods")
    assert annotated_pods(api, "rl-rollout-") == ["rl-rollout-workers-0-0-h2k8d", "rl-rollout-workers-0-1-h2k8d"]
    assert api.objects[JOBSET]["metadata"]["annotations"][NOTICE_SIGNAL] == "TERM"
    # a batch/v1 Job as before; its neighbours hear nothing
    assert actuator.execute(job_action(ActionKind.PREEMPT_NOTICE, "job/ml:train-spot-a")).startswith(
        "notice to Job ml/train-spot-a and 2 pods")
    assert annotated_pods(api, "train-spot-") == ["train-spot-a-0-x7k2p", "train-spot-a-1-x7k2p"]
    with pytest.raises(ActuatorError, match="has no job object .* and no pods"):
        actuator.execute(job_action(ActionKind.PREEMPT_NOTICE, "job/ml:nosuchjob"))


def test_preempt_deactivates_the_kueue_workload_or_suspends_the_job(api_url: tuple[RecordedApi, str],
                                                                    tmp_path: Path) -> None:
    api, url = api_url
    kube = KubernetesActuator(client.ApiClient(client.Configuration(host=url)))
    audit = AuditLog(f"sqlite:///{tmp_path}/audit.db")
    targets = ["job/ml:rl-rollout", "job/ml-training:llama-ft", "job/ml:train-spot-a"]
    before = len(api.requests)
    proposed = Remediator([kube], audit).execute_all([job_action(ActionKind.PREEMPT, t) for t in targets])
    assert [a.status for a in proposed] == [ActionStatus.PROPOSED] * 3
    assert "deactivate the Kueue Workload of job ml/rl-rollout" in proposed[0].result
    assert not [r for r in api.requests[before:] if r[0] != "GET"], "a dry-run changes nothing"

    done = Remediator([kube], audit, dry_run=False).execute_all([job_action(ActionKind.PREEMPT, t) for t in targets])
    assert [a.status for a in done] == [ActionStatus.EXECUTED] * 3, [a.result for a in done]
    # Kueue manages the JobSet and the batch Job: their Workloads go inactive, the objects are left to Kueue
    assert api.objects[JOBSET_WORKLOAD]["spec"]["active"] is False
    assert api.objects[JOBSET]["spec"]["suspend"] is False
    assert api.objects[BATCH_WORKLOAD]["spec"]["active"] is False
    # the PyTorchJob has no Workload: its own suspend flag
    assert api.objects[PYTORCHJOB]["spec"]["runPolicy"]["suspend"] is True
    assert done[1].result.startswith("PyTorchJob ml-training/llama-ft suspended (spec.runPolicy.suspend=true)")
    patches = [(path, body) for method, path, body in api.requests if method == "PATCH"]
    assert (PYTORCHJOB, {"spec": {"runPolicy": {"suspend": True}}}) in patches

    again = Remediator([kube], audit, dry_run=False).execute_all(
        [job_action(ActionKind.PREEMPT, t).model_copy(update={"id": new_id("act")}) for t in targets])
    assert [a.status for a in again] == [ActionStatus.SKIPPED] * 3, [a.result for a in again]

    # its controller deleted the pods; restart_job resumes what preempt held
    for key in [k for k in api.objects if "/pods/llama-ft-" in k or "/pods/rl-rollout-" in k]:
        del api.objects[key]
    resumed = Remediator([kube], audit, dry_run=False).execute_all(
        [job_action(ActionKind.RESTART_JOB, t) for t in targets[:2]])
    assert [a.status for a in resumed] == [ActionStatus.EXECUTED] * 2, [a.result for a in resumed]
    assert api.objects[JOBSET_WORKLOAD]["spec"]["active"] is True
    assert api.objects[PYTORCHJOB]["spec"]["runPolicy"]["suspend"] is False


def test_a_batch_job_without_kueue_is_suspended(api_url: tuple[RecordedApi, str]) -> None:
    api, url = api_url
    del api.objects[BATCH_WORKLOAD]
    kube = KubernetesActuator(client.ApiClient(client.Configuration(host=url)))
    assert kube.execute(job_action(ActionKind.PREEMPT, "job/ml:train-spot-a")).startswith(
        "Job ml/train-spot-a suspended (spec.suspend=true)")
    assert api.objects[BATCH_JOB]["spec"]["suspend"] is True
    # the Kueue actuator (vigil tide) preempts only through Kueue
    kueue = KueueActuator(client.ApiClient(client.Configuration(host=url)))
    with pytest.raises(ActuatorError, match="has no Kueue Workload"):
        kueue.execute(job_action(ActionKind.PREEMPT, "job/ml-training:llama-ft"))
    with pytest.raises(ActuatorError, match="is not a Job, PyTorchJob, JobSet, TFJob or MPIJob"):
        kube.execute(job_action(ActionKind.PREEMPT, "job/ml:nosuchjob"))


def test_kueue_preempt_of_a_job_it_cannot_hold_fails_rather_than_skips(api_url: tuple[RecordedApi, str],
                                                                       tmp_path: Path) -> None:
    """A job that is not there, or that Kueue does not manage, is not already preempted: the action fails with
    the reason instead of being recorded as done."""
    _, url = api_url
    kueue = KueueActuator(client.ApiClient(client.Configuration(host=url)))
    audit = AuditLog(f"sqlite:///{tmp_path}/audit.db")
    done = Remediator([kueue], audit, dry_run=False).execute_all(
        [job_action(ActionKind.PREEMPT, t) for t in ("job/ml:nosuchjob", "job/ml-training:llama-ft")])
    assert [a.status for a in done] == [ActionStatus.FAILED] * 2, [a.result for a in done]
    assert "is not a Job, PyTorchJob, JobSet, TFJob or MPIJob" in done[0].result
    assert "has no Kueue Workload" in done[1].result


def test_set_quota_patches_the_cluster_queue(api_url: tuple[RecordedApi, str]) -> None:
    api, url = api_url
    kube = KubernetesActuator(client.ApiClient(client.Configuration(host=url)))
    quota = Action(ts=0.0, kind=ActionKind.SET_QUOTA, target="cluster/prod",
                   params={"queue": "vigil-spot-training", "resource": "nvidia.com/gpu", "units": 24})
    assert kube.accepts(quota) and kube.describe(quota) == (
        "set ClusterQueue vigil-spot-training nominalQuota nvidia.com/gpu=24")
    assert not kube.is_satisfied(quota)
    assert kube.execute(quota) == "ClusterQueue vigil-spot-training nominalQuota nvidia.com/gpu=24"
    resources = api.objects[QUEUE]["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
    assert [r["nominalQuota"] for r in resources if r["name"] == "nvidia.com/gpu"] == [24]
    assert kube.is_satisfied(quota)


def test_act_preempts_on_kubernetes_from_the_command_line(
    api_url: tuple[RecordedApi, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api, url = api_url
    monkeypatch.setenv("VIGIL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("VIGIL_DB_URL", f"sqlite:///{tmp_path}/vigil.db")
    monkeypatch.setenv("VIGIL_REMEDY_BACKEND", "kubernetes")
    settings.cache_clear()
    use_kubeconfig(tmp_path / "kubeconfig", url, monkeypatch)
    runner = CliRunner()
    try:
        notice = runner.invoke(app, ["act", "preempt_notice", "job/ml:rl-rollout", "--json"])
        assert notice.exit_code == 0, notice.output
        assert json.loads(notice.stdout)["status"] == "proposed"
        topology = tmp_path / "topology.json"
        topology.write_text(Topology(nodes=[Node(name=f"gpu-node-00{i}") for i in range(4)]).to_json())
        live = runner.invoke(app, ["act", "preempt", "job/ml:rl-rollout", "--execute", "--topology", str(topology),
                                   "--json"])
        assert live.exit_code == 0, live.output
        assert json.loads(live.stdout)["status"] == "executed"
        assert api.objects[JOBSET_WORKLOAD]["spec"]["active"] is False
        # a quota needs its queue and quantity: one line, nothing audited
        quota = runner.invoke(app, ["act", "set_quota", "cluster/prod"])
        assert quota.exit_code != 0 and "set_quota needs --queue" in str(quota.exception)
    finally:
        settings.cache_clear()


def test_tide_sees_a_jobset_kueue_admitted(api_url: tuple[RecordedApi, str]) -> None:
    from vigil.remedy.tide.kube import admitted_tier_jobs
    from vigil.remedy.tide.tiers import load_tier_policy

    _, url = api_url
    kueue = KueueActuator(client.ApiClient(client.Configuration(host=url)))
    jobs = {j.id: (j.tier, j.units) for j in admitted_tier_jobs(kueue.workloads(), load_tier_policy())}
    assert jobs["ml:rl-rollout"] == (3, 16)


def _permission(method: str, path: str) -> tuple[str, str, str]:
    """The (API group, resource, verb) RBAC checks for one request the actuator made."""
    parts = path.split("?")[0].strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    if rest and rest[0] == "namespaces" and len(rest) > 2:
        rest = rest[2:]
    resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    verb = {"GET": "get" if len(rest) > 1 else "list", "PATCH": "patch", "DELETE": "delete", "POST": "create",
            "PUT": "update"}[method]
    return group, resource, verb


def test_the_server_cluster_role_grants_what_the_job_actions_call(api_url: tuple[RecordedApi, str]) -> None:
    """deploy/kubernetes/server.yaml's ClusterRole lets `vigil serve --actuator kubernetes` make every call that
    notice, preempt, resume, restart and set_quota make (else each is a 403 on a real cluster)."""
    import yaml

    api, url = api_url
    kube = KubernetesActuator(client.ApiClient(client.Configuration(host=url)))
    for target in ("job/ml-training:llama-ft", "job/ml:rl-rollout", "job/ml:train-spot-a", *KUBEFLOW_TARGETS):
        kube.execute(job_action(ActionKind.PREEMPT_NOTICE, target))
        kube.execute(job_action(ActionKind.RESTART_JOB, target).model_copy(update={"ts": time.time()}))
        kube.is_satisfied(job_action(ActionKind.PREEMPT, target))
        kube.execute(job_action(ActionKind.PREEMPT, target))
        kube.execute(job_action(ActionKind.RESTART_JOB, target))
    quota = Action(ts=0.0, kind=ActionKind.SET_QUOTA, target="cluster/prod",
                   params={"queue": "vigil-spot-training", "units": 24})
    kube.is_satisfied(quota)
    kube.execute(quota)
    manifest = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "server.yaml"
    (role,) = [d for d in yaml.safe_load_all(manifest.read_text()) if d and d["kind"] == "ClusterRole"]
    granted = {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"]}
    needed = {_permission(method, path) for method, path, _ in api.requests}
    assert ("", "pods", "delete") in needed and ("kubeflow.org", "pytorchjobs", "patch") in needed
    assert {("kubeflow.org", "tfjobs", "patch"), ("kubeflow.org", "mpijobs", "patch")} <= needed
    assert needed <= granted, sorted(needed - granted)
    # and nothing more for the Kubeflow kinds than the job actions call
    kubeflow = {(group, resource, verb) for group, resource, verb in granted if group == "kubeflow.org"}
    assert kubeflow == {("kubeflow.org", plural, verb) for plural in ("pytorchjobs", "tfjobs", "mpijobs")
                        for verb in ("get", "patch")}


def test_kubeflow_tfjobs_and_mpijobs_are_notified_preempted_resumed_and_restarted(
    api_url: tuple[RecordedApi, str], tmp_path: Path
) -> None:
    """A TFJob (training-operator v1.9, kubeflow.org/v1), an MPIJob of the MPI Operator (kubeflow.org/v2beta1,
    Kueue-managed) and an MPIJob of the training operator (kubeflow.org/v1): their pods by
    training.kubeflow.org/job-name, their suspend flag at spec.runPolicy.suspend."""
    api, url = api_url
    kube = KubernetesActuator(client.ApiClient(client.Configuration(host=url)))
    results = [kube.execute(job_action(ActionKind.PREEMPT_NOTICE, t)) for t in KUBEFLOW_TARGETS]
    assert results[0] == "notice to TFJob ml-training/tf-resnet and 2 pods: checkpoint before 2025-12-01T08:15:00Z"
    assert results[1].startswith("notice to MPIJob ml/mpi-allreduce and 3 pods")
    assert results[2].startswith("notice to MPIJob legacy/hvd-bert and 2 pods")
    assert annotated_pods(api, "tf-resnet-") == ["tf-resnet-chief-0", "tf-resnet-worker-0"]
    # the launcher (a pod of the MPI Operator's launcher Job) hears it with the workers
    assert annotated_pods(api, "mpi-allreduce-") == ["mpi-allreduce-launcher-q8w5z", "mpi-allreduce-worker-0",
                                                      "mpi-allreduce-worker-1"]
    assert annotated_pods(api, "hvd-bert-") == ["hvd-bert-launcher", "hvd-bert-worker-0"]
    for path in (TFJOB, MPIJOB, MPIJOB_V1):
        assert api.objects[path]["metadata"]["annotations"][NOTICE_AT] == "2025-12-01T08:15:00Z"
    assert api.objects[MPIJOB_WORKLOAD]["metadata"].get("annotations") is None

    audit = AuditLog(f"sqlite:///{tmp_path}/audit.db")
    done = Remediator([kube], audit, dry_run=False).execute_all(
        [job_action(ActionKind.PREEMPT, t) for t in KUBEFLOW_TARGETS])
    assert [a.status for a in done] == [ActionStatus.EXECUTED] * 3, [a.result for a in done]
    assert done[0].result.startswith("TFJob ml-training/tf-resnet suspended (spec.runPolicy.suspend=true)")
    assert api.objects[TFJOB]["spec"]["runPolicy"]["suspend"] is True
    # Kueue manages the MPI Operator's job: its Workload goes inactive, the MPIJob is left to Kueue
    assert api.objects[MPIJOB_WORKLOAD]["spec"]["active"] is False
    assert api.objects[MPIJOB]["spec"]["runPolicy"]["suspend"] is False
    assert done[1].result.startswith("Workload ml/mpijob-mpi-allreduce-8c2d4 deactivated: Kueue evicts MPIJob")
    # the training operator's MPIJob: found under kubeflow.org/v1 after v2beta1 answered 404
    assert api.objects[MPIJOB_V1]["spec"]["runPolicy"]["suspend"] is True
    assert done[2].result.startswith("MPIJob legacy/hvd-bert suspended (spec.runPolicy.suspend=true)")
    patches = [(path, body) for method, path, body in api.requests if method == "PATCH"]
    assert (TFJOB, {"spec": {"runPolicy": {"suspend": True}}}) in patches
    assert (MPIJOB_V1, {"spec": {"runPolicy": {"suspend": True}}}) in patches
    assert [a.status for a in Remediator([kube], audit, dry_run=False).execute_all(
        [job_action(ActionKind.PREEMPT, t).model_copy(update={"id": new_id("act")}) for t in KUBEFLOW_TARGETS])
    ] == [ActionStatus.SKIPPED] * 3

    # a restart of a running job deletes its pods (made before the action), all of them, launcher included
    later = time.time()
    restarted = kube.execute(job_action(ActionKind.RESTART_JOB, "job/ml:mpi-allreduce").model_copy(
        update={"ts": later}))
    assert restarted.startswith("deleted 3 pods of job ml/mpi-allreduce (on gpu-node-000, gpu-node-001)")
    assert not [k for k in api.objects if "/pods/mpi-allreduce-" in k]
    # its controllers stopped the held jobs' pods; restart_job then resumes what preempt held
    for key in [k for k in api.objects if "/pods/tf-resnet-" in k or "/pods/hvd-bert-" in k]:
        del api.objects[key]
    resumed = Remediator([kube], audit, dry_run=False).execute_all(
        [job_action(ActionKind.RESTART_JOB, t) for t in KUBEFLOW_TARGETS])
    assert [a.status for a in resumed] == [ActionStatus.EXECUTED] * 3, [a.result for a in resumed]
    assert api.objects[TFJOB]["spec"]["runPolicy"]["suspend"] is False
    assert api.objects[MPIJOB_WORKLOAD]["spec"]["active"] is True
    assert api.objects[MPIJOB_V1]["spec"]["runPolicy"]["suspend"] is False


def test_the_kueue_actuator_and_the_tide_take_an_mpijob_kueue_admitted(api_url: tuple[RecordedApi, str]) -> None:
    from vigil.remedy.tide.kube import admitted_tier_jobs
    from vigil.remedy.tide.tiers import load_tier_policy

    api, url = api_url
    kueue = KueueActuator(client.ApiClient(client.Configuration(host=url)))
    jobs = {j.id: (j.tier, j.units) for j in admitted_tier_jobs(kueue.workloads(), load_tier_policy())}
    assert jobs["ml:mpi-allreduce"] == (3, 16)
    assert kueue.execute(job_action(ActionKind.PREEMPT, "job/ml:mpi-allreduce")).startswith(
        "Workload ml/mpijob-mpi-allreduce-8c2d4 deactivated")
    # a TFJob Kueue does not manage is not Kueue's to hold
    with pytest.raises(ActuatorError, match="has no Kueue Workload"):
        kueue.execute(job_action(ActionKind.PREEMPT, "job/ml-training:tf-resnet"))


TWO_FLAVOR_QUEUE = "/apis/kueue.x-k8s.io/v1beta1/clusterqueues/vigil-mixed"


def _two_flavor_queue(api: RecordedApi) -> None:
    """A ClusterQueue with nvidia.com/gpu in two flavors (H100 and A100 nodes), in Kueue v1beta1's shape."""
    api.add([{"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue",
              "metadata": {"name": "vigil-mixed", "uid": "cq-0001", "resourceVersion": "900"},
              "spec": {"cohort": "vigil-tide", "namespaceSelector": {},
                       "resourceGroups": [{"coveredResources": ["cpu", "nvidia.com/gpu"], "flavors": [
                           {"name": "h100", "resources": [{"name": "cpu", "nominalQuota": "512"},
                                                          {"name": "nvidia.com/gpu", "nominalQuota": "32"}]},
                           {"name": "a100", "resources": [{"name": "cpu", "nominalQuota": "256"},
                                                          {"name": "nvidia.com/gpu", "nominalQuota": "16"}]}]}]}}])


def _gpu_quotas(api: RecordedApi, path: str) -> dict[str, object]:
    return {f["name"]: r["nominalQuota"] for group in api.objects[path]["spec"]["resourceGroups"]
            for f in group["flavors"] for r in f["resources"] if r["name"] == "nvidia.com/gpu"}


@pytest.fixture
def cli_on_kube(api_url: tuple[RecordedApi, str], tmp_path: Path,
                monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[RecordedApi, AuditLog, str]]:
    """The remedy CLI on the Kubernetes back end against the recorded API; the topology --execute needs."""
    api, url = api_url
    _two_flavor_queue(api)
    topology = tmp_path / "topology.json"
    topology.write_text(Topology(nodes=[Node(name=f"gpu-node-00{i}") for i in range(4)]).to_json())
    monkeypatch.setenv("VIGIL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("VIGIL_DB_URL", f"sqlite:///{tmp_path}/vigil.db")
    monkeypatch.setenv("VIGIL_REMEDY_BACKEND", "kubernetes")
    settings.cache_clear()
    use_kubeconfig(tmp_path / "kubeconfig", url, monkeypatch)
    try:
        yield api, AuditLog(f"sqlite:///{tmp_path}/vigil.db"), str(topology)
    finally:
        settings.cache_clear()


def test_act_set_quota_takes_the_queue_resource_quantity_and_flavor(
    cli_on_kube: tuple[RecordedApi, AuditLog, str]
) -> None:
    api, audit, topology = cli_on_kube
    runner = CliRunner()
    argv = ["act", "set_quota", "cluster/prod", "--queue", "vigil-spot-training", "--resource", "nvidia.com/gpu",
            "--quantity", "64", "--reason", "more spot capacity tonight", "--json"]
    dry = runner.invoke(app, argv)
    assert dry.exit_code == 0, dry.output
    proposed = json.loads(dry.stdout)
    assert proposed["status"] == "proposed"
    assert proposed["params"] == {"queue": "vigil-spot-training", "resource": "nvidia.com/gpu", "units": 64,
                                  "actuator": "kubernetes"}
    assert proposed["result"] == "dry-run: would set ClusterQueue vigil-spot-training nominalQuota nvidia.com/gpu=64"
    assert not [r for r in api.requests if r[0] != "GET"]
    live = runner.invoke(app, [*argv, "--execute", "--topology", topology])
    assert live.exit_code == 0, live.output
    assert json.loads(live.stdout)["status"] == "executed"
    assert _gpu_quotas(api, QUEUE) == {"vigil-gpu": 64}
    # the same quota again is already there
    again = runner.invoke(app, [*argv, "--execute", "--topology", topology])
    assert json.loads(again.stdout)["status"] == "skipped"

    # a queue with the GPUs in two flavors: the flavor is named, and only its quota changes
    mixed = ["act", "set_quota", "cluster/prod", "--queue", "vigil-mixed", "--quantity", "24", "--execute",
             "--topology", topology, "--json"]
    done = runner.invoke(app, [*mixed, "--flavor", "a100"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["result"] == "ClusterQueue vigil-mixed nominalQuota nvidia.com/gpu=24 in flavor a100"
    assert _gpu_quotas(api, TWO_FLAVOR_QUEUE) == {"h100": "32", "a100": 24}
    assert sorted(a.status.value for a in audit.actions()) == ["executed", "executed", "proposed", "skipped"]


@pytest.mark.parametrize(("extra", "message"), [
    ([], "set_quota needs --queue (the ClusterQueue or QOS) and --quantity"),
    (["--queue", "vigil-spot-training"], "set_quota needs --queue"),
    (["--queue", "vigil-spot-training", "--quantity", "-8"], "--quantity '-8': a whole count of at least 0"),
    (["--queue", "vigil-spot-training", "--quantity", "6.5"], "--quantity '6.5': a whole count"),
    (["--queue", "vigil-spot-training", "--quantity", "64Gi"], "--quantity '64Gi': a whole count"),
    (["--queue", "Spot Training", "--quantity", "64"], "set_quota needs params.queue, a ClusterQueue name"),
    (["--queue", "vigil-spot-training", "--quantity", "64", "--resource", "nvidia.com/gpu; rm"],
     "set_quota needs params.resource, a resource name"),
    (["--queue", "vigil-spot-training", "--quantity", "64", "--flavor", "H100_SXM"],
     "set_quota params.flavor must be a ResourceFlavor name"),
    (["--queue", "no-such-queue", "--quantity", "64"], "no ClusterQueue no-such-queue in the API"),
    (["--queue", "vigil-spot-training", "--quantity", "64", "--resource", "example.com/fpga"],
     "ClusterQueue vigil-spot-training has no quota for example.com/fpga"),
    (["--queue", "vigil-mixed", "--quantity", "64"],
     "ClusterQueue vigil-mixed has nvidia.com/gpu in flavors h100, a100: name one (params.flavor, --flavor)"),
    (["--queue", "vigil-mixed", "--quantity", "64", "--flavor", "l40s"],
     "ClusterQueue vigil-mixed has no quota for nvidia.com/gpu in flavor l40s (it has one in h100, a100)"),
])
def test_act_set_quota_bad_input_is_one_line_exit_2_and_nothing_stored(
    cli_on_kube: tuple[RecordedApi, AuditLog, str], capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch, extra: list[str], message: str
) -> None:
    from vigil.faces.cli.main import main

    api, audit, topology = cli_on_kube
    monkeypatch.setattr("sys.argv", ["vigil", "remedy", "act", "set_quota", "cluster/prod", *extra, "--execute",
                                     "--topology", topology])
    with pytest.raises(SystemExit) as stopped:
        main()
    out, err = capsys.readouterr()
    assert stopped.value.code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ") and message in err, err
    assert audit.count() == 0
    assert not [r for r in api.requests if r[0] != "GET"]


def test_quota_options_belong_to_set_quota(cli_on_kube: tuple[RecordedApi, AuditLog, str]) -> None:
    _, audit, _ = cli_on_kube
    result = CliRunner().invoke(app, ["act", "preempt", "job/ml:rl-rollout", "--quantity", "4", "--flavor", "a100"])
    assert result.exit_code != 0
    assert str(result.exception) == "--quantity, --flavor: options of set_quota; preempt does not take them"
    assert audit.count() == 0
