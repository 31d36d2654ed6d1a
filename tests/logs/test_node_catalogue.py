"""Node-level coverage of the signature library, from the producers' own catalogues and documentation.

Each row is a failure message as its producer documents or prints it (NVIDIA's Xid catalogue and driver, the Linux
kernel, Slurm, Kubernetes, the NVIDIA container toolkit), with where it comes from and what triage must make of it:

* ``root`` at a layer: alone in its file it is named by a root signature, and beside a typical consequence of a lower
  layer in another file with no wall-clock time (hardware > driver > kernel / OS > runtime / orchestrator >
  application relay) it is still the root;
* ``secondary``: a documented consequence - printed before its cause in the same file, the cause is still named.

The rows are the survey of what the library covers; a row that fails is a message triage misses or misranks.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

from tests.logs.catalogue import Secondary, assert_cause_named_after_its_consequence, assert_root_alone_and_beside
from vigil.knowledge.files import data_dir
from vigil.logs.triage import triage

Layer = Literal["hardware", "driver", "kernel", "runtime"]
# A typical consequence one layer up, printed by the training process (an application relay) or its orchestrator.
CUDA_RELAY = "RuntimeError: CUDA error: unspecified launch failure"
OOM_RELAY = "RuntimeError: DataLoader worker (pid 4243) is killed by signal: Killed."
IO_RELAY = "OSError: [Errno 5] Input/output error: '/ckpt/step_800/model.pt'"
RO_RELAY = "OSError: [Errno 30] Read-only file system: '/ckpt/step_800/model.pt'"
NET_RELAY = ("n1:4242:4300 [0] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer 10.0.0.2<4789> "
             "with status=IBV_WC_RETRY_EXC_ERR(12) opcode=0 len=0 vendor_err=129 hca mlx5_0")
SMI_RELAY = "RuntimeError: No CUDA GPUs are available"
POD_RELAY = "Warning  BackOff  3m  kubelet  Back-off restarting failed container trainer in pod trainer-0_default(1f2e)"
SRUN_RELAY = "srun: error: node01: task 0: Exited with exit code 1"
HIP_RELAY = "RuntimeError: HIP error: the launch timed out and was terminated"
# CUDA's cudaErrorSystemNotReady (802) as PyTorch raises it: what a job sees when the NVSwitch fabric is not up.
FABRIC_RELAY = "RuntimeError: CUDA error: system not yet initialized"
# PyTorch's summary of an NCCL failure whose detail is in the network plugin's WARN.
NCCL_SUMMARY_RELAY = ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
                      "ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO for details), "
                      "NCCL version 2.21.5")


@dataclass(frozen=True)
class Root:
    message: str
    source: str  # where the wording comes from
    layer: Layer
    signature: str  # the signature that must name it
    relay: str  # a consequence one layer up, printed in another file
    filename: str | None = None  # the producer's own log (by default the node's kernel log or the job's log)


ROOTS = [
    # --- hardware, as the kernel reports it ---
    Root("pcieport 0000:00:03.1: AER: Uncorrected (Fatal) error received: 0000:3b:00.0",
         "Linux drivers/pci/pcie/aer.c aer_isr_one_error", "hardware", "kernel.aer_uncorrected", CUDA_RELAY),
    Root("pcieport 0000:00:03.1: AER: Multiple Uncorrected (Non-Fatal) error received: 0000:3b:00.0",
         "Linux drivers/pci/pcie/aer.c aer_isr_one_error", "hardware", "kernel.aer_uncorrected", CUDA_RELAY),
    Root("pcieport 0000:00:03.1: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, "
         "(Requester ID)", "Linux drivers/pci/pcie/aer.c aer_print_error", "hardware", "kernel.aer_uncorrected",
         CUDA_RELAY),
    Root("pcieport 0000:00:01.0: DPC: containment event, status:0x1f01 source:0x0000",
         "Linux drivers/pci/pcie/dpc.c dpc_process_error", "hardware", "kernel.pcie_dpc", CUDA_RELAY),
    Root("mce: [Hardware Error]: CPU 0: Machine Check Exception: 5 Bank 4: b200000000070f0f",
         "Linux arch/x86/kernel/cpu/mce/core.c print_mce", "hardware", "kernel.mce", CUDA_RELAY),
    Root("mce: Uncorrected hardware memory error in user-access at 3bd2b7d880",
         "Linux arch/x86/kernel/cpu/mce/core.c kill_me_maybe", "hardware", "kernel.mce", OOM_RELAY),
    Root("Kernel panic - not syncing: Fatal machine check", "Linux arch/x86/kernel/cpu/mce/severity.c / core.c",
         "hardware", "kernel.mce", CUDA_RELAY),
    Root("EDAC MC3: 1 UE memory read error on CPU_SrcID#1_MC#1_Chan#2_DIMM#0 (channel:2 slot:0 page:0xb757589 "
         "offset:0xdc0 grain:32 syndrome:0x0)", "Linux drivers/edac/edac_mc.c edac_raw_mc_handle_error (UE)",
         "hardware", "kernel.edac_ue", CUDA_RELAY),
    Root("md/raid1:md0: Disk failure on sda1, disabling device.", "Linux drivers/md/raid1.c raid1_error (pr_crit)",
         "kernel", "kernel.md_member_failed", IO_RELAY),
    Root("md/raid10:md1: Disk failure on nvme1n1p2, disabling device.", "Linux drivers/md/raid10.c raid10_error",
         "kernel", "kernel.md_member_failed", IO_RELAY),
    Root("md/raid:md2: Disk failure on sdc1, disabling device.", "Linux drivers/md/raid5.c raid5_error", "kernel",
         "kernel.md_member_failed", IO_RELAY),
    Root("mdadm[1721]: DegradedArray event detected on md device /dev/md1", "mdadm Monitor.c (syslog)", "kernel",
         "kernel.md_member_failed", IO_RELAY),
    Root("mdadm[1721]: Fail event detected on md device /dev/md0, component device /dev/sdb1",
         "mdadm Monitor.c (syslog, with the component)", "kernel", "kernel.md_member_failed", IO_RELAY),
    Root("A Fail event had been detected on md device /dev/md0.", "mdadm Monitor.c (the monitor's mail)", "kernel",
         "kernel.md_member_failed", IO_RELAY),
    Root("nvme nvme0: controller is down; will reset: CSTS=0xffffffff, PCI_STATUS=0xffff",
         "Linux drivers/nvme/host/pci.c nvme_timeout", "hardware", "kernel.nvme_controller", IO_RELAY),
    Root("nvme0n1: Read(0x2) @ LBA 2048, 8 blocks, Unrecovered Read Error (sct 0x2 / sc 0x81) DNR",
         "Linux drivers/nvme/host/core.c nvme_log_error", "hardware", "kernel.nvme_command_error", IO_RELAY),
    Root("nvme0n1: I/O Cmd(0x2) @ LBA 131209936, 200 blocks, I/O Error (sct 0x3 / sc 0x71)",
         "Linux drivers/nvme/host/core.c nvme_log_error (opcode and status names unknown to the kernel)", "hardware",
         "kernel.nvme_command_error", IO_RELAY),
    Root("nvme0: Admin Cmd(0x6), I/O Error (sct 0x0 / sc 0x2)", "Linux drivers/nvme/host/core.c nvme_log_err_passthru",
         "hardware", "kernel.nvme_command_error", IO_RELAY),
    Root("sd 6:0:0:1: rejecting I/O to offline device", "Linux drivers/scsi/scsi_lib.c scsi_device_state_check",
         "hardware", "kernel.scsi_device_offline", IO_RELAY),
    Root("sd 2:0:0:0: rejecting I/O to dead device", "Linux drivers/scsi/scsi_lib.c scsi_device_state_check",
         "hardware", "kernel.scsi_device_offline", IO_RELAY),
    Root("mlx5_core 0000:3b:00.0: mlx5_port_module_event:1150:(pid 0): Port module event[error]: module 0, "
         "Cable error, Bad cable", "Linux drivers/net/ethernet/mellanox/mlx5/core/port.c / events.c",
         "hardware", "kernel.nic_link_down", NET_RELAY),
    Root("mlx5_core 0000:3b:00.0: poll_health:800:(pid 0): Fatal error 1 detected",
         "Linux drivers/net/ethernet/mellanox/mlx5/core/health.c poll_health", "hardware", "kernel.mlx5_fatal",
         NET_RELAY),
    Root("mlx5_core 0000:3b:00.0 ens1f0: Link down", "Linux mlx5 en_main.c mlx5e_update_carrier", "hardware",
         "kernel.nic_link_down", NET_RELAY),
    Root("ib0: lost carrier", "Linux net/core (netif_carrier_off via IPoIB)", "hardware", "kernel.netdev_lost_carrier",
         NET_RELAY),
    Root("nvidia-nvswitch2: SXid (PCI:0000:86:00.0): 20034, Fatal, Link 11 LTSSM Fault Up",
         "NVIDIA NVSwitch SXid (Fabric Manager user guide, NVSwitch errors)", "hardware", "nvswitch.sxid", CUDA_RELAY),
    # --- NVIDIA driver ---
    Root("NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.", "NVIDIA Xid 79 / driver nv.c", "driver",
         "nvrm.fallen_off_bus", CUDA_RELAY),
    Root("NVRM: GPU at PCI:0000:3b:00: GPU-26fba6b2-9e52-006e-68db-4ce18382a5ea GPU has fallen off the bus.",
         "NVIDIA driver", "driver", "nvrm.fallen_off_bus", CUDA_RELAY),
    Root("NVRM: GPU 0000:81:00.0: RmInitAdapter failed! (0x25:0x40:1470)",
         "NVIDIA driver (RM init failure; nvidia-smi 'No devices were found' follows)", "driver", "nvrm.init_failed",
         SMI_RELAY),
    Root("NVRM: RmInitAdapter: Cannot initialize GSP firmware RM", "NVIDIA driver (GSP firmware boot)", "driver",
         "nvrm.init_failed", SMI_RELAY),
    Root("NVRM: kgspWaitForGfwBootOk_TU102: failed to wait for GFW boot complete: 0x65 VBIOS version 94.02.59.00.05",
         "NVIDIA driver (GFW boot)", "driver", "nvrm.init_failed", SMI_RELAY),
    Root("NVRM: The NVIDIA probe routine was not called for 8 device(s).",
         "NVIDIA driver nv.c (another driver such as nouveau owns the GPUs)", "driver", "nvrm.init_failed",
         SMI_RELAY),
    Root("NVRM: API mismatch: the client has the version 535.104.05, but this kernel module has the version "
         "535.86.10.  Please make sure that this kernel module and all NVIDIA driver components have the same "
         "version.", "NVIDIA driver nv.c", "driver", "nvrm.version_mismatch", SMI_RELAY),
    Root("NVRM: _kgspRpcRecvPoll: Timeout after 45s of waiting for RPC response from GPU1 GSP! Expected function 76 "
         "(GSP_RM_CONTROL) (0x2080014b 0x5).", "NVIDIA Xid 119 (GSP RPC timeout)", "driver", "nvrm.gsp_timeout",
         CUDA_RELAY),
    Root("NVRM: _kgspIsHeartbeatTimedOut: Heartbeat timed out, curTime:1716277232 lastHeartbeatTime:1716277226",
         "NVIDIA Xid 120 / GSP heartbeat", "driver", "nvrm.gsp_timeout", CUDA_RELAY),
    Root("[drm:amdgpu_job_timedout [amdgpu]] *ERROR* ring gfx_0.0.0 timeout, signaled seq=502589, emitted "
         "seq=502591", "Linux drivers/gpu/drm/amd/amdgpu/amdgpu_job.c amdgpu_job_timedout (DRM_ERROR)", "driver",
         "amdgpu.ring_timeout", HIP_RELAY),
    Root("amdgpu 0000:c5:00.0: amdgpu: ring comp_1.1.0 timeout, signaled seq=7, emitted seq=9",
         "Linux drivers/gpu/drm/amd/amdgpu/amdgpu_job.c amdgpu_job_timedout (dev_err, 6.x)", "driver",
         "amdgpu.ring_timeout", HIP_RELAY),
    Root("amdgpu: qcm fence wait loop timeout expired", "Linux drivers/gpu/drm/amd/amdkfd/"
         "kfd_device_queue_manager.c amdkfd_fence_wait_timeout (pr_err)", "driver", "amdgpu.queue_scheduler_timeout",
         HIP_RELAY),
    Root("amdgpu 0000:03:00.0: amdgpu: qcm fence wait loop timeout expired", "Linux drivers/gpu/drm/amd/amdkfd/"
         "kfd_device_queue_manager.c amdkfd_fence_wait_timeout (dev_err, 6.x)", "driver",
         "amdgpu.queue_scheduler_timeout", HIP_RELAY),
    Root("[drm:mes_v11_0_submit_pkt_and_poll_completion.constprop.0 [amdgpu]] *ERROR* MES failed to response msg=3",
         "Linux drivers/gpu/drm/amd/amdgpu/mes_v11_0.c mes_v11_0_submit_pkt_and_poll_completion (DRM_ERROR, before "
         "6.8)", "driver", "amdgpu.queue_scheduler_timeout", HIP_RELAY),
    Root("amdgpu 0000:c5:00.0: amdgpu: MES failed to respond to msg=REMOVE_QUEUE", "Linux drivers/gpu/drm/amd/amdgpu/"
         "mes_v11_0.c, mes_v12_0.c (dev_err, since 6.8)", "driver", "amdgpu.queue_scheduler_timeout", HIP_RELAY),
    Root("amdgpu 0000:03:00.0: amdgpu: MES failed to respond to msg=MISC (WAIT_REG_MEM)", "Linux drivers/gpu/drm/amd/"
         "amdgpu/mes_v11_0.c (dev_err with the misc operation, since 6.8)", "driver", "amdgpu.queue_scheduler_timeout",
         HIP_RELAY),
    Root("NVRM: nvAssertOkFailedNoLog: Assertion failed: GPU lost from the bus [NV_ERR_GPU_IS_LOST] (0x0000000F) "
         "returned from pRmApi->Control(pRmApi, ...) @ kernel_gsp.c:1912", "NVIDIA RM status NV_ERR_GPU_IS_LOST",
         "driver", "nvrm.gpu_is_lost", CUDA_RELAY),
    Root("NVRM: nvAssertOkFailedNoLog: Assertion failed: Reset required [NV_ERR_RESET_REQUIRED] (0x00000062) "
         "returned from status @ kernel_channel.c:2827", "NVIDIA RM status NV_ERR_RESET_REQUIRED", "driver",
         "nvrm.reset_required", CUDA_RELAY),
    Root("NVRM: nvAssertOkFailedNoLog: Assertion failed: Generic Error: Invalid state [NV_ERR_INVALID_STATE] "
         "(0x00000040) returned from kgspBootstrap(pGpu, pKernelGsp) @ kernel_gsp.c:4012",
         "NVIDIA RM status codes NV_ERR_* (nvstatuscodes.h)", "driver", "nvrm.rm_status", CUDA_RELAY),
    # --- Linux kernel / OS ---
    Root("Out of memory: Killed process 4242 (python) total-vm:1kB, anon-rss:1kB, file-rss:0kB, shmem-rss:0kB",
         "Linux mm/oom_kill.c __oom_kill_process (4.19+)", "kernel", "kernel.oom_kill", OOM_RELAY),
    Root("Memory cgroup out of memory: Killed process 4242 (python) total-vm:1kB, anon-rss:1kB",
         "Linux mm/oom_kill.c (memory cgroup)", "kernel", "kernel.oom_kill", OOM_RELAY),
    Root("Memory cgroup out of memory: Kill process 4242 (python) score 1000 or sacrifice child",
         "Linux mm/oom_kill.c oom_kill_process (before 4.19)", "kernel", "kernel.oom_kill", OOM_RELAY),
    Root("oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=step_0,mems_allowed=0-1,oom_memcg=/slurm/"
         "uid_1000/job_7,task_memcg=/slurm/uid_1000/job_7/step_0/task_0,task=python,pid=4242,uid=1000",
         "Linux mm/oom_kill.c dump_oom_summary (4.19+)", "kernel", "kernel.oom_kill_summary", OOM_RELAY),
    Root("Out of memory and no killable processes...", "Linux mm/oom_kill.c out_of_memory", "kernel",
         "kernel.oom_no_victim", OOM_RELAY),
    Root("python: page allocation failure: order:5, mode:0x40cc0(GFP_KERNEL|__GFP_COMP), nodemask=(null),"
         "cpuset=/,mems_allowed=0-1", "Linux mm/page_alloc.c warn_alloc", "kernel", "kernel.page_alloc_failure",
         OOM_RELAY),
    Root("watchdog: BUG: soft lockup - CPU#3 stuck for 22s! [python:4242]", "Linux kernel/watchdog.c", "kernel",
         "kernel.lockup", CUDA_RELAY),
    Root("NMI watchdog: Watchdog detected hard LOCKUP on cpu 5", "Linux kernel/watchdog_perf.c", "kernel",
         "kernel.lockup", CUDA_RELAY),
    Root("rcu: INFO: rcu_sched self-detected stall on CPU", "Linux Documentation/RCU/stallwarn.rst", "kernel",
         "kernel.lockup", CUDA_RELAY),
    Root("INFO: task python:4242 blocked for more than 120 seconds.", "Linux kernel/hung_task.c", "kernel",
         "kernel.hung_task", CUDA_RELAY),
    Root("Kernel panic - not syncing: Fatal exception", "Linux kernel/panic.c", "kernel", "kernel.panic",
         CUDA_RELAY),
    Root("BUG: kernel NULL pointer dereference, address: 0000000000000010", "Linux arch/x86/mm/fault.c",
         "kernel", "kernel.oops", CUDA_RELAY),
    Root("general protection fault, probably for non-canonical address 0xdead000000000100: 0000 [#1] SMP NOPTI",
         "Linux arch/x86/kernel/traps.c", "kernel", "kernel.oops", CUDA_RELAY),
    Root("python[4242]: segfault at 7f797fe00000 ip 00007f7c7ac69996 sp 00007f7c12fd7c30 error 4 in "
         "libnccl.so.2[7f7c7ac00000+d3d3000]", "Linux arch/x86/mm/fault.c show_signal_msg", "kernel",
         "kernel.segfault", SRUN_RELAY),
    Root("traps: python[4242] general protection fault ip:7f3b2c1d2e3f sp:7ffd1c2b3a40 error:0 in "
         "libc.so.6[7f3b2c000000+195000]", "Linux arch/x86/kernel/traps.c (user space)", "kernel",
         "kernel.segfault", SRUN_RELAY),
    Root("blk_update_request: I/O error, dev sda, sector 1234 op 0x1:(WRITE) flags 0x800 phys_seg 1 prio class 0",
         "Linux block/blk-core.c (before 5.18)", "kernel", "kernel.fs_error", IO_RELAY),
    Root("I/O error, dev nvme0n1, sector 2048 op 0x1:(WRITE) flags 0x0 phys_seg 1 prio class 2",
         "Linux block/blk-mq.c blk_print_req_error (5.18+)", "kernel", "kernel.fs_error", IO_RELAY),
    Root("EXT4-fs error (device sda1): ext4_find_entry:1455: inode #2: comm python: reading directory lblock 0",
         "Linux fs/ext4/super.c", "kernel", "kernel.fs_error", RO_RELAY),
    Root("EXT4-fs warning (device nvme0n1): htree_dirblock_to_tree:997: inode #1048579: lblock 0: comm python: error "
         "-5 reading directory block", "Linux fs/ext4/namei.c __ext4_read_dirblock", "kernel", "kernel.fs_error",
         IO_RELAY),
    Root("EXT4-fs warning (device sde): ext4_end_bio:309: I/O error 10 writing to inode 393228 starting block 1611784)",
         "Linux fs/ext4/page-io.c ext4_end_bio", "kernel", "kernel.fs_error", IO_RELAY),
    Root('XFS (dm-0): metadata I/O error in "xfs_trans_read_buf_map" at daddr 0x2 len 1 error 5',
         "Linux fs/xfs/xfs_buf_item.c", "kernel", "kernel.fs_error", IO_RELAY),
    Root("XFS (sdb1): Log I/O Error Detected. Shutting down filesystem", "Linux fs/xfs/xfs_log.c", "kernel",
         "kernel.fs_error", IO_RELAY),
    Root("nfs: server fs01 not responding, still trying", "Linux fs/nfs/client.c / nfs_timeout", "kernel",
         "kernel.fs_error", IO_RELAY),
    Root("LustreError: 11-0: scratch-OST0001-osc-ffff8803: operation ost_write to node 10.1.1.1@o2ib failed: "
         "rc = -107", "Lustre manual, Lustre error messages", "kernel", "kernel.fs_error", IO_RELAY),
    Root("LustreError: 167-0: scratch-MDT0000-mdc-ffff8803: This client was evicted by scratch-MDT0000; in "
         "progress operations using this service will fail.", "Lustre manual", "kernel", "kernel.fs_error",
         IO_RELAY),
    # --- container runtime, NVML tools, orchestrators ---
    Root("nvidia-container-cli: initialization error: nvml error: driver not loaded: unknown",
         "NVIDIA libnvidia-container (nvc_init)", "runtime", "nvidia.container_cli", POD_RELAY),
    Root("nvidia-container-cli: requirement error: unsatisfied condition: cuda>=12.4, please update your driver "
         "to a newer version, or use an earlier cuda container: unknown", "NVIDIA libnvidia-container", "runtime",
         "nvidia.container_cli", POD_RELAY),
    Root("Failed to initialize NVML: Driver/library version mismatch", "NVIDIA NVML (NVML_ERROR_LIB_RM_VERSION_"
         "MISMATCH)", "runtime", "nvml.init_failed", SMI_RELAY),
    Root("Failed to initialize NVML: Unknown Error", "NVIDIA NVML in a container that lost its device cgroup",
         "runtime", "nvml.init_failed", SMI_RELAY),
    Root("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest "
         "NVIDIA driver is installed and running.", "nvidia-smi", "runtime", "nvml.init_failed", SMI_RELAY),
    Root("Unable to determine the device handle for GPU 0000:C1:00.0: GPU is lost.  Reboot the system to recover "
         "this GPU", "nvidia-smi (NVML_ERROR_GPU_IS_LOST)", "runtime", "nvml.gpu_lost", SMI_RELAY),
    Root("Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error", "nvidia-smi", "runtime",
         "nvml.gpu_lost", SMI_RELAY),
    Root("slurmstepd: error: Detected 1 oom_kill event in StepId=1234.0. Some of the step tasks have been OOM "
         "Killed.", "Slurm task/cgroup (23.02+)", "runtime", "slurm.oom_kill", SRUN_RELAY),
    Root("slurmstepd: error: Detected 1 oom-kill event(s) in StepId=37205392.0. Some of your processes may have "
         "been killed by the cgroup out-of-memory handler.", "Slurm task/cgroup (before 23.02)", "runtime",
         "slurm.oom_kill", SRUN_RELAY),
    Root("slurmstepd: error: Exceeded step memory limit at some point.", "Slurm jobacct_gather", "runtime",
         "slurm.oom_kill", SRUN_RELAY),
    Root("slurmstepd: error: *** JOB 494583 ON node01 CANCELLED AT 2024-04-20T09:09:37 DUE TO TIME LIMIT ***",
         "Slurm slurmstepd", "runtime", "slurm.cancelled", SRUN_RELAY),
    Root("slurmstepd: error: *** JOB 494583 ON node01 CANCELLED AT 2024-04-20T09:09:37 DUE TO NODE FAILURE ***",
         "Slurm slurmstepd", "runtime", "slurm.cancelled", SRUN_RELAY),
    Root("srun: error: Node failure on node01", "Slurm srun", "runtime", "slurm.node_failure", SRUN_RELAY),
    Root("slurmctld: error: Nodes node[01-02] not responding, setting DOWN", "Slurm slurmctld (reason 'Not "
         "responding')", "runtime", "slurm.node_failure", SRUN_RELAY),
    Root("slurmd[4242]: error: prolog failed: rc:230 output:Error running slurm prolog: 230",
         "Slurm slurmd (drain reason 'Prolog error')", "runtime", "slurm.prolog_failed", SRUN_RELAY),
    Root("slurmd[4242]: error: [job 1234] epilog failed status=1:0", "Slurm slurmd (drain reason 'Epilog error')",
         "runtime", "slurm.prolog_failed", SRUN_RELAY),
    Root("NHC: check_hw_ib: No IB port mlx5_0:1 is ACTIVE (LinkUp 100 Gb/sec).", "LBNL NHC (node drained by the "
         "health check)", "runtime", "slurm.nhc", SRUN_RELAY),
    Root("gres/gpu count reported lower than configured (7 < 8)", "Slurm slurmctld node registration (drain "
         "reason)", "runtime", "slurm.gres_mismatch", SRUN_RELAY),
    Root("Reason:       OOMKilled", "Kubernetes container status reason (kubelet / CRI)", "runtime",
         "k8s.oom_killed", POD_RELAY),
    Root("Message:      The node was low on resource: memory. Threshold quantity: 100Mi, available: 88Mi.",
         "Kubernetes pkg/kubelet/eviction/helpers.go", "runtime", "k8s.node_pressure_eviction", POD_RELAY),
    Root("Warning  UnexpectedAdmissionError  12s  kubelet  Allocate failed due to requested number of devices "
         "unavailable for nvidia.com/gpu. Requested: 1, Available: 0, which is unexpected",
         "Kubernetes pkg/kubelet/cm/devicemanager/manager.go", "runtime", "k8s.device_allocate_failed", POD_RELAY),
    Root("Warning  UnexpectedAdmissionError  12s  kubelet  Allocate failed due to no healthy devices present; "
         "cannot allocate unhealthy devices nvidia.com/gpu, which is unexpected",
         "Kubernetes pkg/kubelet/cm/devicemanager/manager.go", "runtime", "k8s.device_allocate_failed", POD_RELAY),
    Root('Warning  FailedMount  2m  kubelet  MountVolume.SetUp failed for volume "data" : mount failed: exit '
         "status 32", "Kubernetes pkg/volume/util/operationexecutor", "runtime", "k8s.failed_mount", POD_RELAY),
    Root("Message:      failed to create containerd task: failed to create shim task: OCI runtime create failed: "
         "runc create failed: unable to start container process: exec: \"python\": executable file not found in "
         "$PATH: unknown", "Kubernetes ContainerCannotRun / CreateContainerError message (containerd, runc)",
         "runtime", "container.oci_failed", POD_RELAY),
    Root("Warning  FailedCreatePodSandBox  1m  kubelet  Failed to create pod sandbox: rpc error: code = Unknown "
         "desc = failed to setup network for sandbox", "Kubernetes kubelet (CRI RunPodSandbox)", "runtime",
         "container.oci_failed", POD_RELAY),
    Root("Ready            False   KubeletNotReady              PLEG is not healthy: pleg was last seen active "
         "3m0s ago; threshold is 3m0s", "Kubernetes pkg/kubelet (node condition KubeletNotReady)", "runtime",
         "k8s.kubelet_not_ready", POD_RELAY),
    # --- producers the first survey did not reach ---
    # NVIDIA Fabric Manager (/var/log/fabricmanager.log), the NVSwitch fabric under NVLink traffic; wording as the
    # FM user guide's log and leptonai/gpud components/accelerator/nvidia/fabric-manager quote it
    Root("[Jul 23 2024 07:53:55] [ERROR] [tid 841] detected NVSwitch fatal error 20034 on fid 0 on NVSwitch pci bus "
         "id 00000000:86:00.0 physical id 3 port 33", "NVIDIA Fabric Manager log (FM user guide, NVSwitch errors; "
         "gpud fabric-manager/log.go)", "hardware", "fabricmanager.nvswitch_error", CUDA_RELAY, "fabricmanager.log"),
    Root("[Jul 09 2024 18:14:07] [ERROR] [tid 12727] detected NVSwitch non-fatal error 12028 on fid 0 on NVSwitch pci "
         "bus id 00000000:86:00.0 physical id 3 port 61", "NVIDIA Fabric Manager log (non-fatal SXid)", "hardware",
         "fabricmanager.nvswitch_error", CUDA_RELAY, "fabricmanager.log"),
    Root("[Sep 17 2024 06:01:46] [ERROR] [tid 1230079] failed to find the GPU handle 5410063385821516767 in the "
         "multicast team request setup 6130285411925746235.", "NVIDIA Fabric Manager log (a GPU missing from the "
         "NVLink fabric; gpud fabric-manager/log.go)", "hardware", "fabricmanager.fabric_failed", CUDA_RELAY,
         "fabricmanager.log"),
    Root("[Sep 08 2025 23:21:50] [ERROR] detected number of NVSwitches don't match with any supported system "
         "topology, aborting fabric manager", "NVIDIA Fabric Manager log (FM fails to start; the GPUs stay out of "
         "the fabric, CUDA returns cudaErrorSystemNotReady)", "hardware", "fabricmanager.fabric_failed", FABRIC_RELAY,
         "fabricmanager.log"),
    # mlx5_core health, syndromes and the command interface (Linux drivers/net/ethernet/mellanox/mlx5/core)
    Root("mlx5_core 0000:41:00.0: poll_health:852:(pid 0): device's health compromised - reached miss count",
         "Linux mlx5 core/health.c poll_health (4.19+)", "hardware", "kernel.mlx5_fatal", NET_RELAY),
    Root("mlx5_core 0000:41:00.0: print_health_info:458:(pid 0): synd 0x8: unrecoverable hardware error",
         "Linux mlx5 core/health.c print_health_info / hsynd_str (before 6.2)", "hardware", "kernel.mlx5_fatal",
         NET_RELAY),
    Root("mlx5_core 0000:41:00.0: print_health_info:431:(pid 0): Health issue observed, firmware internal error, "
         "severity(3) ERROR:", "Linux mlx5 core/health.c print_health_info (6.2+, mlx5_log at the firmware's "
         "severity)", "hardware", "kernel.mlx5_fatal", NET_RELAY),
    Root("mlx5_core 0000:41:00.0: print_health_info:424:(pid 0): PCI slot is unavailable",
         "Linux mlx5 core/health.c print_health_info (health buffer reads all ones)", "hardware", "kernel.mlx5_fatal",
         NET_RELAY),
    Root("mlx5_core 0000:41:00.0: mlx5_health_try_recover:330:(pid 920): health recovery flow aborted, PCI reads "
         "still not working", "Linux mlx5 core/health.c mlx5_health_try_recover", "hardware", "kernel.mlx5_fatal",
         NET_RELAY),
    Root("mlx5_core 0000:41:00.0: mlx5_health_try_recover:344:(pid 920): health recovery failed",
         "Linux mlx5 core/health.c mlx5_health_try_recover", "hardware", "kernel.mlx5_fatal", NET_RELAY),
    Root("mlx5_core 0000:03:00.0: wait_func:964:(pid 112): ENABLE_HCA(0x104) timeout. Will cause a leak of a command "
         "resource", "Linux mlx5 core/cmd.c wait_func", "hardware", "kernel.mlx5_cmd_timeout", NET_RELAY),
    Root("mlx5_core 0000:56:00.0: wait_func_handle_exec_timeout:1159:(pid 72061): cmd[0]: ACCESS_REG(0x805) No done "
         "completion", "Linux mlx5 core/cmd.c wait_func_handle_exec_timeout (5.10+)", "hardware",
         "kernel.mlx5_cmd_timeout", NET_RELAY),
    Root("mlx5_core 0000:08:00.0: cb_timeout_handler:887:(pid 5): cmd[13]: CREATE_QP(0x500) Async, timeout. Will "
         "cause a leak of a command resource", "Linux mlx5 core/cmd.c cb_timeout_handler (5.8+)", "hardware",
         "kernel.mlx5_cmd_timeout", NET_RELAY),
    # InfiniBand port state (infiniband-diags ibstat, rdma-core ibv_devinfo) and the subnet manager's traps (OpenSM
    # osm_trap_rcv.c log_trap_info, OSM_LOG_ERROR); trap 128 (a link changed state, up as well as down) is a consequence
    Root("\t\tState: Down", "infiniband-diags ibstat (port state)", "hardware", "ib.port_down", NET_RELAY,
         "ibstat.txt"),
    Root("\t\tPhysical state: Polling", "infiniband-diags ibstat (no link partner: cable or far port)", "hardware",
         "ib.port_down", NET_RELAY, "ibstat.txt"),
    Root("\t\t\tstate:\t\t\tPORT_DOWN (1)", "rdma-core libibverbs/examples/devinfo.c (ibv_port_state_str)",
         "hardware", "ib.port_down", NET_RELAY, "ibv_devinfo.txt"),
    Root("\t\t\tphys_state:\t\tPOLLING (2)", "rdma-core libibverbs/examples/devinfo.c (port_phy_state_str)",
         "hardware", "ib.port_down", NET_RELAY, "ibv_devinfo.txt"),
    Root("Jun 17 17:21:28 922890 [4E8006C0] 0x01 -> log_trap_info: Received Generic Notice type:1 num:129 (Local Link "
         "integrity threshold reached) Producer:2 (Switch) from LID:18 Port 5 TID:0x00000000000000a1",
         "OpenSM opensm/osm_trap_rcv.c log_trap_info (traps 129-131 name the port)", "hardware", "ib.sm_trap",
         NET_RELAY, "opensm.log"),
    # AWS EFA: the kernel driver (Linux drivers/infiniband/hw/efa/efa_com.c, ibdev_err: driver, PCI address, device)
    # and the libfabric efa provider's completion errors as the NCCL OFI plugin reports them
    Root("efa 0000:10:1c.0 rdmap16s28: The device didn't send any completion for admin cmd CREATE_QP(1) status 1 "
         "(ctx 0x00000000a5c3e1f2, sq producer: 18, sq consumer: 17, cq consumer: 17)",
         "Linux efa_com.c efa_com_wait_and_process_admin_cq_interrupts", "driver", "efa.device_error",
         NCCL_SUMMARY_RELAY),
    Root("efa 0000:10:1c.0 rdmap16s28: Failed to process command CREATE_QP (opcode 1) comp_status 1 err -12",
         "Linux efa_com.c efa_com_cmd_exec", "driver", "efa.device_error", NCCL_SUMMARY_RELAY),
    Root("efa 0000:10:1c.0 rdmap16s28: Reading register timed out. expected: req id[5] offset[0x18] actual: req id[4] "
         "offset[0x18]", "Linux efa_com.c efa_com_reg_read32", "driver", "efa.device_error", NCCL_SUMMARY_RELAY),
    Root("efa 0000:10:1c.0 rdmap16s28: Device isn't ready, abort com init 0x0", "Linux efa_com.c efa_com_admin_init",
         "driver", "efa.device_error", NCCL_SUMMARY_RELAY),
    Root("ip-10-0-0-1:4242:4300 [0] nccl_net_ofi_rdma_handle_error_entry:1012 NCCL WARN NET/OFI Request "
         "0x7f3c2c0b8e40 completed with error. RC: 103. Error: 4124 (Unresponsive receiver (connection previously "
         "established)). Completed length: 0, Request: { dev: 0, size: 0, state: CREATED, type: SEND }",
         "aws-ofi-nccl rdma transport (fi_cq_strerror of libfabric prov/efa/src/efa_errno.h 4124)", "runtime",
         "nccl.ofi_completion_error", NCCL_SUMMARY_RELAY, "rank_1.log"),
    Root("ip-10-0-0-1:4242:4300 [0] nccl_net_ofi_rdma_handle_error_entry:1012 NCCL WARN NET/OFI Request "
         "0x7f3c2c0b8e40 completed with error. RC: 113. Error: 15 (Unreachable remote (never received a response)). "
         "Completed length: 0, Request: { dev: 0, size: 0, state: CREATED, type: SEND }",
         "aws-ofi-nccl (libfabric efa_errno.h EFA_IO_COMP_STATUS_LOCAL_ERROR_UNREACH_REMOTE)", "runtime",
         "nccl.ofi_completion_error", NCCL_SUMMARY_RELAY, "rank_1.log"),
    Root("ip-10-0-0-1:4242:4300 [0] ofi_process_cq:196 NCCL WARN NET/OFI Request 0x7f3c2c0b8e40 completed with error. "
         "RC: 5. Error: Input/output error. Completed length: 0, Request: { dev: 0, size: 0, state: CREATED, type: "
         "RECV }", "aws-ofi-nccl sendrecv transport (older wording, no provider code)", "runtime",
         "nccl.ofi_completion_error", NCCL_SUMMARY_RELAY, "rank_1.log"),
    # Slurm: the controller's and slurmd's accounts of a node it drains (src/slurmctld/node_mgr.c,
    # src/slurmctld/proc_req.c, src/slurmd/slurmd/slurmd.c)
    Root("[2024-02-20T16:06:16.263] error: slurmd error running JobId=50 on node(s)=runner01: Plugin initialization "
         "failed", "Slurm slurmctld _slurm_rpc_complete_batch_script (drain reason 'batch job complete failure')",
         "runtime", "slurm.batch_launch_failed", SRUN_RELAY),
    Root("slurmctld: error: Node node01 has low real_memory size (515000 < 1031000)", "Slurm node_mgr.c "
         "validate_node_specs (drain reason 'Low RealMemory')", "runtime", "slurm.node_spec_mismatch", SRUN_RELAY),
    Root("slurmctld: error: Node node01 has low socket*core*thread count (64 < 128)", "Slurm node_mgr.c "
         "validate_node_specs (drain reason 'Low socket*core*thread count')", "runtime", "slurm.node_spec_mismatch",
         SRUN_RELAY),
    Root("slurmctld: error: Node node01 has low cpu count (64 < 128)", "Slurm node_mgr.c validate_node_specs (drain "
         "reason 'Low CPUs')", "runtime", "slurm.node_spec_mismatch", SRUN_RELAY),
    Root("slurmctld: error: Node node01 has low tmp_disk size (1000 < 20000)", "Slurm node_mgr.c validate_node_specs "
         "(drain reason 'Low TmpDisk')", "runtime", "slurm.node_spec_mismatch", SRUN_RELAY),
    Root("slurmd-worker1: error: Node configuration differs from hardware: CPUs=2:2(hw) Boards=1:1(hw) "
         "SocketsPerBoard=2:1(hw) CoresPerSocket=1:2(hw) ThreadsPerCore=1:1(hw)", "Slurm slurmd.c _read_config",
         "runtime", "slurm.node_spec_mismatch", SRUN_RELAY),
    Root("slurmctld: error: Node node01 unexpectedly rebooted boot_time=1706195543 last response=1706195400",
         "Slurm node_mgr.c validate_node_specs (drain reason 'Node unexpectedly rebooted')", "runtime",
         "slurm.node_failure", SRUN_RELAY),
    Root("NHC: check_fs_mount:  /scratch not mounted", "LBNL NHC scripts/common.nhc check_fs_mount (drain reason)",
         "runtime", "slurm.nhc", SRUN_RELAY),
    Root("NHC: check_hw_physmem:  Actual RAM size (515000000 kB) less than minimum allowed (1031000000 kB).",
         "LBNL NHC scripts/lbnl_hw.nhc check_hw_physmem (drain reason)", "runtime", "slurm.nhc", SRUN_RELAY),
    # Kubernetes: the scheduler's verdict on a pod whose GPUs no node has (pkg/scheduler, FailedScheduling)
    Root("Warning  FailedScheduling  2m  default-scheduler  0/4 nodes are available: 4 Insufficient nvidia.com/gpu. "
         "preemption: 0/4 nodes are available: 4 No preemption victims found for incoming pod.",
         "Kubernetes pkg/scheduler (FailedScheduling, fit error 'Insufficient nvidia.com/gpu')", "runtime",
         "k8s.failed_scheduling", POD_RELAY),
    # DCGM health and diagnostics (NVIDIA/DCGM dcgmlib/dcgm_errors.h, DCGM_FR_*_MSG)
    Root("Detected 2 volatile double-bit ECC error(s) in GPU 3.", "DCGM dcgm_errors.h DCGM_FR_VOLATILE_DBE_DETECTED",
         "runtime", "dcgm.gpu_fault", CUDA_RELAY, "dcgm.log"),
    Root("GPU 3 had uncorrectable memory errors and row remapping failed.", "DCGM dcgm_errors.h "
         "DCGM_FR_ROW_REMAP_FAILURE", "runtime", "dcgm.gpu_fault", CUDA_RELAY, "dcgm.log"),
    Root("GPU 1's NvLink link 4 is currently down", "DCGM dcgm_errors.h DCGM_FR_NVLINK_DOWN", "runtime",
         "dcgm.gpu_fault", CUDA_RELAY, "dcgm.log"),
    Root("Detected XID 79 for GPU 3", "DCGM dcgm_errors.h DCGM_FR_XID_ERROR", "runtime", "dcgm.gpu_fault", CUDA_RELAY,
         "dcgm.log"),
    Root("GPU had an uncontained error (XID 95)", "DCGM dcgm_errors.h DCGM_FR_UNCONTAINED_ERROR", "runtime",
         "dcgm.gpu_fault", CUDA_RELAY, "dcgm.log"),
    Root("Detected fatal errors on NvSwitch 2 link 11", "DCGM dcgm_errors.h DCGM_FR_NVSWITCH_FATAL_ERROR", "runtime",
         "dcgm.gpu_fault", CUDA_RELAY, "dcgm.log"),
    Root("Detected fatal NvSwitch SXID 20034", "DCGM dcgm_errors.h DCGM_FR_SXID_ERROR", "runtime", "dcgm.gpu_fault",
         CUDA_RELAY, "dcgm.log"),
    # IPMI system event log as ipmitool prints it (sel list / sel elist; event strings from ipmitool's
    # include/ipmitool/ipmi_sel.h sensor-specific and threshold tables)
    Root("   1 | 01/15/2024 | 10:23:45 | Memory #0x53 | Uncorrectable ECC | Asserted", "ipmitool sel list (memory, "
         "offset 01)", "hardware", "ipmi.sel_fault", CUDA_RELAY, "sel.log"),
    Root("   1 | 01/15/2024 | 10:23:45 | Memory CPU1_DIMM_A1 | Uncorrectable ECC | Asserted", "ipmitool sel elist "
         "(sensor named)", "hardware", "ipmi.sel_fault", CUDA_RELAY, "sel.log"),
    Root("   2 | 03/02/2024 | 08:00:01 | Processor #0x60 | IERR | Asserted", "ipmitool sel list (processor, offset 00)",
         "hardware", "ipmi.sel_fault", CUDA_RELAY, "sel.log"),
    Root("   3 | 03/02/2024 | 08:00:01 | Processor CPU2 Status | Uncorrectable machine check exception | Asserted",
         "ipmitool sel elist (processor, offset 0b)", "hardware", "ipmi.sel_fault", CUDA_RELAY, "sel.log"),
    Root("   4 | 03/02/2024 | 08:00:01 | Processor #0x60 | Thermal Trip | Asserted", "ipmitool sel list (processor, "
         "offset 01)", "hardware", "ipmi.sel_fault", CUDA_RELAY, "sel.log"),
    Root("   5 | 03/02/2024 | 08:00:01 | Critical Interrupt #0x70 | PCI SERR | Asserted", "ipmitool sel list "
         "(critical interrupt, offset 05)", "hardware", "ipmi.sel_fault", CUDA_RELAY, "sel.log"),
    Root("   6 | 03/02/2024 | 08:00:01 | Critical Interrupt PCIE_ERR | PCI PERR | Asserted", "ipmitool sel elist "
         "(critical interrupt, offset 04)", "hardware", "ipmi.sel_fault", CUDA_RELAY, "sel.log"),
    Root("   7 | 03/02/2024 | 08:00:01 | Critical Interrupt #0x71 | Bus Uncorrectable error | Asserted",
         "ipmitool sel list (critical interrupt, offset 08)", "hardware", "ipmi.sel_fault", CUDA_RELAY, "sel.log"),
    Root("   8 | 03/02/2024 | 08:00:01 | Power Supply #0x51 | Failure detected | Asserted", "ipmitool sel list (power "
         "supply, offset 01)", "hardware", "ipmi.sel_power_supply", CUDA_RELAY, "sel.log"),
    Root("   9 | 03/02/2024 | 08:00:01 | Power Supply PSU2 Status | Power Supply AC lost | Asserted", "ipmitool sel "
         "elist (power supply, offset 03)", "hardware", "ipmi.sel_power_supply", CUDA_RELAY, "sel.log"),
    Root("  10 | 03/02/2024 | 08:00:01 | Temperature CPU1 Temp | Upper Critical going high | Asserted | Reading 96 > "
         "Threshold 95 degrees C", "ipmitool sel elist (threshold event)", "hardware", "ipmi.sel_fault", CUDA_RELAY,
         "sel.log"),
    Root("  11 | 03/02/2024 | 08:00:01 | Fan #0x30 | Lower Critical going low | Asserted", "ipmitool sel list "
         "(threshold event)", "hardware", "ipmi.sel_fan", CUDA_RELAY, "sel.log"),
    # parallel file systems: IBM Storage Scale (GPFS) mmfs.log, as IBM's support flash ibm10713707 quotes it, and the
    # BeeGFS client module (client_module/source/net/message/NetMessage... common/toolkit/MessagingTk.c)
    Root("gssio1: [E] Lost membership in cluster testcluster.ibm.com. Unmounting file systems.",
         "IBM Storage Scale mmfs.log (support flash ibm10713707)", "kernel", "gpfs.node_lost", IO_RELAY, "mmfs.log"),
    Root("gssio1: [N] Disk lease period expired 0.010 seconds ago in cluster testcluster.ibm.com. Attempting to "
         "reacquire the lease.", "IBM Storage Scale mmfs.log (support flash ibm10713707)", "kernel",
         "gpfs.node_lost", IO_RELAY, "mmfs.log"),
    Root("beegfs: Messaging (RPC): Communication error: Node: storage01 [ID: 101] (comm result: -104; message type: "
         "2009)", "BeeGFS client module common/toolkit/MessagingTk.c __MessagingTk_requestResponseWithRRArgsComm "
         "(Logger_logErrFormatted)", "kernel", "beegfs.communication_error", IO_RELAY),
]

SECONDARIES = [
    Secondary("pcieport 0000:00:03.1: AER: Corrected error received: 0000:3b:00.0",
              "Linux aer.c: corrected means recovered", "pcieport 0000:00:03.1: AER: Uncorrected (Fatal) error "
              "received: 0000:3b:00.0"),
    Secondary("pcieport 0000:00:03.1: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)",
              "Linux aer.c", "pcieport 0000:00:03.1: PCIe Bus Error: severity=Uncorrected (Fatal), "
              "type=Transaction Layer, (Requester ID)"),
    Secondary("mce: [Hardware Error]: Machine check events logged", "Linux mce/core.c mce_notify_irq (corrected "
              "errors too)", "EDAC MC3: 1 UE memory read error on CPU_SrcID#1_MC#1_Chan#2_DIMM#0 (channel:2)"),
    Secondary("EDAC MC1: 262 CE memory read error on CPU_SrcID#0_Ha#0_Chan#1_DIMM#0 (channel:1 slot:0)",
              "Linux edac_mc.c (CE: corrected)", "EDAC MC3: 1 UE memory read error on CPU_SrcID#1_MC#1_Chan#2_DIMM#0"),
    Secondary("Memory failure: 0x3bd2b7d: recovery action for dirty LRU page: Recovered",
              "Linux mm/memory-failure.c, after the machine check",
              "mce: Uncorrected hardware memory error in user-access at 3bd2b7d880"),
    Secondary("NVRM: GPU 0000:81:00.0: rm_init_adapter failed, device minor number 0",
              "NVIDIA driver: printed after RmInitAdapter failed", "NVRM: GPU 0000:81:00.0: RmInitAdapter failed! "
              "(0x25:0x40:1470)"),
    Secondary("NVRM: Xid (PCI:0000:3b:00): 45, pid=4242, name=python, Ch 00000010", "NVIDIA Xid catalogue: 45 "
              "'Preemptive cleanup, due to previous errors'", "NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has "
              "fallen off the bus."),
    Secondary("NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot "
              "Required)", "NVIDIA Xid catalogue: 154 reports the recovery action another error needs",
              "NVRM: Xid (PCI:0000:3b:00): 95, pid=4242, name=python, Uncontained: FBHUB. RST: Yes, D-RST: No"),
    Secondary("No devices were found", "nvidia-smi, when the driver could not bring up a GPU",
              "NVRM: GPU 0000:81:00.0: RmInitAdapter failed! (0x25:0x40:1470)"),
    Secondary("oom_reaper: reaped process 4242 (python), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB",
              "Linux mm/oom_kill.c oom_reap_task", "Out of memory: Killed process 4242 (python) total-vm:1kB"),
    Secondary("EXT4-fs (sda1): Remounting filesystem read-only", "Linux fs/ext4/super.c ext4_handle_error",
              "EXT4-fs error (device sda1): ext4_find_entry:1455: inode #2: comm python: reading directory"),
    Secondary("Aborting journal on device sda1-8.", "Linux fs/jbd2/journal.c",
              "EXT4-fs error (device sda1): ext4_find_entry:1455: inode #2: comm python: reading directory"),
    Secondary("srun: error: node107: task 0: Out Of Memory", "Slurm srun: relays slurmstepd's oom_kill count",
              "slurmstepd: error: Detected 1 oom_kill event in StepId=1234.0. Some of the step tasks have been OOM "
              "Killed."),
    Secondary("srun: error: node01: task 1: Killed", "Slurm srun: a task's end", "Out of memory: Killed process "
              "4242 (python) total-vm:1kB"),
    Secondary("srun: error: cn125: task 0: Segmentation fault (core dumped)", "Slurm srun: a task's end",
              "python[4242]: segfault at 0 ip 00007f7c7ac69996 sp 00007f7c12fd7c30 error 4 in libc.so.6[7f+1b]"),
    Secondary("srun: Job step aborted: Waiting up to 32 seconds for job step to finish.", "Slurm srun",
              "srun: error: Node failure on node01"),
    Secondary("Kill task failed root 2024-01-25T15:12:23 gpu-23", "Slurm drain reason (UnkillableStepTimeout)",
              "INFO: task python:4242 blocked for more than 120 seconds."),
    Secondary("slurmstepd: error: *** JOB 1234 STEPD TERMINATED ON node01 AT 2024-01-25T15:12:23 DUE TO JOB NOT "
              "ENDING WITH SIGNALS ***", "Slurm slurmstepd (UnkillableStepTimeout)",
              "INFO: task python:4242 blocked for more than 120 seconds."),
    Secondary("node01      1     gpu*       down*   64   2:16:2  512000        0      1   (null) Not responding",
              "Slurm sinfo -lNe (state suffix '*': not responding; reason 'Not responding')",
              "slurmctld: error: Nodes node01 not responding, setting DOWN"),
    Secondary("[2022-05-27T11:37:57.377] _job_complete: JobId=127441 WTERMSIG 9", "Slurm slurmctld job_mgr.c "
              "job_complete (a job ended by a signal)", "Out of memory: Killed process 4242 (python) total-vm:1kB"),
    Secondary("Prolog error root 2024-01-25T15:12:23 gpu-23", "Slurm drain reason", "slurmd[4242]: error: "
              "prolog failed: rc:230 output:Error running slurm prolog: 230"),
    Secondary("Reason:       Evicted", "Kubernetes pod status reason", "Message:      The node was low on "
              "resource: memory. Threshold quantity: 100Mi, available: 88Mi."),
    Secondary("Reason:       OOMKilled", "Kubernetes container status reason: the kernel's kill relayed",
              "Memory cgroup out of memory: Killed process 4242 (python) total-vm:1kB, anon-rss:1kB"),
    Secondary("Reason:       ContainerCannotRun", "Kubernetes container status reason", "Message:      OCI runtime "
              "create failed: runc create failed: unable to start container process: error during container init: "
              "error running hook #0: error running hook: exit status 1, stdout: , stderr: nvidia-container-cli: "
              "initialization error: nvml error: driver not loaded: unknown"),
    Secondary("Reason:       CreateContainerError", "Kubernetes container status reason", "Message:      failed to "
              "create containerd task: failed to create shim task: OCI runtime create failed: unknown"),
    Secondary("Warning  BackOff  3m  kubelet  Back-off restarting failed container trainer in pod trainer-0",
              "Kubernetes kubelet (CrashLoopBackOff)", "Reason:       OOMKilled"),
    Secondary("Warning  FailedMount  1m  kubelet  Unable to attach or mount volumes: unmounted volumes=[data], "
              "unattached volumes=[data]: timed out waiting for the condition", "Kubernetes kubelet",
              'Warning  FailedMount  2m  kubelet  MountVolume.SetUp failed for volume "data" : mount failed: exit '
              "status 32"),
    Secondary("Warning  NodeNotReady  5m  node-controller  Node node01 status is now: NodeNotReady",
              "Kubernetes node lifecycle controller", "Ready            False   KubeletNotReady              PLEG is "
              "not healthy: pleg was last seen active 3m0s ago; threshold is 3m0s"),
    Secondary("amdgpu: The cp might be in an unrecoverable state due to an unsuccessful queues preemption",
              "Linux drivers/gpu/drm/amd/amdkfd/kfd_device_queue_manager.c unmap_queues_cpsch",
              "amdgpu: qcm fence wait loop timeout expired"),
    Secondary("amdgpu: Failed to evict process queues", "Linux drivers/gpu/drm/amd/amdkfd/kfd_process.c "
              "kfd_process_evict_queues", "amdgpu: qcm fence wait loop timeout expired"),
    Secondary("amdgpu 0000:c5:00.0: amdgpu: failed to remove hardware queue from MES, doorbell=0x1802",
              "Linux drivers/gpu/drm/amd/amdkfd/kfd_device_queue_manager.c remove_queue_mes",
              "amdgpu 0000:c5:00.0: amdgpu: MES failed to respond to msg=REMOVE_QUEUE"),
    Secondary("amdgpu 0000:c5:00.0: amdgpu: MES might be in unrecoverable state, issue a GPU reset",
              "Linux drivers/gpu/drm/amd/amdkfd/kfd_device_queue_manager.c remove_queue_mes",
              "[drm:mes_v11_0_submit_pkt_and_poll_completion.constprop.0 [amdgpu]] *ERROR* MES failed to response "
              "msg=3"),
    Secondary("md/raid1:md0: Operation continuing on 1 devices.", "Linux drivers/md/raid1.c raid1_error (its second "
              "line)", "md/raid1:md0: Disk failure on sda1, disabling device."),
    Secondary("amdgpu 0000:c5:00.0: amdgpu: [drm] AMDGPU device coredump file has been created",
              "Linux drivers/gpu/drm/amd/amdgpu/amdgpu_dev_coredump.c (printed by the job-timeout handler first)",
              "amdgpu 0000:c5:00.0: amdgpu: ring gfx_0.0.0 timeout, signaled seq=2662395, emitted seq=2662397"),
    Secondary("XidCriticalError: Xid=79 on Device=GPU-26fba6b2-9e52-006e-68db-4ce18382a5ea; marking device as "
              "unhealthy.", "NVIDIA k8s-device-plugin health check", "NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU "
              "has fallen off the bus."),
    # --- producers the first survey did not reach ---
    Secondary(FABRIC_RELAY, "cudaErrorSystemNotReady (802): the CUDA runtime's account of a fabric Fabric Manager has "
              "not brought up", "[Sep 08 2025 23:21:50] [ERROR] detected number of NVSwitches don't match with any "
              "supported system topology, aborting fabric manager"),
    Secondary("/usr/lib/python3/dist-packages/torch/cuda/__init__.py:128: UserWarning: CUDA initialization: "
              "Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before calling "
              "NumCudaDevices() that might have already set an error? Error 802: system not yet initialized "
              "(Triggered internally at ../c10/cuda/CUDAFunctions.cpp:108.)", "PyTorch c10/cuda/CUDAFunctions.cpp "
              "(cudaErrorSystemNotReady at device count)", "[Jul 23 2024 07:53:55] [ERROR] [tid 841] detected NVSwitch "
              "fatal error 20034 on fid 0 on NVSwitch pci bus id 00000000:86:00.0 physical id 3 port 33"),
    Secondary("mlx5_core 0000:41:00.0: print_health_info:435:(pid 0): assert_var[0] 0x00000001",
              "Linux mlx5 health.c print_health_info: the health buffer dumped under the report",
              "mlx5_core 0000:41:00.0: poll_health:800:(pid 0): Fatal error 1 detected"),
    Secondary("mlx5_core 0000:41:00.0: print_health_info:441:(pid 0): ext_synd 0x8f3a",
              "Linux mlx5 health.c print_health_info", "mlx5_core 0000:41:00.0: poll_health:852:(pid 0): device's "
              "health compromised - reached miss count"),
    Secondary("mlx5_core 0000:41:00.0: mlx5_health_try_recover:318:(pid 920): handling bad device here",
              "Linux mlx5 health.c mlx5_health_try_recover: recovery after the fatal error",
              "mlx5_core 0000:41:00.0: poll_health:800:(pid 0): Fatal error 1 detected"),
    Secondary("mlx5_core 0000:41:00.0: mlx5_handle_bad_state:300:(pid 920): Expected to see disabled NIC but it is "
              "has invalid value 7", "Linux mlx5 health.c mlx5_handle_bad_state",
              "mlx5_core 0000:41:00.0: poll_health:800:(pid 0): Fatal error 1 detected"),
    Secondary("mlx5_core 0000:3b:00.0: mlx5_pci_err_detected Device state = 1 pci_status: 1. Exit, result = 3, need "
              "reset", "Linux mlx5 main.c mlx5_pci_err_detected (5.16+): the driver's PCI error handler, after AER",
              "pcieport 0000:00:03.1: AER: Uncorrected (Fatal) error received: 0000:3b:00.0"),
    Secondary("mlx5_core 0000:3b:00.0: mlx5_pci_err_detected was called", "Linux mlx5 main.c (before 5.16)",
              "pcieport 0000:00:03.1: AER: Uncorrected (Fatal) error received: 0000:3b:00.0"),
    Secondary("mlx5_core 0000:56:00.0: mlx5_cmd_comp_handler:1709:(pid 0): Command completion arrived after timeout "
              "(entry idx = 0).", "Linux mlx5 cmd.c mlx5_cmd_comp_handler", "mlx5_core 0000:56:00.0: "
              "wait_func_handle_exec_timeout:1159:(pid 72061): cmd[0]: ACCESS_REG(0x805) No done completion"),
    Secondary("Jun 17 17:21:28 923315 [4E8006C0] 0x02 -> log_notice: Reporting Generic Notice type:1 num:128 (Link "
              "state change) from LID:1 GID:fe80::20:0", "OpenSM osm_inform.c log_notice: the trap forwarded",
              "Jun 17 17:21:28 922890 [4E8006C0] 0x01 -> log_trap_info: Received Generic Notice type:1 num:128 (Link "
              "state change) Producer:2 (Switch) from LID:1 TID:0x0000000000000000"),
    Secondary("Jun 17 17:21:28 922890 [4E8006C0] 0x01 -> log_trap_info: Received Generic Notice type:1 num:128 (Link "
              "state change) Producer:2 (Switch) from LID:1 TID:0x0000000000000000", "OpenSM opensm/osm_trap_rcv.c "
              "log_trap_info (trap 128: a link went down - or came up, in the same words)",
              "mlx5_core 0000:3b:00.0 ens1f0: Link down"),
    Secondary("efa 0000:10:1c.0 rdmap16s28: Failed to submit command DESTROY_QP (opcode 4) err -19",
              "Linux efa_com.c efa_com_cmd_exec: the admin queue closed after the device stopped answering",
              "efa 0000:10:1c.0 rdmap16s28: The device didn't send any completion for admin cmd CREATE_QP(1) status "
              "1 (ctx 0x00000000a5c3e1f2, sq producer: 18, sq consumer: 17, cq consumer: 17)"),
    Secondary("efa 0000:10:1c.0 rdmap16s28: Admin queue is closed", "Linux efa_com.c efa_com_submit_admin_cmd",
              "efa 0000:10:1c.0 rdmap16s28: Reading register timed out. expected: req id[5] offset[0x18] actual: req "
              "id[4] offset[0x18]"),
    Secondary("ip-10-0-0-2:4242:4300 [0] nccl_net_ofi_rdma_handle_error_entry:1012 NCCL WARN NET/OFI Request "
              "0x7f3c2c0b8e40 completed with error. RC: 107. Error: 9 (Bad queue pair (QP) number (QP does not exist "
              "or is in error state)). Completed length: 0, Request: { dev: 0, size: 0, state: CREATED, type: SEND }",
              "libfabric efa_errno.c efa_show_help: 'typically encountered when the peer process is no longer "
              "present'", "RuntimeError: CUDA error: an illegal memory access was encountered"),
    Secondary("ip-10-0-0-2:4242:4300 [0] nccl_net_ofi_rdma_handle_error_entry:1012 NCCL WARN NET/OFI Request "
              "0x7f3c2c0b8e40 completed with error. RC: 125. Error: 1 (Flushed during queue pair destroy). Completed "
              "length: 0, Request: { dev: 0, size: 0, state: CREATED, type: RECV }", "libfabric efa_errno.h "
              "EFA_IO_COMP_STATUS_FLUSHED", "RuntimeError: CUDA error: an illegal memory access was encountered"),
    Secondary("Reason=batch job complete failure [slurm@2024-02-20T16:06:16]", "Slurm scontrol show node (drain "
              "reason)", "[2024-02-20T16:06:16.263] error: slurmd error running JobId=50 on node(s)=runner01: Plugin "
              "initialization failed"),
    Secondary("Reason=Low RealMemory [slurm@2024-01-25T15:12:23]", "Slurm scontrol show node (drain reason)",
              "slurmctld: error: Node node01 has low real_memory size (515000 < 1031000)"),
    Secondary("Reason=Low socket*core*thread count, Low CPUs [slurm@2024-01-25T15:12:23]", "Slurm scontrol show node "
              "(drain reason)", "slurmd-worker1: error: Node configuration differs from hardware: CPUs=2:2(hw) "
              "Boards=1:1(hw) SocketsPerBoard=2:1(hw) CoresPerSocket=1:2(hw) ThreadsPerCore=1:1(hw)"),
    Secondary("Reason=Not responding [slurm@2024-01-25T15:12:23]", "Slurm scontrol show node (node state reason)",
              "Kernel panic - not syncing: Fatal exception"),
    Secondary("Reason=Node unexpectedly rebooted boot_time=1706195543 last response=1706195400 "
              "[slurm@2024-01-25T15:12:23]", "Slurm scontrol show node (drain reason)",
              "Kernel panic - not syncing: Fatal exception"),
    Secondary("Reason=Kill task failed [root@2024-01-25T15:12:23]", "Slurm scontrol show node (drain reason)",
              "INFO: task python:4242 blocked for more than 120 seconds."),
    Secondary("Epilog error root 2024-01-25T15:12:23 gpu-23", "Slurm sinfo -R (drain reason)",
              "slurmd[4242]: error: [job 1234] epilog failed status=1:0"),
    Secondary('Warning  Unhealthy  10s (x3 over 30s)  kubelet  Liveness probe failed: Get "http://10.0.0.5:8080/'
              'healthz": context deadline exceeded (Client.Timeout exceeded while awaiting headers)',
              "Kubernetes pkg/kubelet/prober/prober.go (ContainerUnhealthy)", "NVRM: Xid (PCI:0000:3b:00): 79, pid=0, "
              "GPU has fallen off the bus."),
    Secondary("Warning  Unhealthy  5s  kubelet  Readiness probe failed: HTTP probe failed with statuscode: 503",
              "Kubernetes pkg/kubelet/prober/prober.go", "Memory cgroup out of memory: Killed process 4242 (python) "
              "total-vm:1kB, anon-rss:1kB"),
    Secondary("Normal   Killing  30s  kubelet  Container trainer failed liveness probe, will be restarted",
              "Kubernetes pkg/kubelet/kuberuntime (the kill after the probe)", "NVRM: Xid (PCI:0000:3b:00): 79, "
              "pid=0, GPU has fallen off the bus."),
    Secondary("'nvidia.com/gpu' device marked unhealthy: GPU-26fba6b2-9e52-006e-68db-4ce18382a5ea",
              "NVIDIA k8s-device-plugin (health check)", "NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off "
              "the bus."),
    Secondary("  12 | 01/15/2024 | 10:23:40 | Memory #0x53 | Correctable ECC | Asserted", "ipmitool sel list: a "
              "corrected error", "   1 | 01/15/2024 | 10:23:45 | Memory #0x53 | Uncorrectable ECC | Asserted"),
    Secondary("  13 | 03/02/2024 | 08:10:01 | Power Supply #0x51 | Failure detected | Deasserted", "ipmitool sel list: "
              "the event's end", "   8 | 03/02/2024 | 08:00:01 | Power Supply #0x51 | Failure detected | Asserted"),
    Secondary("beegfs: Messaging (RPC): Retrying communication with node: storage01 [ID: 101]", "BeeGFS MessagingTk.c "
              "(Log_NOTICE, the retry after the error)", "beegfs: Messaging (RPC): Communication error: Node: "
              "storage01 [ID: 101] (comm result: -104; message type: 2009)"),
]


def _xid_rows() -> list[tuple[int, str, str]]:
    with (data_dir() / "xid_levels.csv").open(encoding="utf-8") as handle:
        return [(int(row["xid"]), row["description"], row["level"]) for row in csv.DictReader(handle)]


XID_CONSEQUENCES = {45, 154}
XID_ROWS = [row for row in _xid_rows() if row[0] not in XID_CONSEQUENCES]


def _node_file(layer: str) -> str:
    return "dmesg.log" if layer in ("hardware", "driver", "kernel") else "job.log"


@pytest.mark.parametrize("entry", ROOTS, ids=lambda e: e.signature + ":" + e.message[:40])
def test_a_documented_failure_message_is_a_root_at_its_layer(tmp_path: Path, entry: Root) -> None:
    # beside a consequence one layer up, in a file with no wall-clock time either, the message is still the root
    assert_root_alone_and_beside(tmp_path, entry.message, entry.source, entry.signature,
                                 entry.filename or _node_file(entry.layer), entry.relay, "rank_0.log")


@pytest.mark.parametrize(("xid", "description", "level"), XID_ROWS, ids=lambda v: str(v)[:20])
def test_every_catalogued_xid_is_a_root_with_the_catalogues_level(tmp_path: Path, xid: int, description: str,
                                                                   level: str) -> None:
    (tmp_path / "dmesg.log").write_text(f"NVRM: Xid (PCI:0000:3b:00): {xid}, pid=4242, name=python, {description}\n")
    (tmp_path / "rank_0.log").write_text(CUDA_RELAY + "\n")
    result = triage(tmp_path)
    assert result.root is not None and result.root.source == "dmesg.log", result.summary
    assert result.root.signature == "nvrm.xid" and result.root.attrs["xid"] == xid
    assert result.root.level.label == level


@pytest.mark.parametrize("entry", SECONDARIES, ids=lambda e: e.message[:48])
def test_a_documented_consequence_never_outranks_its_cause(tmp_path: Path, entry: Secondary) -> None:
    assert_cause_named_after_its_consequence(tmp_path, entry, "node.log")


@pytest.mark.parametrize("earlier", [
    "NVRM: Xid (PCI:0000:61:00): 45, pid=1496200, name=python, Ch 0000000a",
    "NVRM: GPU 0000:a1:00.0: rm_init_adapter failed, device minor number 7",
])
def test_a_task_blocked_after_a_gpu_driver_report_is_not_named_over_it(tmp_path: Path, earlier: str) -> None:
    # The hung-task detector reports a task waiting behind something; a driver report earlier in the same file is the
    # failure it waits behind, even one NVIDIA's catalogue calls a consequence (Xid 45, rm_init_adapter's second line)
    blocked = ("INFO: task python:4242 blocked for more than 120 seconds.\n"
               "task:python          state:D stack:    0 pid:4242 ppid: 4200 flags:0x00000002\n")
    (tmp_path / "dmesg.log").write_text(earlier + "\n" + blocked)
    result = triage(tmp_path)
    assert result.root is not None and result.root.lineno == 1, result.summary
    # alone, or after what is not a driver report, the blocked task is still named
    (tmp_path / "dmesg.log").write_text("EDAC MC1: 2 CE memory read error on CPU_SrcID#0_MC#0_Chan#1_DIMM#0\n"
                                        "INFO: task python:4242 blocked for more than 120 seconds.\n")
    result = triage(tmp_path)
    assert result.root is not None and result.root.signature == "kernel.hung_task", result.summary


def test_a_ring_timeout_stays_the_root_before_the_schedulers_timeout_in_its_recovery(tmp_path: Path) -> None:
    # amdgpu_job_timedout resets the GPU after a ring hang, and the reset's queue removals can time out in MES too; the
    # hang printed first is the root, while an MES or fence timeout with no ring timeout before it is one itself
    (tmp_path / "dmesg.log").write_text(
        "amdgpu 0000:c5:00.0: amdgpu: ring gfx_0.0.0 timeout, signaled seq=7, emitted seq=9\n"
        "amdgpu 0000:c5:00.0: amdgpu: MES failed to respond to msg=REMOVE_QUEUE\n")
    result = triage(tmp_path)
    assert result.root is not None and result.root.signature == "amdgpu.ring_timeout", result.summary
