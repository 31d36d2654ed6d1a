"""Container runtime and pod-lifecycle coverage of the signature library, from the producers' source at pinned tags.

The layer a GPU pod fails in before the training process prints anything: the NVIDIA container toolkit that gives the
container its GPUs, the OCI runtime that starts it, the CRI plugin that the kubelet drives, and the kubelet's and the
control plane's account of the pod (events, status, klog lines). Each row is a line built around its producer's format
string, as the producer or the component that relays it prints it:

* NVIDIA libnvidia-container (github.com/NVIDIA/libnvidia-container, ``src/cli/configure.c`` configure_command at
  09df17a, ``src/cli/common.c`` select_devices at 1aea987): ``nvidia-container-cli: <stage> error: <reason>``;
* NVIDIA container toolkit ``v1.17.8`` (github.com/NVIDIA/nvidia-container-toolkit): nvidia-container-runtime in CDI
  mode (``internal/oci/runtime_modifier.go``, ``internal/modifier/cdi/registry.go``, the vendored CDI cache's
  "unresolvable CDI devices") and the legacy hook (``cmd/nvidia-container-runtime-hook/main.go``);
* runc ``v1.1.12`` and ``v1.2.6`` (github.com/opencontainers/runc): ``create.go`` "runc create failed",
  ``libcontainer/container_linux.go`` "unable to start container process", ``process_linux.go`` "error during container
  init" and the cgroup errors, ``configs/config.go`` the hook errors (1.1: "error running hook #0: error running hook:
  exit status 1, stdout: , stderr: ..."; 1.2: "error running prestart hook #0: exit status 1, ..."),
  ``rootfs_linux.go`` mount errors;
* containerd ``v1.7.27`` (github.com/containerd/containerd): the shim's "OCI runtime create failed" (pkg/process/
  init.go), runtime/v2's "failed to create shim task", the CRI plugin's RunPodSandbox / CreateContainer /
  StartContainer failures (pkg/cri/instrument/instrumented_service.go and pkg/cri/server), "no runtime for "nvidia" is
  configured" (sandbox_run.go), CDI injection (pkg/cri/opts/spec_linux.go);
* kubernetes (the stored version of pkg/kubelet, pkg/scheduler, pkg/controller): the kubelet's pod events
  (kuberuntime_manager.go FailedCreatePodSandBox, kuberuntime_container.go "Error: ..." and "Stopping container",
  images/image_manager.go pulls and back-offs, volume events), its klog lines (pod_workers.go "Error syncing pod,
  skipping", cri-client remote_runtime.go "... from runtime service failed"), the device manager's admission refusal,
  the scheduler's FailedScheduling and preemption, the node lifecycle and taint-eviction controllers.

Roles as in the other surveys: ``root`` (named alone by its signature, and still the root beside the kubelet's
back-off in another file), ``consequence`` (printed before its cause in the same file, the cause is named; alone, it
is named), ``benign`` (a line of the same producer that reports nothing wrong: no root signature names it).
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

NVC = "NVIDIA libnvidia-container src/cli/configure.c configure_command (09df17a) "
TOOLKIT = "NVIDIA nvidia-container-toolkit v1.17.8 "
RUNC = "opencontainers/runc "
CONTAINERD = "containerd v1.7.27 "
K8S = "kubernetes (stored version) "
POD_RELAY = "Warning  BackOff  3m  kubelet  Back-off restarting failed container trainer in pod trainer-0_default(1f2e)"
# what runc and containerd wrap a prestart hook's failure in, as the CRI plugin returns it to the kubelet
SHIM = "failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create failed: "
HOOK_11 = SHIM + ("unable to start container process: error during container init: error running hook #0: error "
                  "running hook: exit status 1, stdout: , stderr: Auto-detected mode as 'legacy'\\n")
HOOK_12 = SHIM + ("unable to start container process: error during container init: error running prestart hook #0: "
                  "exit status 1, stdout: , stderr: Auto-detected mode as 'legacy'\\n")
CTRD = 'time="2025-06-01T10:00:00.123456789Z" level=error msg='
KLOG_E = "E0601 10:00:00.123456    1234 "
DRIVER_NOT_LOADED = "nvidia-container-cli: initialization error: nvml error: driver not loaded: unknown"
PLEG = ("  Ready            False   Sun, 01 Jun 2025 10:00:00 +0000   Sun, 01 Jun 2025 09:58:00 +0000   "
        "KubeletNotReady              PLEG is not healthy: pleg was last seen active 3m0s ago; threshold is 3m0s")
OOM_KILL = "Memory cgroup out of memory: Killed process 4242 (python) total-vm:81234560kB, anon-rss:79123456kB, " \
           "file-rss:0kB, shmem-rss:0kB"
PULL_FAILED = ('Warning  Failed  10s  kubelet  Failed to pull image "nvcr.io/nvidia/pytorch:24.05-py3": rpc error: '
               'code = NotFound desc = failed to pull and unpack image "nvcr.io/nvidia/pytorch:24.05-py3": failed to '
               'resolve reference "nvcr.io/nvidia/pytorch:24.05-py3": nvcr.io/nvidia/pytorch:24.05-py3: not found')
ALLOCATE_FAILED = ("Warning  UnexpectedAdmissionError  12s  kubelet  Allocate failed due to requested number of "
                   "devices unavailable for nvidia.com/gpu. Requested: 8, Available: 7, which is unexpected")


@dataclass(frozen=True)
class Root:
    message: str
    source: str
    signature: str
    filename: str = "events.log"
    relay: str = POD_RELAY


ROOTS = [
    # --- libnvidia-container: the prestart hook's own report, inside the runtime's wrapping ---
    Root(CTRD + '"StartContainer for \\"9f8e7d\\" failed" error="' + HOOK_11 + DRIVER_NOT_LOADED + '"',
         NVC + "'initialization error: %s' (nvc_init; nvml error); runc v1.1.12 configs/config.go:283/396; "
         "containerd instrumented_service.go:503", "nvidia.container_cli", "containerd.log"),
    Root("Warning  Failed  5s  kubelet  Error: " + HOOK_12 + "nvidia-container-cli: initialization error: load library "
         "failed: libnvidia-ml.so.1: cannot open shared object file: no such file or directory: unknown",
         NVC + "(nvc_init, dlopen of NVML); runc v1.2.6 configs/config.go:423/490; kuberuntime_container.go "
         "'Error: %v'",
         "nvidia.container_cli"),
    Root("Warning  Failed  5s  kubelet  Error: " + HOOK_12 + "nvidia-container-cli: requirement error: unsatisfied "
         "condition: cuda>=12.4, please update your driver to a newer version, or use an earlier cuda container: "
         "unknown", NVC + "'requirement error: %s' (dsl_evaluate)", "nvidia.container_cli"),
    Root("Warning  Failed  5s  kubelet  Error: " + HOOK_11 + "nvidia-container-cli: mount error: file creation failed: "
         "/run/containerd/io.containerd.runtime.v2.task/k8s.io/9f8e7d/rootfs/usr/bin/nvidia-smi: file exists: unknown",
         NVC + "'mount error: %s' (nvc_driver_mount)", "nvidia.container_cli"),
    Root("Warning  Failed  5s  kubelet  Error: " + HOOK_11 + "nvidia-container-cli: ldcache error: open failed: "
         "/sbin/ldconfig.real: no such file or directory: unknown", NVC + "'ldcache error: %s' (nvc_ldcache_update)",
         "nvidia.container_cli"),
    Root("Warning  Failed  5s  kubelet  Error: " + HOOK_11 + "nvidia-container-cli: device error: "
         "GPU-26fba6b2-9e52-006e-68db-4ce18382a5ea: unknown device: unknown",
         NVC + "'device error: %s' and src/cli/common.c select_devices '%s: %s' / 'unknown device' (1aea987)",
         "nvidia.container_cli"),
    Root("Warning  Failed  5s  kubelet  Error: " + HOOK_11 + "nvidia-container-cli: detection error: nvml error: "
         "unknown error: unknown", NVC + "'detection error: %s' (nvc_driver_info_new / nvc_device_info_new)",
         "nvidia.container_cli"),
    Root("Warning  Failed  5s  kubelet  Error: " + HOOK_11 + "nvidia-container-cli: container error: cgroup subsystem "
         "devices not found: unknown", NVC + "'container error: %s' (nvc_container_new, cgroup v2 before 1.8)",
         "nvidia.container_cli"),
    # --- nvidia-container-runtime and its hook ---
    Root("Warning  Failed  5s  kubelet  Error: failed to create containerd task: failed to create shim task: OCI "
         "runtime create failed: could not apply required modification to OCI specification: error modifying OCI spec: "
         "failed to inject CDI devices: unresolvable CDI devices nvidia.com/gpu=all: unknown",
         TOOLKIT + "internal/oci/runtime_modifier.go:58/76, internal/modifier/cdi/registry.go:62, vendored "
         "tags.cncf.io/container-device-interface pkg/cdi/cache.go:255", "nvidia.container_runtime"),
    Root(CTRD + '"CreateContainer within sandbox \\"0a1b2c\\" for &ContainerMetadata{Name:trainer,Attempt:0,} failed" '
         'error="failed to generate container \\"9f8e7d\\" spec: failed to apply OCI options: CDI device injection '
         'failed: unresolvable CDI devices nvidia.com/gpu=GPU-26fba6b2-9e52-006e-68db-4ce18382a5ea"',
         CONTAINERD + "pkg/cri/instrument/instrumented_service.go:444, pkg/cri/server/container_create.go:163/367, "
         "pkg/cri/opts/spec_linux.go:189", "nvidia.container_runtime", "containerd.log"),
    Root("Warning  Failed  5s  kubelet  Error: " + SHIM + "unable to start container process: error during container "
         "init: error running hook #0: error running hook: exit status 1, stdout: , stderr: invoking the NVIDIA "
         "Container Runtime Hook directly (e.g. specifying the docker --gpus flag) is not supported. Please use the "
         "NVIDIA Container Runtime (e.g. specify the --runtime=nvidia flag) instead.: unknown",
         TOOLKIT + "cmd/nvidia-container-runtime-hook/main.go:86 (log.Panicln)", "nvidia.container_runtime"),
    # --- runc: the container's own start failing ---
    Root("Warning  Failed  5s  kubelet  Error: " + SHIM + "unable to start container process: error during container "
         'init: error mounting "/data/ckpt" to rootfs at "/ckpt": mount /data/ckpt:/ckpt (via /proc/self/fd/6), flags: '
         "0x5000: no such file or directory: unknown",
         RUNC + "v1.1.12 libcontainer/rootfs_linux.go:88, process_linux.go, create.go", "container.oci_failed"),
    Root("Warning  Failed  5s  kubelet  Error: " + SHIM + "unable to start container process: unable to apply cgroup "
         "configuration: failed to write 4242: open /sys/fs/cgroup/kubepods.slice/kubepods-pod1f2e.slice/"
         "cri-containerd-9f8e7d.scope/cgroup.procs: no such file or directory: unknown",
         RUNC + "v1.2.6 libcontainer/process_linux.go:578, cgroups/utils.go:394", "container.oci_failed"),
    Root("Warning  Failed  5s  kubelet  Error: " + SHIM + "unable to start container process: error during container "
         "init: error setting cgroup config for procHooks process: bpf_prog_query(BPF_CGROUP_DEVICE) failed: "
         "invalid argument: unknown", RUNC + "v1.2.6 libcontainer/process_linux.go:746, cgroups/devices/"
         "ebpf_linux.go:57 (the device cgroup)", "container.oci_failed"),
    Root("Warning  Failed  5s  kubelet  Error: " + SHIM + "unable to start container process: exec: \"torchrun\": "
         "executable file not found in $PATH: unknown", RUNC + "v1.2.6 libcontainer/container_linux.go:338 (Go's "
         "exec.LookPath error)", "container.oci_failed"),
    # --- containerd's CRI plugin: the sandbox ---
    Root(CTRD + '"RunPodSandbox for &PodSandboxMetadata{Name:trainer-0,Uid:1f2e3d4c,Namespace:default,Attempt:0,} '
         'failed, error" error="failed to get sandbox runtime: no runtime for \\"nvidia\\" is configured"',
         CONTAINERD + "pkg/cri/instrument/instrumented_service.go:125, pkg/cri/server/sandbox_run.go:578/588",
         "container.runtime_not_configured", "containerd.log"),
    Root("Warning  FailedCreatePodSandBox  2s (x3 over 30s)  kubelet  Failed to create pod sandbox: rpc error: code = "
         'Unknown desc = failed to get sandbox runtime: no runtime for "nvidia" is configured',
         K8S + "pkg/kubelet/kuberuntime/kuberuntime_manager.go 'Failed to create pod sandbox: %v'; " + CONTAINERD
         + "sandbox_run.go:578", "container.runtime_not_configured"),
    Root(KLOG_E + 'kuberuntime_manager.go:1166] "CreatePodSandbox for pod failed" err="rpc error: code = Unknown '
         'desc = failed to setup network for sandbox \\"0a1b2c\\": plugin type=\\"calico\\" failed (add): error '
         'getting ClusterInformation: connection is unauthorized: Unauthorized" pod="default/trainer-0"',
         K8S + "pkg/kubelet/kuberuntime/kuberuntime_manager.go (klog.ErrorS); " + CONTAINERD + "sandbox_run.go:207",
         "container.oci_failed", "kubelet.log"),
    Root(KLOG_E + 'remote_runtime.go:193] "RunPodSandbox from runtime service failed" err="rpc error: code = Unknown '
         'desc = failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create '
         'failed: unable to start container process: unable to apply cgroup configuration: unit '
         'kubepods-besteffort-pod1f2e.slice not found: unknown"',
         K8S + "staging cri-client remote_runtime.go RunPodSandbox (klog.ErrorS)", "container.oci_failed",
         "kubelet.log"),
    Root(KLOG_E + 'kuberuntime_sandbox.go:72] "Failed to create sandbox for pod" err="rpc error: code = Unknown desc = '
         'failed to get sandbox image \\"registry.k8s.io/pause:3.9\\": failed to pull image '
         '\\"registry.k8s.io/pause:3.9\\": failed to pull and unpack image \\"registry.k8s.io/pause:3.9\\": failed to '
         'resolve reference \\"registry.k8s.io/pause:3.9\\": dial tcp 34.96.108.209:443: i/o timeout" '
         'pod="default/trainer-0"', K8S + "pkg/kubelet/kuberuntime/kuberuntime_sandbox.go createPodSandbox; "
         + CONTAINERD + "podsandbox/sandbox_run.go:85", "container.oci_failed", "kubelet.log"),
    # --- the kubelet driving a container that fails to start ---
    Root(KLOG_E + 'remote_runtime.go:343] "StartContainer from runtime service failed" err="rpc error: code = Unknown '
         'desc = ' + HOOK_11 + DRIVER_NOT_LOADED + '" containerID="9f8e7d"',
         K8S + "staging cri-client remote_runtime.go StartContainer (klog.ErrorS)", "nvidia.container_cli",
         "kubelet.log"),
    Root(KLOG_E + 'pod_workers.go:1298] "Error syncing pod, skipping" err="failed to \\"StartContainer\\" for '
         '\\"trainer\\" with RunContainerError: \\"failed to create containerd task: failed to create shim task: OCI '
         'runtime create failed: runc create failed: unable to start container process: exec: \\\\\\"torchrun\\\\\\": '
         'executable file not found in $PATH: unknown\\"" pod="default/trainer-0" podUID="1f2e3d4c"',
         K8S + "pkg/kubelet/pod_workers.go (klog.ErrorS); kuberuntime_manager.go SyncPod's RunContainerError",
         "container.oci_failed", "kubelet.log"),
    Root('Warning  Failed  4s  kubelet  Error: secret "hf-token" not found',
         K8S + "pkg/kubelet/kuberuntime/kuberuntime_container.go 'Error: %v' (CreateContainerConfigError; the secret "
         "manager's NotFound)", "k8s.container_config_error"),
    Root('Warning  Failed  4s  kubelet  Error: couldn\'t find key HF_TOKEN in Secret default/hf-token',
         K8S + "pkg/kubelet/kubelet_pods.go makeEnvironmentVariables (CreateContainerConfigError)",
         "k8s.container_config_error"),
    # --- volumes ---
    Root('Warning  FailedMount  2m  kubelet  MountVolume.MountDevice failed for volume "pvc-1f2e" : rpc error: code = '
         "Internal desc = mount failed: exit status 32", K8S + "pkg/volume/util/operationexecutor/"
         "operation_generator.go (MountDevice)", "k8s.failed_mount"),
    Root('Warning  FailedAttachVolume  3m  attachdetach-controller  AttachVolume.Attach failed for volume "pvc-1f2e" : '
         "rpc error: code = DeadlineExceeded desc = context deadline exceeded",
         K8S + "pkg/volume/util/operationexecutor/operation_generator.go GenerateAttachVolumeFunc", "k8s.failed_mount"),
    Root('Warning  FailedAttachVolume  3m  attachdetach-controller  Multi-Attach error for volume "pvc-1f2e" Volume is '
         "already exclusively attached to one node and can't be attached to another",
         K8S + "pkg/controller/volume/attachdetach/reconciler/reconciler.go reportMultiAttachError",
         "k8s.failed_mount"),
    # --- images: a root of a pod that never starts, nothing about the GPUs ---
    Root(PULL_FAILED, K8S + "pkg/kubelet/images/image_manager.go 'Failed to pull image %q: %v'; " + CONTAINERD
         + "pkg/cri/server/image_pull.go:193", "k8s.image_pull_failed"),
    Root(KLOG_E + 'remote_image.go:180] "PullImage from image service failed" err="rpc error: code = Unknown desc = '
         'failed to pull and unpack image \\"nvcr.io/nvidia/pytorch:24.05-py3\\": failed to copy: httpReadSeeker: '
         'failed open: unexpected status code https://nvcr.io/v2/nvidia/pytorch/manifests/24.05-py3: 401 '
         'Unauthorized" image="nvcr.io/nvidia/pytorch:24.05-py3"', K8S + "staging cri-client remote_image.go PullImage",
         "k8s.image_pull_failed", "kubelet.log"),
    # --- memory, devices, scheduling ---
    Root("trainer-0   0/1     OOMKilled   2 (15s ago)   3m", K8S + "kubectl get pods STATUS (the container's "
         "terminated reason)", "k8s.oom_killed", "pods.txt"),
    Root("Warning  UnexpectedAdmissionError  12s  kubelet  Allocate failed due to can't allocate unhealthy devices "
         "nvidia.com/gpu, which is unexpected", K8S + "pkg/kubelet/cm/devicemanager/manager.go devicesToAllocate "
         "('can't allocate unhealthy devices %s')", "k8s.device_allocate_failed"),
    Root("  Message:        Pod was rejected: Allocate failed due to requested number of devices unavailable for "
         "nvidia.com/gpu. Requested: 8, Available: 7, which is unexpected", K8S + "pkg/kubelet/lifecycle "
         "(pod status message of a rejected pod)", "k8s.device_allocate_failed", "pod.txt"),
    Root("Warning  FailedScheduling  30s  default-scheduler  0/8 nodes are available: 2 Insufficient nvidia.com/gpu, 6 "
         "node(s) didn't match Pod's node affinity/selector. preemption: 0/8 nodes are available: 2 No preemption "
         "victims found for incoming pod, 6 Preemption is not helpful for scheduling.",
         K8S + "pkg/scheduler/framework/types.go FitError, schedule_one.go FailedScheduling", "k8s.failed_scheduling"),
    Root('I0601 10:00:00.123456       1 schedule_one.go:1055] "Unable to schedule pod; no fit; waiting" '
         'pod="default/trainer-0" err="0/4 nodes are available: 1 node(s) had untolerated taint '
         '{node.kubernetes.io/not-ready: }, 3 Insufficient nvidia.com/gpu. preemption: 0/4 nodes are available: 4 No '
         'preemption victims found for incoming pod."', K8S + "pkg/scheduler/schedule_one.go handleSchedulingFailure",
         "k8s.failed_scheduling", "kube-scheduler.log"),
    Root("Normal   Preempted  20s  default-scheduler  Preempted by pod 7a6b5c4d-1f2e-4a3b-9c8d-0e1f2a3b4c5d on node "
         "gpu-07", K8S + "pkg/scheduler/framework/preemption/preemption.go 'Preempted by pod %v on node %v' (as "
         "Slurm's 'DUE TO PREEMPTION': the reason the job ended when nothing earlier explains it)", "k8s.preempted"),
    Root("Warning  Preempting  20s  kubelet  Preempted in order to admit critical pod",
         K8S + "pkg/kubelet/preemption/preemption.go (reason Preempting)", "k8s.preempted"),
    Root("  Ready            False   Sun, 01 Jun 2025 10:00:00 +0000   Sun, 01 Jun 2025 09:58:00 +0000   "
         "KubeletNotReady              container runtime network not ready: NetworkReady=false "
         "reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized",
         K8S + "pkg/kubelet/nodestatus/setters.go ReadyCondition", "k8s.kubelet_not_ready", "node.txt"),
]

CONSEQUENCES = [
    Secondary(POD_RELAY,
              K8S + "pkg/kubelet/kuberuntime/kuberuntime_manager.go (BackOff)", DRIVER_NOT_LOADED),
    Secondary("trainer-0   0/1     CrashLoopBackOff   5 (30s ago)   6m", K8S + "kubectl get pods STATUS",
              "Warning  Failed  5s  kubelet  Error: " + HOOK_11 + DRIVER_NOT_LOADED),
    Secondary(KLOG_E + 'pod_workers.go:1298] "Error syncing pod, skipping" err="failed to \\"StartContainer\\" for '
              '\\"trainer\\" with CrashLoopBackOff: \\"back-off 5m0s restarting failed container=trainer '
              'pod=trainer-0_default(1f2e3d4c)\\"" pod="default/trainer-0" podUID="1f2e3d4c"',
              K8S + "pkg/kubelet/pod_workers.go, kuberuntime_manager.go doBackOff", OOM_KILL),
    Secondary("  Reason:       CreateContainerConfigError", K8S + "container status reason (kuberuntime_container.go "
              "ErrCreateContainerConfig)", 'Warning  Failed  4s  kubelet  Error: secret "hf-token" not found'),
    Secondary("  Reason:       RunContainerError", K8S + "container status reason", "Warning  Failed  5s  kubelet  "
              "Error: " + HOOK_11 + DRIVER_NOT_LOADED),
    Secondary("Warning  Failed  10s  kubelet  Error: ErrImagePull", K8S + "pkg/kubelet/images/image_manager.go "
              "(ErrImagePull)", PULL_FAILED),
    Secondary('Normal   BackOff  8s  kubelet  Back-off pulling image "nvcr.io/nvidia/pytorch:24.05-py3"',
              K8S + "pkg/kubelet/images/image_manager.go 'Back-off pulling image %q'", PULL_FAILED),
    Secondary("Warning  Failed  8s  kubelet  Error: ImagePullBackOff", K8S + "pkg/kubelet/images/image_manager.go "
              "(ErrImagePullBackOff)", PULL_FAILED),
    Secondary("trainer-0   0/1     ImagePullBackOff   0   2m", K8S + "kubectl get pods STATUS", PULL_FAILED),
    Secondary("trainer-0   0/1     UnexpectedAdmissionError   0   12s", K8S + "kubectl get pods STATUS (the pod's "
              "status reason)", ALLOCATE_FAILED),
    Secondary("Warning  FailedMount  1m  kubelet  Unable to attach or mount volumes: unmounted volumes=[data], "
              "unattached volumes=[data], failed to process volumes=[]: timed out waiting for the condition",
              K8S + "pkg/kubelet/volumemanager/volume_manager.go WaitForAttachAndMount (1.27+ wording)",
              'Warning  FailedAttachVolume  3m  attachdetach-controller  Multi-Attach error for volume "pvc-1f2e" '
              "Volume is already exclusively attached to one node and can't be attached to another"),
    Secondary("Normal   Killing  30s  kubelet  Stopping container trainer", K8S + "pkg/kubelet/kuberuntime/"
              "kuberuntime_container.go killContainer (reason Killing)", OOM_KILL),
    Secondary("Warning  NodeNotReady  2m  node-controller  Node is not ready", K8S + "pkg/controller/util/node "
              "MarkPodsNotReady (the pod's event)", PLEG),
    Secondary("gpu-07   NotReady   <none>   120d   v1.30.4", K8S + "kubectl get nodes STATUS", PLEG),
    Secondary("Normal   TaintManagerEviction  1m  taint-eviction-controller  Marking for deletion Pod "
              "default/trainer-0", K8S + "pkg/controller/tainteviction/taint_eviction.go emitPodDeletionEvent", PLEG),
]

# Lines of the same producers that report nothing wrong: no root signature may name them.
BENIGN = [
    ('Normal   Scheduled  3m  default-scheduler  Successfully assigned default/trainer-0 to gpu-07',
     K8S + "pkg/scheduler/schedule_one.go"),
    ('Normal   Pulling  2m  kubelet  Pulling image "nvcr.io/nvidia/pytorch:24.05-py3"',
     K8S + "pkg/kubelet/images/image_manager.go"),
    ('Normal   Pulled  5s  kubelet  Successfully pulled image "nvcr.io/nvidia/pytorch:24.05-py3" in 1m2.3s (1m2.3s '
     "including waiting). Image size: 9876543210 bytes.", K8S + "pkg/kubelet/images/image_manager.go"),
    ('Normal   Pulled  5s  kubelet  Container image "nvcr.io/nvidia/pytorch:24.05-py3" already present on machine',
     K8S + "pkg/kubelet/images/image_manager.go"),
    ("Normal   Created  2m  kubelet  Created container trainer", K8S + "pkg/kubelet/kuberuntime/"
     "kuberuntime_container.go"),
    ("Normal   Started  2m  kubelet  Started container trainer", K8S + "pkg/kubelet/kuberuntime/"
     "kuberuntime_container.go"),
    ("Normal   NodeReady  1m  kubelet  Node gpu-07 status is now: NodeReady", K8S + "pkg/kubelet/nodestatus"),
    ("  Ready            True    Sun, 01 Jun 2025 10:00:00 +0000   Sun, 01 Jun 2025 09:58:00 +0000   KubeletReady     "
     "            kubelet is posting ready status", K8S + "pkg/kubelet/nodestatus/setters.go"),
    ("trainer-0   1/1     Running   0   6m", K8S + "kubectl get pods"),
    ("gpu-07   Ready    <none>   120d   v1.30.4", K8S + "kubectl get nodes"),
    ("trainer-0   0/1     ContainerCreating   0   4m", K8S + "kubectl get pods STATUS (every pod passes through it; "
     "one stuck there has its reason in its events)"),
    ('time="2025-06-01T10:00:00.123456789Z" level=info msg="RunPodSandbox for &PodSandboxMetadata{Name:trainer-0,'
     'Uid:1f2e3d4c,Namespace:default,Attempt:0,} returns sandbox id \\"0a1b2c\\""',
     CONTAINERD + "pkg/cri/instrument/instrumented_service.go"),
    ('time="2025-06-01T10:00:00.123456789Z" level=info msg="StartContainer for \\"9f8e7d\\" returns successfully"',
     CONTAINERD + "pkg/cri/instrument/instrumented_service.go"),
    ('time="2025-06-01T10:00:00.123456789Z" level=error msg="ContainerStatus for \\"9f8e7d\\" failed" error="rpc '
     'error: code = NotFound desc = an error occurred when try to find container \\"9f8e7d\\": not found"',
     CONTAINERD + "pkg/cri/instrument/instrumented_service.go:611 (a container already removed)"),
    ("Auto-detected mode as 'legacy'", TOOLKIT + "internal/info/auto.go (the runtime's mode, on every start)"),
    ("Using low-level runtime /usr/bin/runc", TOOLKIT + "internal/oci/runtime_low_level.go"),
    ("Normal   Killing  30s  kubelet  Stopping container trainer", K8S + "kuberuntime_container.go (a pod deleted on "
     "purpose)"),
]
# A real error after a benign line in the same file: it, not the benign line, is the root.
AFTER_BENIGN = "Warning  Failed  5s  kubelet  Error: " + HOOK_11 + DRIVER_NOT_LOADED


@pytest.mark.parametrize("entry", ROOTS, ids=lambda e: e.signature + ":" + e.message[:40])
def test_a_runtime_or_pod_lifecycle_failure_report_is_a_root(tmp_path: Path, entry: Root) -> None:
    assert_root_alone_and_beside(tmp_path, entry.message, entry.source, entry.signature, entry.filename, entry.relay,
                                 "rank_0.log")


@pytest.mark.parametrize("entry", CONSEQUENCES, ids=lambda e: e.message[:48])
def test_a_pod_lifecycle_consequence_gives_way_to_its_cause_and_alone_is_named(tmp_path: Path,
                                                                                entry: Secondary) -> None:
    assert_consequence_after_its_cause_and_named_alone(tmp_path, entry, "events.log")


@pytest.mark.parametrize(("message", "source"), BENIGN, ids=lambda v: str(v)[:48])
def test_a_benign_line_of_the_same_producers_is_never_a_root(tmp_path: Path, message: str, source: str) -> None:
    assert_benign_never_root(tmp_path, message, source, "events.log", AFTER_BENIGN)
