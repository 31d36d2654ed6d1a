"""Job-controller and training-framework coverage of the signature library, from the producers' source.

The layer above torch that wraps a training job's failure: Ray core and Ray Train (the driver's exceptions, the
raylet's and the GCS's accounts of a dead worker or node, the memory monitor's kill), KubeRay's RayJob status, the
Kubeflow training-operator's job events and conditions, JobSet's failure policy, Kueue's admission and eviction,
Volcano's gang scheduler and job controller, PyTorch Lightning's signal handling and SLURM auto-requeue, and Hugging
Face Accelerate's launcher and debug-mode checks. Each row is a line built around its producer's format string, with a
realistic prefix (Ray's ``[date time level pid tid] (component) file:line:`` and its driver's ``date time LEVEL
worker.py:N --``, ``kubectl describe``'s event table), where the surveys before this one had not already covered it
(the training survey has Ray's ActorDiedError / RayActorError / WorkerCrashedError headers, Ray Train's
TrainingFailedError._RESTORE_MSG and Ray Tune's TuneError; the node, cluster and runtime surveys have the kubelet's
and the scheduler's own events):

* Ray (github.com/ray-project/ray, the stored versions of each file; the repository is too large to pin one tag here):
  ``python/ray/exceptions.py`` (OutOfMemoryError, LocalRayletDiedError, ObjectLostError, OwnerDiedError),
  ``src/ray/raylet/node_manager.cc`` (the worker-died report, the memory monitor's per-node summary and, since 2.55,
  "N worker(s) were killed due to the node running low on memory"), ``src/ray/gcs/gcs_server/gcs_worker_manager.cc``
  (the exit report), ``gcs_node_manager.cc`` (the node's death info and the dead-node broadcast the driver's
  ``worker.py`` prints), ``gcs_actor_manager.cc`` GenNodeDiedCause, ``python/ray/_private/process_watcher.py``
  report_raylet_error_logs, ``python/ray/train/v2/api/exceptions.py`` (TrainingFailedError / WorkerGroupError),
  ``python/ray/train/_internal/backend_executor.py``, ``python/ray/_private/worker.py``; Ray's OOM-prevention
  documentation (``doc/source/ray-core/scheduling/ray-oom-prevention.rst``) for the OOM report as a user sees it;
* KubeRay ``v1.7.0`` (github.com/ray-project/kuberay): ``ray-operator/controllers/ray/rayjob_controller.go`` (the
  RayJob's status message), ``raycluster_controller.go`` (pod events);
* Kubeflow training-operator ``v1.9.0``: ``pkg/controller.v1/pytorch/pytorchjob_controller.go`` UpdateJobStatus,
  ``pkg/controller.v1/jax/jaxjob_controller.go``, ``pkg/controller.v1/common/pod.go`` (ExitedWithCode, the
  exit-code restart policy), ``pkg/controller.v1/common/job.go`` (backoff limit, active deadline),
  ``pkg/controller.v1/control/pod_control.go``, ``pkg/util/status.go`` NewReason (the event reason is kind + reason);
* JobSet ``v0.8.0`` (github.com/kubernetes-sigs/jobset): ``pkg/constants/constants.go`` (condition and event
  messages), ``pkg/controllers/failure_policy.go`` messageWithFirstFailedJob;
* Kueue ``v0.13.10`` (github.com/kubernetes-sigs/kueue): ``pkg/scheduler/preemption/preemption.go``
  (preemptionMessage), ``pkg/controller/core/workload_controller.go`` (PodsReady timeout, rejected admission checks,
  Admitted), ``pkg/scheduler/scheduler.go`` (QuotaReserved);
* Volcano ``v1.11.2`` (github.com/volcano-sh/volcano): ``pkg/scheduler/cache/cache.go`` (RecordJobStatusEvent,
  defaultEvictor.Evict), ``pkg/scheduler/api/job_info.go`` FitError, ``pkg/scheduler/api/unschedule_info.go``,
  ``pkg/scheduler/actions/preempt`` / ``reclaim``, ``pkg/controllers/job/job_controller.go`` (the policy's action and,
  before it, processNextReq's request for the pod event), ``pkg/controllers/apis/request.go`` (Request.String);
* PyTorch Lightning ``2.5.0`` (github.com/Lightning-AI/pytorch-lightning):
  ``src/lightning/pytorch/trainer/connectors/signal_connector.py``, ``src/lightning/pytorch/loops/fit_loop.py`` and
  ``utilities/exceptions.py`` (SIGTERMException), ``loops/training_epoch_loop.py``, ``trainer/call.py``;
* Hugging Face Accelerate ``v1.2.0`` (github.com/huggingface/accelerate): ``src/accelerate/commands/launch.py``
  (CalledProcessError after a failed child, the defaults notice), ``src/accelerate/utils/operations.py``
  (DistributedOperationException), ``src/accelerate/utils/other.py`` (the kernel-version warning).

Roles as in the other surveys: ``root`` (named alone by its signature, and still the root beside a lower-ranked line
in another file with no wall-clock time), ``consequence`` (printed before its cause in the same file, the cause is
named; alone, it is named), ``benign`` (a line of the same producer that reports nothing wrong: no root signature names
it). A controller's account of a failed replica, a framework's wrapper around a dead worker, a launcher's report of a
failed child are consequences: the cause printed near them is the root.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.logs.catalogue import (
    Secondary,
    assert_benign_never_root,
    assert_consequence_after_its_cause_and_named_alone,
    assert_root_alone_and_beside,
)
from vigil.logs.triage import triage

RAY = "ray (stored version) "
KUBERAY = "kuberay v1.7.0 "
TO = "training-operator v1.9.0 "
JOBSET = "jobset v0.8.0 "
KUEUE = "kueue v0.13.10 "
VOLCANO = "volcano v1.11.2 "
PL = "pytorch-lightning 2.5.0 "
ACCEL = "accelerate v1.2.0 "
NODE_ID = "9426f44574cce4866be798cfed308f2d3e21ba69487d422872cdd6e3"
WORKER_ID = "5c9ac30f8a9eda340f651a204de5d94f1ff965c5d9f72175579bd8dd"
DRIVER = "2024-05-14 10:03:11,482\tWARNING worker.py:2074 -- "
RAYLET = "[2024-05-14 10:03:11,482 E 114900 114900] (raylet) node_manager.cc:3084: "
GCS = "[2024-05-14 10:03:07,742 W 114781 114781] (gcs_server) "
# What the driver raises once a Ray worker is gone (ray.worker_died): below every account of why.
ACTOR_DIED = "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task."
# What a training controller reports once a replica failed: below the pod's own account.
JOB_RELAY = "Normal   PyTorchJobFailed  2m  pytorchjob-controller  PyTorchJob llama-ft is failed because 1 Worker " \
            "replica(s) failed."
POD_RELAY = "Warning  BackOff  3m  kubelet  Back-off restarting failed container trainer in pod trainer-0_default(1f2e)"
# causes that a consequence row is printed before
OOM_KILL = "Memory cgroup out of memory: Killed process 4242 (python) total-vm:81234560kB, anon-rss:79123456kB, " \
           "file-rss:0kB, shmem-rss:0kB"
RAY_OOM = ("Memory on the node (IP: 10.0.62.231, ID: " + NODE_ID + ") where the task (task ID: "
           "43534ce9375fa8e4cd0d0ec285d9974a6a95897401000000, name=RayTrainWorker.__init__, pid=11362, memory "
           "used=61.25GB) was running was 486.71GB / 503.80GB (0.966078), which exceeds the memory usage threshold of "
           "0.95. Ray killed this worker (ID: " + WORKER_ID + ") because it was the most recently scheduled task; to "
           "see more information about memory usage on this node, use `ray logs raylet.out -ip 10.0.62.231`.")
NODE_DEAD = (DRIVER + "The node with node id: " + NODE_ID + " and address: 10.130.0.113 and node name: 10.130.0.113 "
             "has been marked dead because the detector has missed too many heartbeats from it. This can happen when "
             "a \t(1) raylet crashes unexpectedly (OOM, preempted node, etc.) ")
RAYLET_DIED = ("2024-05-14 10:03:09,001\tERROR process_watcher.py:116 -- Raylet is terminated. Termination is "
               "unexpected. Possible reasons include: (1) SIGKILL by the user or system OOM killer, (2) Invalid memory "
               "access from Raylet causing SIGSEGV or SIGBUS, (3) Other termination signals. Last 20 lines of the "
               "Raylet logs:")
TASK_ERROR = "torch.AcceleratorError: CUDA error: an illegal memory access was encountered"
EXITED_OOM = "      Reason:       OOMKilled"  # kubectl describe pod: the worker's last state
NOT_SCHEDULABLE = ("Warning  FailedScheduling  5m  default-scheduler  0/4 nodes are available: 4 Insufficient "
                   "nvidia.com/gpu. preemption: 0/4 nodes are available: 4 No preemption victims found for incoming "
                   "pod.")
PREEMPTED = ("slurmstepd: error: *** STEP 4242.0 ON gpu-07 CANCELLED AT 2025-06-01T10:00:00 DUE TO PREEMPTION ***")


@dataclass(frozen=True)
class Root:
    message: str
    source: str
    signature: str
    filename: str = "driver.log"
    relay: str = ACTOR_DIED


ROOTS = [
    # --- Ray's memory monitor: its own OOM kill, ahead of the kernel's ---
    Root("ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.",
         RAY + "python/ray/exceptions.py OutOfMemoryError (2.2-2.54; ray-oom-prevention.rst shows the driver's line)",
         "ray.memory_monitor_kill"),
    Root("ray.exceptions.OutOfMemoryError: 1 worker(s) were killed due to the node running low on memory.",
         RAY + "src/ray/raylet/node_manager.cc worker_exit_message (2.55+: counted 'N worker(s) were killed ...')",
         "ray.memory_monitor_kill"),
    Root("(raylet) Task _map_task failed due to oom. There are infinite oom retries remaining, so the task will be "
         "retried. Error: 2 worker(s) were killed due to the node running low on memory. Memory on the node (IP: "
         "10.0.50.112, ID: 4cb25bc084aeb5a31ca5402ad589ae042a71165a8e2dd8418fecee26) was 28.62GB / 30.00GB "
         "(0.954017), which exceeds the memory usage threshold of 0.950000; OOM kill reason: exceeded threshold",
         RAY + "src/ray/raylet/node_manager.cc (the raylet's retry notice with the kill, ';'-joined)",
         "ray.memory_monitor_kill"),
    Root(RAY_OOM, RAY + "src/ray/raylet/worker_killing_policy.cc / node_manager.cc (the kill's detail before 2.55)",
         "ray.memory_monitor_kill"),
    Root(RAYLET + "1 Workers (tasks / actors) killed due to memory pressure (OOM), 0 Workers crashed due to other "
         "reasons at node (ID: " + NODE_ID + ", IP: 10.97.37.135) over the last time period.",
         RAY + "src/ray/raylet/node_manager.cc (the periodic per-node summary)", "ray.memory_monitor_kill",
         "raylet.out"),
    Root(GCS + "gcs_worker_manager.cc:55: Reporting worker exit, worker id = " + WORKER_ID + ", node id = "
         + NODE_ID + ", address = 10.97.37.135, exit_type = NODE_OUT_OF_MEMORY, exit_detail = Task was killed due to "
         "the node running low on memory.",
         RAY + "src/ray/gcs/gcs_server/gcs_worker_manager.cc HandleReportWorkerFailure", "ray.memory_monitor_kill",
         "gcs_server.out"),
    Root(DRIVER + "A worker died or was killed while executing a task by an unexpected system error. To "
         "troubleshoot the problem, check the logs for the dead worker. RayTask ID: "
         "8ce7275b7a7953cc794f8c138a616d91cb907c1b01000000 Worker ID: " + WORKER_ID + " Node ID: " + NODE_ID
         + " Worker IP address: 172.17.0.2 Worker port: 10003 Worker PID: 69161 Worker exit type: SYSTEM_ERROR Worker "
         "exit detail: Task was killed due to the node running low on memory.",
         RAY + "src/ray/raylet/node_manager.cc (worker_died, printed by python/ray/_private/worker.py)",
         "ray.memory_monitor_kill"),
    # --- Ray: a node lost ---
    Root(NODE_DEAD, RAY + "src/ray/gcs/gcs_server/gcs_node_manager.cc (the node_removed error the driver prints)",
         "ray.node_dead"),
    Root(DRIVER + "The node with node id " + NODE_ID + " has been marked dead because the detector has missed too "
         "many heartbeats from it. This can happen when a raylet crashes unexpectedly or has lagging heartbeats.",
         RAY + "src/ray/gcs/gcs_server/gcs_node_manager.cc (the wording before node address and name were added)",
         "ray.node_dead"),
    Root("\tthe actor's node was terminated unexpectedly: health check failed due to missing too many heartbeats",
         RAY + "gcs_actor_manager.cc GenNodeDiedCause with gcs_node_manager.cc InferDeathInfo (UNEXPECTED_TERMINATION)",
         "ray.node_dead"),
    Root("\tthe actor's node was preempted: spot instance is being reclaimed by the cloud provider",
         RAY + "gcs_actor_manager.cc GenNodeDiedCause (AUTOSCALER_DRAIN_PREEMPTED, the drain request's reason)",
         "ray.node_dead"),
    Root(GCS.replace(" W ", " I ") + "gcs_node_manager.cc:402: Removing node, node name = 10.130.0.113, death reason "
         "= UNEXPECTED_TERMINATION, death message = health check failed due to missing too many heartbeats",
         RAY + "src/ray/gcs/gcs_server/gcs_node_manager.cc RemoveNode (the node's death info in the GCS log)",
         "ray.node_dead", "gcs_server.out"),
    Root(RAYLET_DIED, RAY + "python/ray/_private/process_watcher.py report_raylet_error_logs (the agent outliving its "
         "raylet)", "ray.raylet_died", "dashboard_agent.log"),
    # --- KubeRay and the training operator: a deadline, a head pod the kernel killed ---
    Root("Message: The RayJob has passed the activeDeadlineSeconds. StartTime: 2025-06-01 10:00:00 +0000 UTC. "
         "ActiveDeadlineSeconds: 3600", KUBERAY + "ray-operator/controllers/ray/rayjob_controller.go:1243 "
         "(DeadlineExceeded)", "k8s.job_deadline_exceeded", "rayjob.txt", POD_RELAY),
    Root("Message: Ray head pod container ray-head terminated with exit code 137: OOMKilled",
         KUBERAY + "ray-operator/controllers/ray/rayjob_controller.go:1111 (SubmissionFailed)", "k8s.oom_killed",
         "rayjob.txt", POD_RELAY),
    Root("Normal   PyTorchJobFailed  1m  pytorchjob-controller  Job llama-ft has failed because it was active longer "
         "than specified deadline", TO + "pkg/controller.v1/common/job.go:212 (runPolicy.activeDeadlineSeconds)",
         "k8s.job_deadline_exceeded", "events.txt", POD_RELAY),
    # --- Kueue and Volcano: the scheduler took the job's place away or never gave it one ---
    Root("Normal   Preempted  30s  kueue-admission  Preempted to accommodate a workload (UID: 6f1e2d3c, JobUID: "
         "0a1b2c3d) due to prioritization in the ClusterQueue", KUEUE + "pkg/scheduler/preemption/preemption.go:150",
         "k8s.preempted", "events.txt", JOB_RELAY),
    Root("Normal   Preempted  30s  kueue-admission  Preempted to accommodate a workload (UID: 6f1e2d3c, JobUID: "
         "0a1b2c3d) due to reclamation within the cohort", KUEUE + "pkg/scheduler/preemption/preemption.go:150 "
         "(InCohortReclamation)", "k8s.preempted", "events.txt", JOB_RELAY),
    Root("Warning  AdmissionCheckRejected  1m  kueue-admission  Deactivating workload because AdmissionCheck for "
         "dws-prov was Rejected: the provisioning request failed: GCE quota exceeded for a3-highgpu-8g",
         KUEUE + "pkg/controller/core/workload_controller.go:452", "k8s.admission_rejected", "events.txt", JOB_RELAY),
    Root("Warning  Evict  12s  volcano  Pod is evicted, because of preempt",
         VOLCANO + "pkg/scheduler/cache/cache.go:229 defaultEvictor.Evict (preempt action)", "k8s.preempted",
         "events.txt", JOB_RELAY),
    Root("Warning  Evict  12s  volcano  Pod is evicted, because of reclaim",
         VOLCANO + "pkg/scheduler/cache/cache.go:229 defaultEvictor.Evict (reclaim action)", "k8s.preempted",
         "events.txt", JOB_RELAY),
    Root("Warning  Unschedulable  2m  volcano  3/4 tasks in gang unschedulable: pod group is not ready, 3 Pending, 4 "
         "minAvailable; Pending: 3 Unschedulable. Origin reason is llama-worker-1: 0/4 nodes are unavailable: 4 "
         "Insufficient nvidia.com/gpu.", VOLCANO + "pkg/scheduler/cache/cache.go:1478 RecordJobStatusEvent with "
         "job_info.go FitError and unschedule_info.go", "k8s.failed_scheduling", "events.txt", JOB_RELAY),
    # --- Accelerate's debug mode: ranks disagree on a collective's shapes ---
    Root("accelerate.utils.operations.DistributedOperationException: Cannot apply desired operation due to shape "
         "mismatches. All shapes across devices must be valid.",
         ACCEL + "src/accelerate/utils/operations.py:393 verify_operation", "torch.collective_mismatch", "rank_0.log",
         "subprocess.CalledProcessError: Command '['/usr/bin/python3', 'train.py']' returned non-zero exit status 1."),
]

CONSEQUENCES = [
    # --- Ray: what the driver and the other processes print once a worker or node is gone ---
    Secondary(DRIVER + "A worker died or was killed while executing a task by an unexpected system error. To "
              "troubleshoot the problem, check the logs for the dead worker. RayTask ID: "
              "ffffffffffffffff8c22c88e5dbb3e566fc0518001000000 Worker ID: " + WORKER_ID + " Node ID: " + NODE_ID
              + " Worker IP address: 10.0.0.7 Worker port: 10003 Worker PID: 69161 Worker exit type: SYSTEM_ERROR "
              "Worker exit detail: Worker unexpectedly exits with a connection error code 2. End of file. There are "
              "some potential root causes. (1) The process is killed by SIGKILL by OOM killer due to high memory "
              "usage. (2) ray stop --force is called. (3) The worker is crashed unexpectedly due to SIGSEGV or other "
              "unexpected errors.", RAY + "src/ray/raylet/node_manager.cc (worker_died) via python/ray/_private/"
              "worker.py", OOM_KILL),
    Secondary("The actor died because its node has died. Node Id: " + NODE_ID,
              RAY + "src/ray/gcs/gcs_server/gcs_actor_manager.cc GenNodeDiedCause", NODE_DEAD),
    Secondary("ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.",
              RAY + "python/ray/exceptions.py ActorDiedError (the header over a node's death)",
              "\tthe actor's node was terminated unexpectedly: health check failed due to missing too many heartbeats"),
    Secondary("ray.exceptions.LocalRayletDiedError: The task's local raylet died. Check raylet.out for more "
              "information.", RAY + "python/ray/exceptions.py LocalRayletDiedError", RAYLET_DIED),
    Secondary("All copies of 00ffffffffffffffffffffffffffffffffffffff0100000002000000 have been lost due to node "
              "failure. Check cluster logs (`/tmp/ray/session_latest/logs`) for more information about the failure.",
              RAY + "python/ray/exceptions.py ObjectLostError", NODE_DEAD),
    Secondary("The object's owner has exited. This is the Python worker that first created the ObjectRef via "
              "`.remote()` or `ray.put()`. Check cluster logs (`/tmp/ray/session_latest/logs/*" + WORKER_ID
              + "*` at IP address 10.0.0.7) for more information about the Python worker failure.",
              RAY + "python/ray/exceptions.py OwnerDiedError", RAY_OOM),
    Secondary("ray.train.WorkerGroupError: Training failed due to worker errors:",
              RAY + "python/ray/train/v2/api/exceptions.py WorkerGroupError (the worker's traceback follows)",
              TASK_ERROR),
    Secondary("ray.train.v2.api.exceptions.TrainingFailedError: Training failed due to worker errors:",
              RAY + "python/ray/train/v2/api/exceptions.py TrainingFailedError", TASK_ERROR),
    Secondary("ray.train.base_trainer.TrainingFailedError: Training failed due to worker errors. Please inspect the "
              "error logs above, or access the latest worker failures in this exception's `worker_failures` "
              "attribute.", RAY + "python/ray/train/v2 TrainingFailedError (early 2.x V2 wording)", RAY_OOM),
    # --- KubeRay ---
    Secondary("Message: Job submission has failed. Reason: BackoffLimitExceeded. Message: Job has reached the "
              "specified backoff limit", KUBERAY + "ray-operator/controllers/ray/rayjob_controller.go:1163 "
              "(the submitter Job's Failed condition)", EXITED_OOM),
    # --- the Kubeflow training operator ---
    Secondary(JOB_RELAY, TO + "pkg/controller.v1/pytorch/pytorchjob_controller.go:435", EXITED_OOM),
    Secondary("Warning  PyTorchJobRestarting  3m  pytorchjob-controller  PyTorchJob llama-ft is restarting because 1 "
              "Worker replica(s) failed.", TO + "pkg/controller.v1/pytorch/pytorchjob_controller.go:430", EXITED_OOM),
    Secondary("message: PyTorchJob llama-ft is failed because 1 Master replica(s) failed.",
              TO + "pytorchjob_controller.go:435 (the Failed condition in the job's status)", TASK_ERROR),
    Secondary("Normal   JAXJobFailed  2m  jaxjob-controller  JAXJob llama-jax is failed because 2 Worker replica(s) "
              "failed.", TO + "pkg/controller.v1/jax/jaxjob_controller.go:397", EXITED_OOM),
    Secondary("Warning  TFJobRestarting  3m  tfjob-controller  job mnist is restarting because Worker replica(s) "
              "failed.", TO + "pkg/controller.v1/common/pod.go:361 (restart policy OnFailure / ExitCode)", EXITED_OOM),
    Secondary('Warning  PyTorchJobFailed  1m  pytorchjob-controller  job "llama-ft" is failing because "Worker" '
              'replica(s) failed.', TO + "pkg/controller.v1/common/pod.go:369 (a non-retryable exit code)", TASK_ERROR),
    Secondary("Normal   PyTorchJobFailed  1m  pytorchjob-controller  Job llama-ft has failed because it has reached "
              "the specified backoff limit", TO + "pkg/controller.v1/common/job.go:210 (runPolicy.backoffLimit)",
              EXITED_OOM),
    Secondary("Normal   ExitedWithCode  2m  pytorchjob-controller  Pod: default.llama-ft-worker-0 exited with code "
              "137", TO + "pkg/controller.v1/common/pod.go:346", EXITED_OOM),
    # --- JobSet ---
    Secondary("Message: jobset failed due to one or more job failures (first failed job: llama-workers-0)",
              JOBSET + "pkg/constants/constants.go FailedJobsMessage, failure_policy.go messageWithFirstFailedJob",
              EXITED_OOM),
    Secondary("Message: jobset failed due to reaching max number of restarts (first failed job: llama-workers-1)",
              JOBSET + "pkg/constants/constants.go ReachedMaxRestartsMessage", TASK_ERROR),
    Secondary("Normal   FailJobSetFailurePolicyAction  1m  jobset  applying FailJobSet failure policy action (first "
              "failed job: llama-workers-0)", JOBSET + "pkg/constants/constants.go FailJobSetActionMessage",
              EXITED_OOM),
    Secondary("Normal   RestartJobSetFailurePolicyAction  1m  jobset  applying RestartJobSet failure policy action "
              "(first failed job: llama-workers-0)", JOBSET + "pkg/constants/constants.go RestartJobSetActionMessage",
              TASK_ERROR),
    # --- Kueue and Volcano ---
    Secondary("Normal   EvictedDueToPodsReadyTimeout  1m  kueue-admission  Exceeded the PodsReady timeout "
              "default/pytorchjob-llama-ft-3c1a", KUEUE + "pkg/controller/core/workload_controller.go:604 "
              "(waitForPodsReady)", NOT_SCHEDULABLE),
    Secondary("Normal   ExecuteAction  10s  vc-controller-manager  Start to execute action RestartJob ",
              VOLCANO + "pkg/controllers/job/job_controller.go:397 (a PodFailed / PodEvicted policy)", EXITED_OOM),
    Secondary("Normal   ExecuteAction  10s  vc-controller-manager  Start to execute action AbortJob ",
              VOLCANO + "pkg/controllers/job/job_controller.go:397", TASK_ERROR),
    # round 33: the controller's own log names the pod event before it acts on it (klog V(3), apis.Request.String)
    Secondary("I0601 10:00:00.432174       1 job_controller.go:356] Try to handle request <Queue: , "
              "Job: default/llama-ft, Task:worker, Pod:llama-ft-worker-1, Event:PodFailed, ExitCode:137, Action:, "
              "JobVersion: 0>",
              VOLCANO + "pkg/controllers/job/job_controller.go processNextReq, pkg/controllers/apis/request.go String",
              EXITED_OOM),
    # --- Lightning: the loop stopping on SIGTERM ---
    Secondary("lightning.pytorch.utilities.exceptions.SIGTERMException",
              PL + "src/lightning/pytorch/loops/fit_loop.py:489 (raised once the SIGTERM notifier ran)", PREEMPTED),
    # a benign row until round 32: the note that the trainer's process got SIGTERM, a consequence of what sent it
    Secondary("[rank: 0] Received SIGTERM: 15",
              PL + "src/lightning/pytorch/trainer/connectors/signal_connector.py:106", PREEMPTED),
    # --- Accelerate's launcher after its child failed ---
    Secondary("subprocess.CalledProcessError: Command '['/usr/bin/python3', 'train.py', '--config', 'cfg.yaml']' "
              "returned non-zero exit status 1.", ACCEL + "src/accelerate/commands/launch.py:763 simple_launcher",
              TASK_ERROR),
    Secondary("subprocess.CalledProcessError: Command '['/opt/conda/bin/python', '-m', 'torch.distributed.run', "
              "'--nproc_per_node', '8', 'train.py']' returned non-zero exit status 1.",
              ACCEL + "src/accelerate/commands/launch.py:834 (deepspeed_launcher)", TASK_ERROR),
]

BENIGN = [
    (DRIVER.replace("WARNING", "INFO") + "Connected to Ray cluster. View the dashboard at 10.42.0.10:8265",
     RAY + "python/ray/_private/worker.py init"),
    ("(TorchTrainer pid=47169) Started distributed worker processes: ",
     RAY + "python/ray/train/_internal/backend_executor.py _create_rank_world_size_mappings (logger.info)"),
    ("(TorchTrainer pid=47169) - (node_id=" + NODE_ID + ", ip=10.0.114.132, pid=47314) world_rank=0, local_rank=0, "
     "node_rank=0", RAY + "python/ray/train/_internal/backend_executor.py (one line per worker)"),
    ("2024-05-14 10:03:09,001\tINFO process_watcher.py:113 -- Raylet is terminated. Termination is graceful.",
     RAY + "python/ray/_private/process_watcher.py report_raylet_error_logs (the raylet logged its SIGTERM)"),
    ("Normal   CreatedHeadPod  5m  raycluster-controller  Created head Pod default/raycluster-kuberay-head-x7k2p",
     KUBERAY + "ray-operator/controllers/ray/raycluster_controller.go:1664"),
    ("Normal   SuccessfulCreatePod  5m  pytorchjob-controller  Created pod: llama-ft-worker-0",
     TO + "pkg/controller.v1/control/pod_control.go:162"),
    ("message: PyTorchJob default/llama-ft is running.", TO + "pytorchjob_controller.go (the Running condition)"),
    ("message: PyTorchJob default/llama-ft successfully completed.",
     TO + "pytorchjob_controller.go (the Succeeded condition)"),
    ("Message: jobset completed successfully", JOBSET + "pkg/constants/constants.go AllJobsCompletedMessage"),
    ("Message: in order startup policy has completed",
     JOBSET + "pkg/constants/constants.go InOrderStartupPolicyCompletedMessage"),
    ("Normal   ResumeJobs  4m  jobset  jobset is resumed", JOBSET + "pkg/constants/constants.go JobSetResumedMessage"),
    ("Normal   QuotaReserved  4m  kueue-admission  Quota reserved in ClusterQueue cluster-queue, wait time since "
     "queued was 3s", KUEUE + "pkg/scheduler/scheduler.go:792"),
    ("Normal   Admitted  4m  kueue-admission  Admitted by ClusterQueue cluster-queue, wait time since reservation was "
     "0s", KUEUE + "pkg/scheduler/scheduler.go:806"),
    ("Normal   Scheduled  4m  volcano  pod group is ready",
     VOLCANO + "pkg/scheduler/cache/cache.go (PodGroupScheduled, PodGroupReady)"),
    ("SLURM auto-requeueing enabled. Setting signal handlers.",
     PL + "src/lightning/pytorch/trainer/connectors/signal_connector.py:51"),
    ("Handling auto-requeue signal: 10", PL + "src/lightning/pytorch/trainer/connectors/signal_connector.py:68"),
    ("requeing job 4242...", PL + "src/lightning/pytorch/trainer/connectors/signal_connector.py:90"),
    ("Requeued SLURM job: 4242", PL + "src/lightning/pytorch/trainer/connectors/signal_connector.py:101"),
    ("Trainer was signaled to stop but the required `min_epochs=10` or `min_steps=None` has not been met. Training "
     "will continue...", PL + "src/lightning/pytorch/loops/training_epoch_loop.py:137"),
    ("Detected kernel version 5.4.0, which is below the recommended minimum of 5.5.0; this can cause the process to "
     "hang. It is recommended to upgrade the kernel to the minimum version or higher.",
     ACCEL + "src/accelerate/utils/other.py:328 check_os_kernel"),
    ("The following values were not passed to `accelerate launch` and had defaults used instead:",
     ACCEL + "src/accelerate/commands/launch.py:1136 _validate_launch_command"),
]
# A real error after a benign line in the same file: it, not the benign line, is the root.
AFTER_BENIGN = RAY_OOM
# Lines a healthy job prints that nothing may name, not even as a consequence with no cause beside it.
QUIET = [
    ("Normal   ExitedWithCode  2m  pytorchjob-controller  Pod: default.llama-ft-worker-0 exited with code 0",
     TO + "pkg/controller.v1/common/pod.go (recorded for every terminated container, a finished worker's too)"),
    ('time="2024-02-21T09:30:56Z" level=info msg="Pod: kubeflow.llama-ft-worker-0 exited with code 0"',
     TO + "pkg/controller.v1/common/pod.go (the same, logged)"),
    ('time="2024-02-21T09:30:56Z" level=info msg="PyTorchJob=llama-ft, ReplicaType=Worker expected=1, running=1, '
     'succeeded=0, failed=0, Replicas=1"', TO + "pkg/controller.v1/common/job.go UpdateJobStatus (every reconcile)"),
    ("I0601 10:00:00.478284       1 job_controller.go:356] Try to handle request <Queue: , Job: default/llama-ft, "
     "Task:, Event:OutOfSync, ExitCode:0, Action:, JobVersion: 0>",
     VOLCANO + "pkg/controllers/job/job_controller.go processNextReq (a resync, not a pod's end)"),
]


def _file_of(message: str) -> str:
    """Where each producer's line is read from: a controller's events, a Ray daemon's log, the driver or rank."""
    if message.startswith(("Normal ", "Warning ", "Message: ", "message: ")):
        return "events.txt"
    if message.startswith("[rank: ") or message.startswith(("lightning.", "subprocess.", "accelerate.")):
        return "rank_0.log"
    return "driver.log"


