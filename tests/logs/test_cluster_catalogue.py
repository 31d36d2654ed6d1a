"""Scheduler and cluster-agent coverage of the signature library, from the producers' source at pinned tags.

The node-level survey (test_node_catalogue) covers the kernel, the drivers and the first Slurm and Kubernetes lines;
this one reads the producers whose output a cluster's logs carry around a node failure:

* Slurm ``slurm-25-05-8-1`` (github.com/SchedMD/slurm): slurmctld's and slurmd's error(), fatal() and the info() lines
  that mark a node or job failing, slurmstepd's step reports, srun's own errors, and the status tables (sinfo -R,
  scontrol show node, sacct, squeue) as their man pages document them;
* the Kubernetes node-problem-detector ``v1.34.4``: every rule of its default kernel monitor
  (config/kernel-monitor.json), its read-only and NTP monitors, and the conditions it sets;
* NVIDIA's device plugin ``v0.20.0``, DCGM ``v4.6.0`` (nv-hostengine's log and the health watches' messages) and
  dcgm-exporter ``4.5.3-4.8.2`` (its metrics);
* the kubelet's eviction manager and node pressure conditions (kubernetes pkg/kubelet, as stored at commit 0239cd73).

Each row is a line built around the source's format string, with where it comes from and its role:

* ``root``: alone in its file it is named by a root signature, and beside a typical consequence in another file it is
  still the root;
* ``consequence``: printed before its cause in the same file, the cause is named; alone, it is named rather than nothing
  (it is the only account of the failure there is);
* ``benign``: a line of the same producer that reports nothing wrong (a node returning to service, a condition that is
  False, a metric at 0): no root signature names it, so a real error after it in the same file is the root.
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

SLURM = "Slurm slurm-25-05-8-1 "
NPD = "node-problem-detector v1.34.4 "
KUBELET = "kubernetes pkg/kubelet (0239cd73) "
KMON = NPD + "config/kernel-monitor.json:"
GPU3 = 'gpu="3",UUID="GPU-26fba6b2-9e52-006e-68db-4ce18382a5ea",device="nvidia3",modelName="NVIDIA H100 80GB HBM3"'
EXPORTER = "dcgm-exporter 4.5.3-4.8.2 "
SRUN_RELAY = "srun: error: gpu-07: task 3: Exited with exit code 1"
POD_RELAY = "Warning  BackOff  3m  kubelet  Back-off restarting failed container trainer in pod trainer-0_default(1f2e)"
CUDA_RELAY = "RuntimeError: CUDA error: unspecified launch failure"
IO_RELAY = "OSError: [Errno 5] Input/output error: '/ckpt/step_800/model.pt'"
# causes that a consequence row is printed before
XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus."
TASK_ERROR = "RuntimeError: CUDA error: an illegal memory access was encountered"
KERNEL_PANIC = "Kernel panic - not syncing: Fatal exception"
OOM_KILL = "Memory cgroup out of memory: Killed process 4242 (python) total-vm:81234560kB, anon-rss:79123456kB, " \
           "file-rss:0kB, shmem-rss:0kB"
PROLOG_FAILED = "[2025-06-01T10:00:00.123] error: [job 4242] prolog failed status=1:0"
NODE_DOWN = "[2025-06-01T10:00:00.123] error: Nodes gpu-07 not responding, setting DOWN"


@dataclass(frozen=True)
class Root:
    message: str
    source: str
    signature: str
    relay: str
    filename: str = "node.log"


ROOTS = [
    # --- slurmctld: a node lost, a node drained, a job's launch failing ---
    Root("[2025-06-01T10:00:00.123] error: Nodes gpu-[07-08] not responding, setting DOWN",
         SLURM + "src/slurmctld/ping_nodes.c:323 ping_nodes (reason 'Not responding')", "slurm.node_failure",
         SRUN_RELAY, "slurmctld.log"),
    Root("[2025-06-01T10:00:00.123] error: Nodes gpu-07 not responding", SLURM + "src/slurmctld/node_mgr.c:3901 "
         "node_not_resp_msg", "slurm.node_failure", SRUN_RELAY, "slurmctld.log"),
    Root("[2025-06-01T10:00:00.123] validate_node_specs: Node gpu-07 unexpectedly rebooted boot_time=1748771990 last "
         "response=1748771900", SLURM + "src/slurmctld/node_mgr.c:3640 validate_node_specs (info since 23.x; reason "
         "'Node unexpectedly rebooted')", "slurm.node_failure", SRUN_RELAY, "slurmctld.log"),
    Root("[2025-06-01T10:00:00.123] error: Prolog/Epilog failure on nodes gpu-07, set to state DRAIN",
         SLURM + "src/slurmctld/agent.c:822 _thread_per_group_rpc (reason 'Prolog/Epilog failure')",
         "slurm.prolog_failed", SRUN_RELAY, "slurmctld.log"),
    Root("[2025-06-01T10:00:00.123] error: Prolog launch failure, JobId=4242", SLURM + "src/slurmctld/job_mgr.c:5935 "
         "prolog_running_decr / launch failure", "slurm.prolog_failed", SRUN_RELAY, "slurmctld.log"),
    Root("[2025-06-01T10:00:00.123] error: validate_node_specs: Prolog or job env setup failure on node gpu-07, "
         "draining the node", SLURM + "src/slurmctld/node_mgr.c:3522 validate_node_specs (reason 'Prolog error')",
         "slurm.prolog_failed", SRUN_RELAY, "slurmctld.log"),
    Root("[2025-06-01T10:00:00.123] error: _job_epilog_complete: JobId=4242 epilog error on gpu-07, draining the node",
         SLURM + "src/slurmctld/job_mgr.c:16578 job_epilog_complete (reason 'Epilog error')", "slurm.prolog_failed",
         SRUN_RELAY, "slurmctld.log"),
    Root("[2025-06-01T10:00:00.123] error: _slurm_rpc_epilog_complete: epilog error JobId=4242 Node=gpu-07 Err=Job "
         "epilog failed [TIME_STR]", SLURM + "src/slurmctld/proc_req.c:1840 _slurm_rpc_epilog_complete",
         "slurm.prolog_failed", SRUN_RELAY, "slurmctld.log"),
    Root("[2025-06-01T10:00:00.123] error: slurmd error running JobId=4242 on Node(s)=gpu-07: Slurmd could not "
         "execve job", SLURM + "src/slurmctld/proc_req.c:2113 _slurm_rpc_complete_batch_script (reason 'batch job "
         "complete failure'; 'Node(s)' capitalised since 23.x)", "slurm.batch_launch_failed", SRUN_RELAY,
         "slurmctld.log"),
    Root("[2025-06-01T10:00:00.123] error: Setting node gpu-07 state to INVAL with reason:Low socket*core*thread "
         "count, Low CPUs", SLURM + "src/slurmctld/node_mgr.c:3497 validate_node_specs (the 'has low ...' lines "
         "are debug() since 23.x: this is the error a reader sees)", "slurm.node_spec_mismatch", SRUN_RELAY,
         "slurmctld.log"),
    Root("[2025-06-01T10:00:00.123] error: Setting node gpu-07 state to INVAL with reason:Low RealMemory "
         "(reported:515000 < 100.00% of configured:1031000)", SLURM + "src/slurmctld/node_mgr.c:3497 / 3309 "
         "(reason text since 23.x)", "slurm.node_spec_mismatch", SRUN_RELAY, "slurmctld.log"),
    Root("[2025-06-01T10:00:00.123] error: Setting node gpu-07 state to INVAL with reason:gres/gpu count reported "
         "lower than configured (7 < 8)", SLURM + "src/interfaces/gres.c:4051 _node_config_validate via "
         "node_mgr.c:3497", "slurm.gres_mismatch", SRUN_RELAY, "slurmctld.log"),
    # --- slurmd: registration, its own fatal errors, its scripts ---
    Root("[2025-06-01T10:00:00.123] error: Unable to register: Unable to contact slurm controller (connect failure)",
         SLURM + "src/slurmd/slurmd/slurmd.c:865 send_registration_msg", "slurm.register_failed", SRUN_RELAY,
         "slurmd.log"),
    Root("[2025-06-01T10:00:00.123] fatal: can't stat gres.conf file /etc/slurm/gres.conf: No such file or directory",
         SLURM + "src/interfaces/gres.c:1194 (fatal() in the daemon's own log file, no 'slurmd:' prefix)",
         "slurm.daemon_fatal", SRUN_RELAY, "slurmd.log"),
    Root("[2025-06-01T10:00:00.123] fatal: Failed to detect hardware correctly", SLURM + "src/slurmd/slurmd/"
         "slurmd.c:1172 _read_config", "slurm.daemon_fatal", SRUN_RELAY, "slurmd.log"),
    Root("slurmd: fatal: Hybrid mode is not supported. Mounted cgroups are: 2:freezer:/", SLURM + "src/plugins/cgroup/"
         "v2/cgroup_v2.c:312 (foreground output)", "slurm.daemon_fatal", SRUN_RELAY, "slurmd.log"),
    Root("[2025-06-01T10:00:00.123] error: [job 4242] prolog failed status=1:0", SLURM + "src/slurmd/slurmd/req.c:1806 "
         "_rpc_prolog", "slurm.prolog_failed", SRUN_RELAY, "slurmd.log"),
    Root("[2025-06-01T10:00:00.123] error: [job 4242] epilog failed status=2:0", SLURM + "src/slurmd/slurmd/req.c:5550 "
         "_rpc_terminate_job", "slurm.prolog_failed", SRUN_RELAY, "slurmd.log"),
    # --- slurmstepd: the step's end, in the job's output ---
    Root("slurmstepd: error: *** JOB 4242 ON gpu-07 CANCELLED AT 2025-06-01T10:00:00 DUE TO TIME LIMIT ***",
         SLURM + "src/slurmd/slurmstepd/req.c:1147 _handle_signal_container", "slurm.cancelled", SRUN_RELAY,
         "job.log"),
    Root("slurmstepd: error: *** JOB 4242 ON gpu-07 CANCELLED AT 2025-06-01T10:00:00 DUE TO NODE FAILURE, SEE "
         "SLURMCTLD LOG FOR DETAILS ***", SLURM + "src/slurmd/slurmstepd/req.c:1155", "slurm.cancelled", SRUN_RELAY,
         "job.log"),
    Root("slurmstepd: error: *** STEP 4242.0 ON gpu-07 CANCELLED AT 2025-06-01T10:00:00 DUE TO PREEMPTION ***",
         SLURM + "src/slurmd/slurmstepd/req.c:1151", "slurm.cancelled", SRUN_RELAY, "job.log"),
    Root("slurmstepd: error: *** JOB 4242 ON gpu-07 UNCORRECTABLE MEMORY ERROR AT 2025-06-01T10:00:00 ***",
         SLURM + "src/slurmd/slurmstepd/req.c:1169 (SIG_UME)", "slurm.uncorrectable_memory", SRUN_RELAY, "job.log"),
    Root("slurmstepd: error: Detected 1 oom_kill event in StepId=4242.0. Some of the step tasks have been OOM Killed.",
         SLURM + "src/plugins/task/cgroup/task_cgroup_memory.c:302", "slurm.oom_kill", SRUN_RELAY, "job.log"),
    Root("slurmstepd: error: execve(): train.py: Permission denied", SLURM + "src/slurmd/slurmstepd/task.c:541 "
         "exec_task", "slurm.exec_failed", SRUN_RELAY, "job.log"),
    Root("slurmstepd: error: execve(): bad interpreter(/usr/bin/python4): No such file or directory",
         SLURM + "src/slurmd/slurmstepd/task.c:536 exec_task", "slurm.exec_failed", SRUN_RELAY, "job.log"),
    # --- srun: its own errors ---
    Root("srun: error: Node failure on gpu-07", SLURM + "src/srun/allocate.c:178 _node_fail_handler",
         "slurm.node_failure", SRUN_RELAY, "job.log"),
    Root("srun: error: Unable to allocate resources: Requested node configuration is not available",
         SLURM + "src/srun/allocate.c:209 allocate_nodes", "slurm.allocation_failed", POD_RELAY, "job.log"),
    Root("srun: error: Unable to create step for job 4242: Memory required by task is not available",
         SLURM + "src/srun/launch.c:1262 launch_common_create_job_step", "slurm.allocation_failed", POD_RELAY,
         "job.log"),
    Root("srun: error: Task launch for StepId=4242.0 failed on node gpu-07: Invalid job credential",
         SLURM + "src/api/step_launch.c:1684 _exec_prog / _launch_tasks", "slurm.task_launch_failed", SRUN_RELAY,
         "job.log"),
    # --- status tables: the reason a health check or the controller gives, as sinfo -R / scontrol print it ---
    Root("NHC: check_hw_ib:  No IB port mlx5_0:1 is ACTIVE (LinkUp 200 Gb/sec).  root      2025-06-01T10:00:00 "
         "gpu-07", SLURM + "doc/man/man1/sinfo.1 (-R: REASON USER TIMESTAMP NODELIST), LBNL NHC reason",
         "slurm.nhc", SRUN_RELAY, "sinfo.log"),
    Root("   Reason=gres/gpu count reported lower than configured (7 < 8) [slurm@2025-06-01T10:00:00]",
         SLURM + "doc/man/man1/scontrol.1 (show node Reason=), src/interfaces/gres.c:4051", "slurm.gres_mismatch",
         SRUN_RELAY, "scontrol.log"),
    # --- node-problem-detector: its default kernel monitor's rules (config/kernel-monitor.json), each rule's line ---
    Root("Memory cgroup out of memory: Killed process 4242 (python) total-vm:81234560kB, anon-rss:79123456kB, "
         "file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:160000kB oom_score_adj:0", KMON + "29 OOMKilling",
         "kernel.oom_kill", IO_RELAY, "dmesg.log"),
    Root("INFO: task python:4242 blocked for more than 120 seconds.", KMON + "34 TaskHung",
         "kernel.hung_task", IO_RELAY, "dmesg.log"),
    Root("INFO: task docker:20744 blocked for more than 120 seconds.", KMON + "97 "
         "DockerHung (condition KernelDeadlock)", "kernel.hung_task", IO_RELAY, "dmesg.log"),
    Root("unregister_netdevice: waiting for eth0 to become free. Usage count = 1", KMON + "39 "
         "UnregisterNetDevice", "kernel.unregister_netdevice", IO_RELAY, "dmesg.log"),
    Root("BUG: unable to handle kernel NULL pointer dereference at 0000000000000008", KMON + "44 KernelOops",
         "kernel.oops", IO_RELAY, "dmesg.log"),
    Root("divide error: 0000 [#1] SMP NOPTI", KMON + "49 KernelOops", "kernel.oops", IO_RELAY,
         "dmesg.log"),
    Root("EXT4-fs error (device nvme0n1p1): ext4_find_entry:1455: inode #2: comm python: reading directory lblock 0",
         KMON + "54 Ext4Error", "kernel.fs_error", CUDA_RELAY, "dmesg.log"),
    Root("EXT4-fs warning (device nvme0n1p1): ext4_dx_add_entry:2351: Directory index full!",
         KMON + "59 Ext4Warning (the warning that ends in ENOSPC)", "kernel.fs_error",
         CUDA_RELAY, "dmesg.log"),
    Root("Buffer I/O error on dev nvme0n1p1, logical block 1234, lost async page write", KMON + "64 IOError",
         "kernel.fs_error", CUDA_RELAY, "dmesg.log"),
    Root("XFS (dm-0): Corruption of in-memory data detected.  Shutting down filesystem",
         KMON + "70 XfsShutdown (permanent)", "kernel.fs_error", CUDA_RELAY, "dmesg.log"),
    Root("{1}[Hardware Error]: event severity: fatal", KMON + "91 CperHardwareErrorFatal",
         "kernel.cper_uncorrected", CUDA_RELAY, "dmesg.log"),
    Root("{1}[Hardware Error]: event severity: recoverable", KMON + "85 "
         "CperHardwareErrorRecoverable (uncorrected, contained)", "kernel.cper_uncorrected", CUDA_RELAY, "dmesg.log"),
    Root("EXT4-fs (nvme0n1p1): Remounting filesystem read-only", NPD + "config/readonly-monitor.json:19 "
         "FilesystemIsReadOnly (condition ReadonlyFilesystem)", "kernel.fs_readonly", CUDA_RELAY, "dmesg.log"),
    # the conditions it sets, as kubectl describe node prints them (TYPE STATUS HEARTBEAT TRANSITION REASON MESSAGE)
    Root("  KernelDeadlock       True    Sun, 01 Jun 2025 10:00:00 +0000   Sun, 01 Jun 2025 09:58:00 +0000   "
         "DockerHung                   kernel: INFO: task docker:20744 blocked for more than 120 seconds.", NPD + "pkg/"
         "systemlogmonitor (permanent rule sets the condition with the kernel's message)", "kernel.hung_task",
         POD_RELAY, "node.log"),
    Root("  ReadonlyFilesystem   True    Sun, 01 Jun 2025 10:00:00 +0000   Sun, 01 Jun 2025 09:58:00 +0000   "
         "FilesystemIsReadOnly         Remounting filesystem read-only", NPD + "config/readonly-monitor.json:18 "
         "(condition message)", "kernel.fs_readonly", POD_RELAY, "node.log"),
    # --- NVIDIA: DCGM's host engine, its health messages, dcgm-exporter's metrics ---
    Root("2025-06-01 10:00:00.123 ERROR [4242:4300] XID 79 detected on GPU 3(0000:3b:00.0) in /dev/kmsg. "
         "[DcgmCacheManager.cpp:7806] [DcgmCacheManager::ReadAndCacheXidErrors]", "DCGM v4.6.0 dcgmlib/src/"
         "DcgmCacheManager.cpp:7806 (nv-hostengine.log; format common/DcgmLoggingImpl.h:549)", "dcgm.gpu_fault",
         CUDA_RELAY, "nv-hostengine.log"),
    Root("2025-06-01 10:00:00.123 ERROR [4242:4300] XID 79 detected in /dev/kmsg. Hostengine restart required. Ensure "
         "nvidia-smi is responsive before attempting to restart the hostengine. [DcgmCacheManager.cpp:7800] "
         "[DcgmCacheManager::ReadAndCacheXidErrors]", "DCGM v4.6.0 dcgmlib/src/DcgmCacheManager.cpp:7800",
         "dcgm.gpu_fault", CUDA_RELAY, "nv-hostengine.log"),
    Root("GPU 3 has fallen off the bus", "DCGM v4.6.0 dcgmlib/dcgm_errors.h:503 DCGM_FR_FALLEN_OFF_BUS_MSG",
         "dcgm.gpu_fault", CUDA_RELAY, "dcgm.log"),
    Root("GPU 3 had uncorrectable memory errors and 2 rows were remapped", "DCGM v4.6.0 dcgmlib/dcgm_errors.h:449 "
         "DCGM_FR_UNCORRECTABLE_ROW_REMAP_MSG", "dcgm.gpu_fault", CUDA_RELAY, "dcgm.log"),
    Root("GPU 3 had memory errors and row remappings are pending", "DCGM v4.6.0 dcgmlib/dcgm_errors.h:453 "
         "DCGM_FR_PENDING_ROW_REMAP_MSG", "dcgm.gpu_fault", CUDA_RELAY, "dcgm.log"),
    Root("NVSwitch 2's NvLink 11 is down.", "DCGM v4.6.0 dcgmlib/dcgm_errors.h:471 DCGM_FR_NVSWITCH_NVLINK_DOWN_MSG",
         "dcgm.gpu_fault", CUDA_RELAY, "dcgm.log"),
    Root("Detected 12 CRC FLIT NvLink errors on GPU 3's NVLink (should be 0)", "DCGM v4.6.0 dcgmlib/dcgm_errors.h:420 "
         "DCGM_FR_NVLINK_ERROR_CRITICAL_MSG", "dcgm.gpu_fault", CUDA_RELAY, "dcgm.log"),
    Root('DCGM_FI_DEV_XID_ERRORS{gpu="3",UUID="GPU-26fba6b2-9e52-006e-68db-4ce18382a5ea",pci_bus_id="00000000:3B:00.0",'
         'device="nvidia3",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-07"} 79', "dcgm-exporter 4.5.3-4.8.2 "
         "etc/default-counters.csv:29 (gauge: the last Xid)", "dcgm.metric_fault", CUDA_RELAY, "metrics.log"),
    Root("DCGM_FI_DEV_ROW_REMAP_FAILURE{" + GPU3 + ',Hostname="gpu-07"} 1', EXPORTER + "etc/default-counters.csv:74",
         "dcgm.metric_fault", CUDA_RELAY, "metrics.log"),
    Root('DCGM_EXP_XID_ERRORS_COUNT{gpu="3",UUID="GPU-26fba6b2-9e52-006e-68db-4ce18382a5ea",device="nvidia3",'
         'modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-07",window_size_in_ms="300000",xid="79"} 1',
         "dcgm-exporter 4.5.3-4.8.2 internal/pkg/collector/xid_collector.go:69 (label xid)", "dcgm.metric_fault",
         CUDA_RELAY, "metrics.log"),
    # --- kubelet: the eviction manager and the node's pressure conditions ---
    Root('I0601 10:00:00.123456    1234 eviction_manager.go:376] "Eviction manager: attempting to reclaim" '
         'resourceName="memory"', KUBELET + "eviction/eviction_manager.go synchronize (klog.InfoS)",
         "k8s.node_pressure_eviction", POD_RELAY, "kubelet.log"),
    Root('I0601 10:00:00.123456    1234 eviction_manager.go:387] "Eviction manager: must evict pod(s) to reclaim" '
         'resourceName="ephemeral-storage"', KUBELET + "eviction/eviction_manager.go synchronize",
         "k8s.node_pressure_eviction", POD_RELAY, "kubelet.log"),
    Root("Warning  EvictionThresholdMet  2m  kubelet  Attempting to reclaim memory", KUBELET + "eviction/"
         "eviction_manager.go synchronize (node event EvictionThresholdMet)", "k8s.node_pressure_eviction", POD_RELAY,
         "events.log"),
    Root("  MemoryPressure   True    Sun, 01 Jun 2025 10:00:00 +0000   Sun, 01 Jun 2025 09:58:00 +0000   "
         "KubeletHasInsufficientMemory   kubelet has insufficient memory available", KUBELET + "nodestatus/setters.go "
         "MemoryPressureCondition", "k8s.node_pressure_eviction", POD_RELAY, "node.log"),
    Root("  DiskPressure     True    Sun, 01 Jun 2025 10:00:00 +0000   Sun, 01 Jun 2025 09:58:00 +0000   "
         "KubeletHasDiskPressure         kubelet has disk pressure", KUBELET + "nodestatus/setters.go "
         "DiskPressureCondition", "k8s.node_pressure_eviction", POD_RELAY, "node.log"),
]

CONSEQUENCES = [
    # --- Slurm: what follows a failure (the cause given is what a reader expects named) ---
    Secondary(SRUN_RELAY, SLURM + "src/srun/launch.c:432 _task_finish: the task's exit, relayed", TASK_ERROR),
    Secondary("srun: error: gpu-07: task 3: Out Of Memory", SLURM + "src/srun/launch.c:418 _task_finish", OOM_KILL),
    Secondary("srun: Job step aborted: Waiting up to 32 seconds for job step to finish.", SLURM + "src/api/"
              "step_launch.c:707 slurm_step_launch_wait_finish (info)", TASK_ERROR),
    Secondary("slurmstepd: error: *** STEP 4242.0 ON gpu-07 CANCELLED AT 2025-06-01T10:00:00 DUE TO TASK FAILURE ***",
              SLURM + "src/slurmd/slurmstepd/req.c:1177 (--kill-on-bad-exit: another task failed)", TASK_ERROR),
    Secondary("slurmstepd: error: *** JOB 4242 ON gpu-07 FAILED (non-zero exit code or other failure mode) ***",
              SLURM + "src/slurmd/slurmstepd/req.c:1165 (SIG_FAILURE)", TASK_ERROR),
    Secondary("slurmstepd: error: *** JOB 4242 ON gpu-07 CANCELLED AT 2025-06-01T10:00:00 DUE to SIGNAL Terminated ***",
              SLURM + "src/slurmd/slurmstepd/req.c:1172 (a SIGTERM or SIGKILL sent to the job)", TASK_ERROR),
    Secondary("slurmstepd: error: *** JOB 4242 ON gpu-07 CANCELLED AT 2025-06-01T10:00:00 DUE TO JOB REQUEUE ***",
              SLURM + "src/slurmd/slurmstepd/req.c:1160 (the requeue after a node failure)", NODE_DOWN),
    Secondary("slurmstepd: error: *** JOB 4242 STEPD TERMINATED ON gpu-07 AT 2025-06-01T10:00:00 DUE TO JOB NOT ENDING "
              "WITH SIGNALS ***", SLURM + "src/slurmd/slurmstepd/step_terminate_monitor.c:146 (UnkillableStepTimeout)",
              "INFO: task python:4242 blocked for more than 120 seconds."),
    Secondary("[2025-06-01T10:00:00.123] Killing JobId=4242 on failed node gpu-07", SLURM + "src/slurmctld/"
              "job_mgr.c:2987 kill_running_job_by_node_ptr", NODE_DOWN),
    Secondary("[2025-06-01T10:00:00.123] requeue job JobId=4242 due to failure of node gpu-07", SLURM + "src/slurmctld/"
              "job_mgr.c:2943 kill_running_job_by_node_ptr", NODE_DOWN),
    Secondary("[2025-06-01T10:00:00.123] _job_complete: JobId=4242 cancelled by node failure", SLURM + "src/slurmctld/"
              "job_mgr.c:6027 _job_complete", NODE_DOWN),
    Secondary("[2025-06-01T10:00:00.123] error: _slurm_rpc_node_registration node=gpu-07: Invalid argument",
              SLURM + "src/slurmctld/proc_req.c:2740 (the registration rejected after the INVAL line)",
              "[2025-06-01T10:00:00.123] error: Setting node gpu-07 state to INVAL with reason:Low CPUs"),
    # status tables: the controller's record of a state, not why
    Secondary("Not responding       slurm     2025-06-01T10:00:00 gpu-[07-08]", SLURM + "doc/man/man1/sinfo.1 (-R row; "
              "reason set by src/slurmctld/ping_nodes.c)", KERNEL_PANIC),
    Secondary("Prolog/Epilog failure root      2025-06-01T10:00:00 gpu-07", SLURM + "doc/man/man1/sinfo.1 (-R row; "
              "reason set by src/slurmctld/agent.c:819)", PROLOG_FAILED),
    Secondary("Low RealMemory (reported:515000 < 100.00% of configured:1031000) slurm 2025-06-01T10:00:00 gpu-07",
              SLURM + "doc/man/man1/sinfo.1 (-R row; reason text src/slurmctld/node_mgr.c:3309)",
              "[2025-06-01T10:00:00.123] error: Setting node gpu-07 state to INVAL with reason:Low RealMemory "
              "(reported:515000 < 100.00% of configured:1031000)"),
    Secondary("   Reason=Prolog/Epilog failure [root@2025-06-01T10:00:00]",
              SLURM + "doc/man/man1/scontrol.1 (show node)", PROLOG_FAILED),
    Secondary("   State=DOWN+DRAIN+NOT_RESPONDING ThreadsPerCore=2 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A",
              SLURM + "doc/man/man1/scontrol.1:2017 (show node: node state flags)", KERNEL_PANIC),
    Secondary("4242             train        gpu    default         64  NODE_FAIL      0:0", SLURM + "doc/man/man1/"
              "sacct.1:1383 (JOB STATE CODES: NF NODE_FAIL)", NODE_DOWN),
    Secondary("4242.0          python                 default         64 OUT_OF_ME+    0:125", SLURM + "doc/man/man1/"
              "sacct.1:1388 (OOM OUT_OF_MEMORY, truncated to the column)", OOM_KILL),
    Secondary("4242.0          python                 default         64     FAILED      1:0", SLURM + "doc/man/man1/"
              "sacct.1 (F FAILED)", TASK_ERROR),
    Secondary("  4242       gpu    train     user PD       0:00      2 (launch failed requeued held)",
              SLURM + "doc/man/man1/squeue.1 (job reason; set by src/slurmctld/job_mgr.c:17893)", PROLOG_FAILED),
    # --- cluster agents relaying a fault another line reports ---
    Secondary("I0601 10:00:00.123456       1 health.go:169] XidCriticalError: Xid=79 on Device=GPU-26fba6b2-9e52-006e-"
              "68db-4ce18382a5ea; marking device as unhealthy.", "NVIDIA k8s-device-plugin v0.20.0 internal/rm/"
              "health.go:169", XID_79),
    Secondary('I0601 10:00:00.123456    1234 eviction_manager.go:575] "Eviction manager: pod is evicted successfully" '
              'pod="default/trainer-0"', KUBELET + "eviction/eviction_manager.go evictPod",
              'I0601 10:00:00.123456    1234 eviction_manager.go:387] "Eviction manager: must evict pod(s) to reclaim" '
              'resourceName="memory"'),
    Secondary("  NTPProblem           True    Sun, 01 Jun 2025 10:00:00 +0000   Sun, 01 Jun 2025 09:58:00 +0000   "
              "NTPIsDown                    ntp service is not running", NPD + "config/custom-plugin-monitor.json:29 "
              "and config/plugin/check_ntp.sh (a clock that drifts; never the reason a job failed over a real error)",
              TASK_ERROR),
]

# Lines of the same producers that report nothing wrong: no root signature may name them.
BENIGN = [
    ("slurmd: Node configuration differs from hardware: CPUs=64:128(hw) Boards=1:1(hw) SocketsPerBoard=2:2(hw) "
     "CoresPerSocket=32:32(hw) ThreadsPerCore=1:2(hw)", SLURM + "src/slurmd/slurmd/slurmd.c:1250 (at INFO when "
     "slurm.conf overrides the hardware: SlurmdParameters=config_overrides)"),
    ("[2025-06-01T10:00:00.123] Node configuration differs from hardware: CPUs=64:128(hw) Boards=1:1(hw) "
     "SocketsPerBoard=2:2(hw) CoresPerSocket=32:32(hw) ThreadsPerCore=1:2(hw)", SLURM + "src/slurmd/slurmd/"
     "slurmd.c:1250 (slurmd.log, INFO)"),
    ("[2025-06-01T10:00:00.123] node_did_resp: node gpu-07 returned to service",
     SLURM + "src/slurmctld/node_mgr.c:3776"),
    ("[2025-06-01T10:00:00.123] node gpu-07 returned to service", SLURM + "src/slurmctld/node_mgr.c:3598"),
    ("[2025-06-01T10:00:00.123] Node gpu-07 now responding", SLURM + "src/slurmctld/node_mgr.c:3402"),
    ("[2025-06-01T10:00:00.123] drain_nodes: node gpu-07 state set to DRAIN", SLURM + "src/slurmctld/node_mgr.c:2797 "
     "(an admin's drain too)"),
    ("[2025-06-01T10:00:00.123] update_node: node gpu-07 reason set to: maintenance", SLURM + "src/slurmctld/"
     "node_mgr.c:1898"),
    ("[2025-06-01T10:00:00.123] slurmd error running JobId=4242 from Node(s)=gpu-07: Job/step already completing or "
     "completed", SLURM + "src/slurmctld/proc_req.c:2100 (a race Slurm logs at info and ignores)"),
    ("[2025-06-01T10:00:00.123] _node_config_validate: gres/gpu: Count changed on node gpu-07 (8 != 8)",
     SLURM + "src/interfaces/gres.c:4069 (info)"),
    ("srun: gpu-07: task 0: Completed", SLURM + "src/srun/launch.c:424 (verbose)"),
    ("4242             train        gpu    default         64  COMPLETED      0:0", SLURM + "doc/man/man1/sacct.1"),
    ("   State=IDLE ThreadsPerCore=2 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A", SLURM + "doc/man/man1/scontrol.1"),
    ("  KernelDeadlock       False   Sun, 01 Jun 2025 10:00:00 +0000   Sun, 01 Jun 2025 09:58:00 +0000   "
     "KernelHasNoDeadlock          kernel has no deadlock", KMON + "11 (default condition)"),
    ("  ReadonlyFilesystem   False   Sun, 01 Jun 2025 10:00:00 +0000   Sun, 01 Jun 2025 09:58:00 +0000   "
     "FilesystemIsNotReadOnly      Filesystem is not read-only", NPD + "config/readonly-monitor.json:12"),
    ("  NTPProblem           False   Sun, 01 Jun 2025 10:00:00 +0000   Sun, 01 Jun 2025 09:58:00 +0000   "
     "NTPIsUp                      ntp service is up", NPD + "config/custom-plugin-monitor.json:16"),
    ("  MemoryPressure   False   Sun, 01 Jun 2025 10:00:00 +0000   Sun, 01 Jun 2025 09:58:00 +0000   "
     "KubeletHasSufficientMemory     kubelet has sufficient memory available", KUBELET + "nodestatus/setters.go"),
    ("EDAC MC0: 1 CE memory read error on CPU_SrcID#0_MC#0_Chan#1_DIMM#0 (channel:1 slot:0 page:0x1234 offset:0x0 "
     "grain:32 syndrome:0x0)", KMON + "75 MemoryReadError (a corrected error)"),
    ("{1}[Hardware Error]: event severity: corrected", KMON + "80 "
     "CperHardwareErrorCorrected"),
    ("I0601 10:00:00.123456       1 health.go:64] Ignoring the following XIDs for health checks: [13 31 43 45 68 109]",
     "NVIDIA k8s-device-plugin v0.20.0 internal/rm/health.go:64"),
    ("DCGM_FI_DEV_XID_ERRORS{" + GPU3 + ',Hostname="gpu-07"} 0', EXPORTER + "etc/default-counters.csv:29 (no Xid)"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE{" + GPU3 + ',Hostname="gpu-07"} 0', EXPORTER + "etc/default-counters.csv:74"),
    ("More than 10 single-bit ECC error(s) detected in GPU 3 Volatile SBEs: 12",
     "DCGM v4.6.0 dcgmlib/dcgm_errors.h:242 DCGM_FR_VOLATILE_SBE_DETECTED_MSG (corrected errors)"),
    # possible misfires the node-level survey named: a link coming up raises the same trap 128 as one going down
    ("Jun 17 17:21:28 922890 [4E8006C0] 0x01 -> log_trap_info: Received Generic Notice type:1 num:128 (Link state "
     "change) Producer:2 (Switch) from LID:1 TID:0x0000000000000000",
     "OpenSM opensm/osm_trap_rcv.c log_trap_info (trap 128 is sent for a port that goes up too)"),
    ('I0601 10:00:00.123456    1234 eviction_manager.go:380] "Eviction manager: able to reduce resource pressure '
     'without evicting pods." resourceName="ephemeral-storage"', KUBELET + "eviction/eviction_manager.go synchronize"),
]
# A real error after a benign line in the same file: it, not the benign line, is the root.
AFTER_BENIGN = ("slurmstepd: error: Detected 1 oom_kill event in StepId=4242.0. Some of the step tasks have been OOM "
                "Killed.")


@pytest.mark.parametrize("entry", ROOTS, ids=lambda e: e.signature + ":" + e.message[:40])
def test_a_scheduler_or_agent_failure_report_is_a_root(tmp_path: Path, entry: Root) -> None:
    assert_root_alone_and_beside(tmp_path, entry.message, entry.source, entry.signature, entry.filename, entry.relay,
                                 "rank_0.log")


@pytest.mark.parametrize("entry", CONSEQUENCES, ids=lambda e: e.message[:48])
def test_a_scheduler_or_agent_consequence_gives_way_to_its_cause_and_alone_is_named(tmp_path: Path,
                                                                                     entry: Secondary) -> None:
    assert_consequence_after_its_cause_and_named_alone(tmp_path, entry, "node.log")


@pytest.mark.parametrize(("message", "source"), BENIGN, ids=lambda v: str(v)[:48])
def test_a_benign_line_of_the_same_producers_is_never_a_root(tmp_path: Path, message: str, source: str) -> None:
    assert_benign_never_root(tmp_path, message, source, "node.log", AFTER_BENIGN)


def test_a_port_switched_off_in_a_status_dump_is_no_root_but_a_port_without_a_partner_is(tmp_path: Path) -> None:
    # infiniband-diags ibstat: an unused port the administrator disabled prints "State: Down" too
    port = "CA 'mlx5_1'\n\tCA type: MT4123\n\tPort 1:\n\t\tState: Down\n\t\tPhysical state: {}\n\t\tRate: 10\n"
    (tmp_path / "ibstat.txt").write_text(port.format("Disabled"))
    (tmp_path / "job.log").write_text(TASK_ERROR + "\n")
    result = triage(tmp_path)
    assert result.root is not None and result.root.source == "job.log", result.summary
    (tmp_path / "ibstat.txt").write_text(port.format("Polling"))
    result = triage(tmp_path)
    assert result.root is not None and (result.root.source, result.root.lineno) == ("ibstat.txt", 4), result.summary


def test_a_daemons_fatal_exit_gives_way_to_the_error_it_could_not_get_past(tmp_path: Path) -> None:
    # Slurm log.c: the daemon reports what failed with error(), then exits with fatal(), which often only relays it
    lines = ["[2025-06-01T10:00:00.120] error: Configured MailProg is invalid",
             "[2025-06-01T10:00:00.121] error: Couldn't find the specified plugin name for crypto/munge looking at all "
             "files",
             "[2025-06-01T10:00:00.121] error: cannot find crypto plugin for crypto/munge",
             "[2025-06-01T10:00:00.122] fatal: slurm_cred_creator_ctx_create((null)): Operation not permitted"]
    (tmp_path / "slurmctld.log").write_text("\n".join(lines) + "\n")
    result = triage(tmp_path)
    assert result.root is not None and result.root.lineno == 2, result.summary
    # with only a generic complaint above it, the fatal line is the root
    (tmp_path / "slurmctld.log").write_text("\n".join([lines[0], lines[3]]) + "\n")
    result = triage(tmp_path)
    assert result.root is not None and result.root.lineno == 2 and result.root.signature == "slurm.daemon_fatal"