@pytest.mark.parametrize("entry", ROOTS, ids=lambda e: e.signature + ":" + e.message[:48])
def test_a_controller_or_framework_failure_report_is_a_root(tmp_path: Path, entry: Root) -> None:
    other = "rank_1.log" if entry.filename != "rank_1.log" else "rank_2.log"
    assert_root_alone_and_beside(tmp_path, entry.message, entry.source, entry.signature, entry.filename, entry.relay,
                                 other)


@pytest.mark.parametrize("entry", CONSEQUENCES, ids=lambda e: e.message[:64])
def test_a_controller_or_framework_relay_gives_way_to_its_cause_and_alone_is_named(tmp_path: Path,
                                                                                   entry: Secondary) -> None:
    assert_consequence_after_its_cause_and_named_alone(tmp_path, entry, _file_of(entry.message))


@pytest.mark.parametrize(("message", "source"), BENIGN, ids=lambda v: str(v)[:64])
def test_a_benign_line_of_the_same_producers_is_never_a_root(tmp_path: Path, message: str, source: str) -> None:
    assert_benign_never_root(tmp_path, message, source, _file_of(message), AFTER_BENIGN)


@pytest.mark.parametrize(("message", "source"), QUIET, ids=lambda v: str(v)[:48])
def test_a_healthy_line_is_named_by_nothing(tmp_path: Path, message: str, source: str) -> None:
    (tmp_path / _file_of(message)).write_text(message + "\n")
    result = triage(tmp_path)
    assert result.root is None, (source, result.summary)


def test_the_survey_counts() -> None:
    assert (len(ROOTS), len(CONSEQUENCES), len(BENIGN)) == (23, 30, 21)
