"""Fabric and storage coverage of the signature library, from the producers' source at pinned tags.

The layer a training job fails through below the training process: the RDMA fabric (the ConnectX NIC's driver, IPoIB,
the verbs tools, UCX), the NVLink fabric (the NVSwitch driver's SXid lines), and the storage a checkpoint is written
to (Lustre and its network, the NFS client, the block layer, ext4 and XFS) with the Python-side wording a failed
checkpoint write prints. Each row is a line built around its producer's format string, with a realistic prefix (the
kernel's ``[seconds.micros]`` stamp, UCX's ``[time] [host:pid:tid] file:line UCX  LEVEL``), where the surveys before
this one had not already covered it:

* Linux (github.com/torvalds/linux, the stored versions of each file): mlx5_core ``health.c``
  (mlx5_fw_fatal_reporter_err_work), ``cmd.c`` (mlx5_cmd_out_err since 6.1, mlx5_cmd_check before), ``events.c``
  (mlx5_port_module_event), ``en_main.c`` (mlx5e_tx_timeout) and ``en/reporter_tx.c`` (mlx5e_reporter_tx_timeout);
  ``net/sched/sch_generic.c`` dev_watchdog (before and since 6.8); IPoIB ``ipoib_main.c`` ipoib_timeout and
  ``ipoib_multicast.c`` ipoib_mcast_join_complete; SCSI ``scsi_logging.c`` / ``scsi_lib.c``; ext4 ``inode.c``
  mpage_map_and_submit_extent; ``jbd2/journal.c`` jbd2_journal_abort; XFS ``xfs_fsops.c`` xfs_do_force_shutdown and
  ``xfs_log.c``;
* rdma-core ``v59.0`` (github.com/linux-rdma/rdma-core): ``libibverbs/examples/devinfo.c`` (ibv_devinfo),
  ``libibverbs/dynamic_driver.c``, ``libibmad/mad.h`` IBPANIC as ``infiniband-diags/ibstat.c`` calls it;
* UCX ``v1.18.0`` (github.com/openucx/ucx): ``src/uct/ib/mlx5/ib_mlx5_log.c``, ``src/uct/ib/base/ib_device.c``
  uct_ib_handle_async_event, ``src/uct/ib/base/ib_md.c`` uct_ib_md_print_mem_reg_err_msg with ``ib_log.c``
  uct_ib_memlock_limit_msg, ``src/ucp/wireup/select.c``, ``src/ucp/core/ucp_ep.c`` ucp_ep_set_failed,
  ``src/ucs/config/parser.c``;
* NVIDIA open-gpu-kernel-modules ``595.45.04``: ``src/common/nvswitch/kernel/inc/common_nvswitch.h``
  NVSWITCH_PRINT_SXID, ``intr_nvswitch.h`` NVSWITCH_REPORT_FATAL / _NONFATAL, ``error_nvswitch.c``
  _nvswitch_dump_error_entry, ``ls10/soe_ls10.c``, ``ls10/therm_ls10.c``, ``kernel-open/nvidia/linux_nvswitch.c``;
* Lustre ``v2_15_5`` (github.com/lustre/lustre-release): ``lustre/ptlrpc/client.c`` ptlrpc_expire_one_request,
  ``lustre/ptlrpc/import.c`` (lost, evicted, restored), ``lnet/klnds/o2iblnd/o2iblnd_cb.c`` (kiblnd_check_txs_locked,
  kiblnd_check_conns), ``lustre/ldlm/ldlm_lockd.c``;
* PyTorch ``caffe2/serialize/inline_container.cc`` (torch.save's zip writer) and ``torch/distributed/checkpoint/api.py``
  CheckpointException; safetensors ``bindings/python/src/lib.rs`` ("Error while serializing: {e:?}"); CPython's
  OSError text for ESHUTDOWN (108) and ENOTCONN (107), what an evicted Lustre client and a dead FUSE mount return.

Roles as in the other surveys: ``root`` (named alone by its signature, and still the root beside a lower-ranked line
in another file with no wall-clock time), ``consequence`` (printed before its cause in the same file, the cause is
named; alone, it is named), ``benign`` (a line of the same producer that reports nothing wrong: no root signature names
it).
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

K = "[873214.553120] "  # the kernel ring buffer's seconds since boot: no wall-clock time
LINUX = "Linux (stored version) "
RDMA_CORE = "rdma-core v59.0 "
UCX = "UCX v1.18.0 "
UCX_AT = "[1733467800.123456] [n1:4242:0] "
NVSW = "NVIDIA open-gpu-kernel-modules 595.45.04 "
LUSTRE = "lustre-release v2_15_5 "
TORCH = "PyTorch "
OSC = "scratch-OST0001-osc-ffff8803c0a1b000"
# What a rank prints when the fabric under it failed: NCCL's failed IB completion (nccl.ib_completion_error).
NET_RELAY = ("n1:4242:4300 [0] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer 10.0.0.2<4789> "
             "with status=IBV_WC_RETRY_EXC_ERR(12) opcode=0 len=0 vendor_err=129 hca mlx5_0")
# What a rank prints when the NVLink fabric failed under it.
CUDA_RELAY = "RuntimeError: CUDA error: unspecified launch failure"
# What a rank prints when its checkpoint write failed on the storage below it.
IO_RELAY = "OSError: [Errno 5] Input/output error: '/ckpt/step_800/model.pt'"
# What the launcher prints once a rank raised: below every report of what failed.
LAUNCHER_RELAY = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: "
MLX5 = "mlx5_core 0000:3b:00.0"
HEALTH_FATAL = K + MLX5 + ": poll_health:817:(pid 0): Fatal error 1 detected"
RETRY_EXCEEDED = (UCX_AT + "    ib_mlx5_log.c:179  UCX  ERROR Transport retry count exceeded on mlx5_0:1/IB (synd 0x15 "
                  "vend 0x81 hw_synd 0/0)")
SXID_FATAL = K + "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 24007, Fatal, Link 30 sourcetrack timeout error (First)"
ENOSPC = "OSError: [Errno 28] No space left on device: '/ckpt/step_800/__3_0.distcp'"
STREAM_WRITER = ("RuntimeError: [enforce fail at inline_container.cc:778] . PytorchStreamWriter failed writing file "
                 "data/58: file write failed")


@dataclass(frozen=True)
class Root:
    message: str
    source: str
    signature: str
    filename: str = "dmesg.log"
    relay: str = IO_RELAY


ROOTS = [
    # --- the ConnectX NIC (mlx5_core) and the netdevs over it ---
    Root(K + MLX5 + ": mlx5_fw_fatal_reporter_err_work:690:(pid 920): Driver is in error state. Unloading",
         LINUX + "drivers/net/ethernet/mellanox/mlx5/core/health.c mlx5_fw_fatal_reporter_err_work (the fw_fatal "
         "reporter's recovery gave up)", "kernel.mlx5_fatal", relay=NET_RELAY),
    Root(K + MLX5 + ": mlx5_port_module_event:1170:(pid 0): Port module event[error]: module 0, Cable error, High "
         "Temperature", LINUX + "mlx5/core/events.c mlx5_port_module_event ('Port module event[error]: module %u, %s, "
         "%s')", "kernel.nic_link_down", relay=NET_RELAY),
    Root(K + MLX5 + ": mlx5_port_module_event:1170:(pid 0): Port module event[error]: module 1, Cable error, Bad or "
         "shorted cable/module", LINUX + "mlx5/core/events.c mlx5_port_module_event", "kernel.nic_link_down",
         relay=NET_RELAY),
    Root(K + MLX5 + ": mlx5_port_module_event:1165:(pid 0): Port module event: module 0, Cable unplugged",
         LINUX + "mlx5/core/events.c mlx5_port_module_event ('Port module event: module %u, %s')",
         "kernel.nic_link_down", relay=NET_RELAY),
    Root(K + "NETDEV WATCHDOG: ens1f0np0 (mlx5_core): transmit queue 5 timed out",
         LINUX + "net/sched/sch_generic.c dev_watchdog (before 6.8: 'NETDEV WATCHDOG: %s (%s): transmit queue %u "
         "timed out')", "kernel.netdev_tx_timeout", relay=NET_RELAY),
    Root(K + MLX5 + " ens1f0np0: NETDEV WATCHDOG: CPU: 3: transmit queue 5 timed out 5368 ms",
         LINUX + "net/sched/sch_generic.c dev_watchdog (6.8+: netdev_crit 'NETDEV WATCHDOG: CPU: %d: transmit queue "
         "%u timed out %u ms')", "kernel.netdev_tx_timeout", relay=NET_RELAY),
    Root(K + MLX5 + " ens1f0np0: TX timeout detected", LINUX + "mlx5/core/en_main.c mlx5e_tx_timeout",
         "kernel.netdev_tx_timeout", relay=NET_RELAY),
    Root(K + MLX5 + " ens1f0np0: TX timeout on queue: 5, SQ: 0x10c4, CQ: 0x4a1, SQ Cons: 0x2e9f SQ Prod: 0x2ea3, "
         "usecs since last trans: 15044000", LINUX + "mlx5/core/en/reporter_tx.c mlx5e_reporter_tx_timeout",
         "kernel.netdev_tx_timeout", relay=NET_RELAY),
    Root(K + "ib0: transmit timeout: latency 10240 msecs", LINUX + "drivers/infiniband/ulp/ipoib/ipoib_main.c "
         "ipoib_timeout ('transmit timeout: latency %d msecs')", "kernel.netdev_tx_timeout", relay=NET_RELAY),
    Root(K + "ib0: multicast join failed for ff12:401b:ffff:0000:0000:0000:ffff:ffff, status -22",
         LINUX + "ipoib/ipoib_multicast.c ipoib_mcast_join_complete (warn level for a status other than -ETIMEDOUT / "
         "-EAGAIN: the subnet manager refused the broadcast group)", "ipoib.mcast_join_failed", relay=NET_RELAY),
    # --- the verbs tools: no RDMA device at all ---
    Root("No IB devices found", RDMA_CORE + "libibverbs/examples/devinfo.c main", "ib.no_device", "ibv_devinfo.txt",
         NET_RELAY),
    Root("Failed to get IB devices list: Function not implemented", RDMA_CORE + "libibverbs/examples/devinfo.c "
         "(perror after ibv_get_device_list: no ib_uverbs in the kernel)", "ib.no_device", "ibv_devinfo.txt",
         NET_RELAY),
    Root("IB device 'mlx5_2' wasn't found", RDMA_CORE + "libibverbs/examples/devinfo.c (-d names a device the node "
         "does not have)", "ib.no_device", "ibv_devinfo.txt", NET_RELAY),
    Root("ibpanic: [8243] main: can't list IB device names: No such file or directory",
         RDMA_CORE + "libibmad/mad.h IBPANIC ('ibpanic: [%d] %s: ' fmt ': %m'), infiniband-diags/ibstat.c:310",
         "ib.no_device", "ibstat.txt", NET_RELAY),
    # --- UCX ---
    Root(UCX_AT + "    ib_mlx5_log.c:179  UCX  ERROR Local protection error on mlx5_0:1/IB (synd 0x4 vend 0x51 "
         "hw_synd 0/2)", UCX + "src/uct/ib/mlx5/ib_mlx5_log.c uct_ib_mlx5_completion_with_err",
         "ucx.ib_completion_error", "rank_0.log", LAUNCHER_RELAY),
    Root(UCX_AT + "    ib_mlx5_log.c:179  UCX  ERROR Remote access error on mlx5_2:1/RoCE (synd 0x10 vend 0x88 "
         "hw_synd 0/0)", UCX + "src/uct/ib/mlx5/ib_mlx5_log.c (RoCE port)", "ucx.ib_completion_error", "rank_0.log",
         LAUNCHER_RELAY),
    Root(UCX_AT + "     ib_device.c:479  UCX  ERROR IB Async event on mlx5_0: local work queue catastrophic error on "
         "QPN 0x1a2", UCX + "src/uct/ib/base/ib_device.c:479 uct_ib_handle_async_event (IBV_EVENT_QP_FATAL, error "
         "level)", "ucx.ib_async_event", "rank_0.log", LAUNCHER_RELAY),
    Root(UCX_AT + "     ib_device.c:479  UCX  DIAG  IB Async event on mlx5_0: port error on port 1",
         UCX + "src/uct/ib/base/ib_device.c:479 (IBV_EVENT_PORT_ERR, diag level)", "ucx.ib_async_event", "rank_0.log",
         LAUNCHER_RELAY),
    Root(UCX_AT + "     ib_device.c:479  UCX  DIAG  IB Async event on mlx5_0: local catastrophic error on port 1",
         UCX + "src/uct/ib/base/ib_device.c:479 (IBV_EVENT_DEVICE_FATAL)", "ucx.ib_async_event", "rank_0.log",
         LAUNCHER_RELAY),
    Root(UCX_AT + "         ib_md.c:280  UCX  ERROR ibv_reg_mr(address=0x7f3c40000000, length=268435456, access=0xf) "
         "failed: Cannot allocate memory : Please set max locked memory (ulimit -l) to 'unlimited' (current: 65536 "
         "kbytes)", UCX + "src/uct/ib/base/ib_md.c:266 uct_ib_md_print_mem_reg_err_msg, ib_log.c:248 "
         "uct_ib_memlock_limit_msg", "ucx.mem_reg_failed", "rank_0.log", LAUNCHER_RELAY),
    Root(UCX_AT + "        select.c:644  UCX  ERROR no active messages transport to <no debug data>: self/memory - "
         "Destination is unreachable, tcp/eth0 - Destination is unreachable",
         UCX + "src/ucp/wireup/select.c:644 ('no %s transport to %s: %s')", "ucx.no_transport", "rank_0.log",
         LAUNCHER_RELAY),
    Root(UCX_AT + "     cuda_ipc_md.c:62   UCX  ERROR cuCtxGetDevice(&cu_device) is failed. ret:invalid device context",
         "UCX v1.6.0 src/uct/cuda/base/cuda_iface.h UCT_CUDADRV_FUNC ('%s is failed. ret:%s')", "ucx.cuda_call_failed",
         "rank_0.log", LAUNCHER_RELAY),
    Root(UCX_AT + "      cuda_copy_md.c:254  UCX  ERROR cuMemAlloc failed: out of memory",
         UCX + "src/uct/cuda/base/cuda_util.h UCT_CUDADRV_LOG ('%s failed: %s')", "ucx.cuda_call_failed", "rank_0.log",
         LAUNCHER_RELAY),
    # --- NVSwitch (the nvswitch driver's SXid lines) ---
    Root(SXID_FATAL, NVSW + "intr_nvswitch.h NVSWITCH_REPORT_FATAL ('Fatal, Link %02d %s%s')", "nvswitch.sxid",
         relay=CUDA_RELAY),
    Root(K + "nvidia-nvswitch3: SXid (PCI:0000:88:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error "
         "(First)", NVSW + "intr_nvswitch.h NVSWITCH_REPORT_NONFATAL", "nvswitch.sxid", relay=CUDA_RELAY),
    Root(K + "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 11001, Fatal, unhandled interrupt in "
         "_nvswitch_service_route_fatal_ls10(3)", NVSW + "intr_nvswitch.h ('Fatal, unhandled interrupt in %s(%d)')",
         "nvswitch.sxid", relay=CUDA_RELAY),
    Root(K + "nvidia-nvswitch2: SXid (PCI:0000:86:00.0): 26006, SOE HALTED", NVSW + "ls10/soe_ls10.c:1311 "
         "(NVSWITCH_ERR_HW_SOE_HALT = 26006: the switch's management engine stopped)", "nvswitch.sxid",
         relay=CUDA_RELAY),
    Root(K + "nvidia-nvswitch2: SXid (PCI:0000:86:00.0): 26008, SOE Watchdog error", NVSW + "ls10/soe_ls10.c:1291 "
         "(NVSWITCH_ERR_HW_SOE_WATCHDOG = 26008)", "nvswitch.sxid", relay=CUDA_RELAY),
    Root(K + "nvidia-nvswitch2: SXid (PCI:0000:86:00.0): 10006, TSENSE OVERT Threshold reached. Shutting Down",
         NVSW + "ls10/therm_ls10.c:457 (NVSWITCH_ERR_HW_HOST_THERMAL_SHUTDOWN = 10006)", "nvswitch.sxid",
         relay=CUDA_RELAY),
    # --- Lustre and its network ---
    Root(K + "LNetError: 3147:0:(o2iblnd_cb.c:3438:kiblnd_check_conns()) Timed out RDMA with 10.1.1.1@o2ib (52): c: "
         "0, oc: 0, rc: 63", LUSTRE + "lnet/klnds/o2iblnd/o2iblnd_cb.c:3438 kiblnd_check_conns", "lnet.timeout"),
    Root(K + "LNetError: 3147:0:(o2iblnd_cb.c:3369:kiblnd_check_txs_locked()) Timed out tx: active_txs(WSQ:100), 52 "
         "seconds", LUSTRE + "lnet/klnds/o2iblnd/o2iblnd_cb.c:3369 kiblnd_check_txs_locked", "lnet.timeout"),
    Root(K + "Lustre: 14159:0:(client.c:2289:ptlrpc_expire_one_request()) @@@ Request sent has timed out for slow "
         "reply: [sent 1733467800/real 1733467800]  req@00000000a1b2c3d4 x1790000000000000/t0(0) o4->" + OSC +
         "@10.1.1.1@o2ib:6/4 lens 488/448 e 0 to 1 dl 1733467847 ref 2 fl Rpc:XQr/0/ffffffff rc 0/-1 job:'python.0'",
         LUSTRE + "lustre/ptlrpc/client.c:2289 ptlrpc_expire_one_request (DEBUG_REQ 'Request sent has %s')",
         "kernel.fs_error"),
    Root(K + "Lustre: 14159:0:(client.c:2289:ptlrpc_expire_one_request()) @@@ Request sent has failed due to network "
         "error: [sent 1733467800/real 1733467800]  req@00000000a1b2c3d4 x1790000000000001/t0(0) o400->" + OSC +
         "@10.1.1.1@o2ib:28/4 lens 224/224 e 0 to 1 dl 1733467847 ref 1 fl Rpc:eXNQr/0/ffffffff rc 0/-1",
         LUSTRE + "lustre/ptlrpc/client.c:2290 ('failed due to network error')", "kernel.fs_error"),
    Root(K + "Lustre: " + OSC + ": Connection to scratch-OST0001 (at 10.1.1.1@o2ib) was lost; in progress operations "
         "using this service will wait for recovery to complete", LUSTRE + "lustre/ptlrpc/import.c:196 "
         "ptlrpc_set_import_discon (replayable)", "kernel.fs_error"),
    Root(K + "LustreError: 166-1: MGC10.1.1.2@o2ib: Connection to MGS (at 10.1.1.2@o2ib) was lost; in progress "
         "operations using this service will fail", LUSTRE + "lustre/ptlrpc/import.c:202 (LCONSOLE_ERROR_MSG 0x166)",
         "kernel.fs_error"),
    Root(K + "LustreError: 167-0: " + OSC + ": This client was evicted by scratch-OST0001; in progress operations "
         "using this service will fail.", LUSTRE + "lustre/ptlrpc/import.c:1565 (LCONSOLE_ERROR_MSG 0x167)",
         "kernel.fs_error"),
    Root(K + "LustreError: 4829:0:(ldlm_lockd.c:258:expired_lock_main()) ### lock callback timer expired after 101s: "
         "evicting client at 10.1.2.5@o2ib  ns: filter-scratch-OST0001_UUID lock: 00000000c0ffee00/0x9a1b lrc: 3/0,0 "
         "mode: PW/PW", LUSTRE + "lustre/ldlm/ldlm_lockd.c:258 (the server's side of an eviction)", "kernel.fs_error"),
    # --- the NFS client ---
    Root(K + "nfs: server fs01 not responding, timed out", LINUX + "fs/nfs (soft mount: 'not responding, timed out')",
         "kernel.fs_error"),
    # --- the block layer and the SCSI disk under a local checkpoint ---
    Root(K + "sd 6:0:0:1: [sdb] tag#17 FAILED Result: hostbyte=DID_OK driverbyte=DRIVER_OK cmd_age=0s",
         LINUX + "drivers/scsi/scsi_logging.c scsi_print_result (the disk's own status, before the block layer's "
         "error)", "kernel.scsi_command_failed"),
    Root(K + "sd 6:0:0:1: [sdb] tag#3 FAILED Result: hostbyte=DID_TIME_OUT driverbyte=DRIVER_OK cmd_age=180s",
         LINUX + "drivers/scsi/scsi_logging.c scsi_print_result (host byte)", "kernel.scsi_command_failed"),
    Root(K + "sd 6:0:0:1: [sdb] tag#3 timing out command, waited 180s", LINUX + "drivers/scsi/scsi_lib.c "
         "scsi_cmd_runtime_exceeced ('timing out command, waited %lus')", "kernel.scsi_command_failed"),
    Root(K + "critical target error, dev sdc, sector 1234 op 0x1:(WRITE) flags 0x800 phys_seg 1 prio class 2",
         LINUX + "block/blk-core.c blk_print_req_error (5.18+)", "kernel.fs_error"),
    # --- ext4 and XFS under a checkpoint write ---
    Root(K + "EXT4-fs (dm-0): Delayed block allocation failed for inode 393228 at logical offset 0 with max blocks "
         "2048 with error 28", LINUX + "fs/ext4/inode.c mpage_map_and_submit_extent (writeback found no space)",
         "kernel.fs_error"),
    Root(K + "EXT4-fs error (device dm-0): ext4_journal_check_start:83: comm python: Detected aborted journal",
         LINUX + "fs/ext4/ext4_jbd2.c ext4_journal_check_start", "kernel.fs_error"),
    Root(K + "XFS (dm-0): log I/O error -5", LINUX + "fs/xfs/xfs_log.c xlog_ioend_work ('log I/O error %d')",
         "kernel.fs_error"),
    Root(K + 'XFS (dm-0): metadata I/O error in "xfs_buf_ioend+0x1e4/0x4a0 [xfs]" at daddr 0x1c0 len 8 error 5',
         LINUX + "fs/xfs/xfs_buf.c xfs_buf_ioerror_alert", "kernel.fs_error"),
    # --- the Python side of a failed checkpoint write ---
    Root(ENOSPC, "CPython OSError (ENOSPC) as torch.distributed.checkpoint's writer raises it", "fs.errno",
         "rank_0.log", LAUNCHER_RELAY),
    Root("OSError: [Errno 122] Disk quota exceeded: '/home/user/ckpt/step_800/optim.pt'", "CPython OSError (EDQUOT)",
         "fs.errno", "rank_0.log", LAUNCHER_RELAY),
    Root("OSError: [Errno 116] Stale file handle: '/nfs/ckpt/step_800'", "CPython OSError (ESTALE: the NFS server "
         "lost the file)", "fs.errno", "rank_0.log", LAUNCHER_RELAY),
    Root("OSError: [Errno 108] Cannot send after transport endpoint shutdown: '/lustre/scratch/ckpt/step_800/model.pt'",
         "CPython OSError (ESHUTDOWN: what I/O on a Lustre client evicted by its server returns)", "fs.errno",
         "rank_0.log", LAUNCHER_RELAY),
    Root("OSError: [Errno 107] Transport endpoint is not connected: '/mnt/gcs/ckpt/step_800'",
         "CPython OSError (ENOTCONN: a FUSE mount whose daemon died)", "fs.errno", "rank_0.log", LAUNCHER_RELAY),
    # The same errnos from a socket carry no path: the exception itself, not a storage error.
    Root("OSError: [Errno 107] Transport endpoint is not connected", "CPython OSError with no path (socket.shutdown "
         "or getpeername on a connection its peer closed, in a DataLoader worker, multiprocessing or Ray)",
         "python.exception", "rank_0.log", LAUNCHER_RELAY),
    Root("BrokenPipeError: [Errno 108] Cannot send after transport endpoint shutdown", "CPython BrokenPipeError "
         "(Objects/exceptions.c maps ESHUTDOWN to it) from a send on a socket already shut down", "python.exception",
         "rank_0.log", LAUNCHER_RELAY),
    Root(STREAM_WRITER, TORCH + "caffe2/serialize/inline_container.cc PytorchStreamWriter::writeRecord "
         "('PytorchStreamWriter failed writing file ', name, ': ', 'file write failed'; torch.save on a full disk)",
         "torch.checkpoint_write_failed", "rank_0.log", LAUNCHER_RELAY),
    Root('safetensors_rust.SafetensorError: Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
         'message: "No space left on device" })', "safetensors bindings/python/src/lib.rs serialize_file "
         "('Error while serializing: {e:?}' over std::io::Error)", "fs.errno", "rank_0.log", LAUNCHER_RELAY),
]

CONSEQUENCES = [
    Secondary(K + MLX5 + ": mlx5_cmd_out_err:838:(pid 4242): CREATE_MKEY(0x200) op_mod(0x0) failed, status bad "
              "resource state(0x9), syndrome (0x72f2a0), err(-22)", LINUX + "mlx5/core/cmd.c mlx5_cmd_out_err (6.1+: "
              "'%s(0x%x) op_mod(0x%x) failed, status %s(0x%x), syndrome (0x%x), err(%d)')", HEALTH_FATAL),
    Secondary(K + MLX5 + ": mlx5_cmd_check:772:(pid 4242): CREATE_QP(0x500) op_mod(0x0) failed, status bad "
              "parameter(0x3), syndrome (0x3df58b)", LINUX + "mlx5/core/cmd.c mlx5_cmd_check (before 6.1)",
              K + MLX5 + ": wait_func:1177:(pid 4242): ENABLE_HCA(0x104) timeout. Will cause a leak of a command "
              "resource"),
    Secondary(UCX_AT + "        ucp_ep.c:1514 UCX  ERROR ep 0x7f1eac0b5108: error 'Endpoint timeout' on "
              "rc_mlx5/mlx5_0:1 will not be handled since no error callback is installed",
              UCX + "src/ucp/core/ucp_ep.c:1514 ucp_ep_set_failed (the endpoint's error after the transport's)",
              RETRY_EXCEEDED),
    Secondary(UCX_AT + "        ucp_ep.c:1514 UCX  ERROR ep 0x7f1eac0b5108: error 'Input/output error' on "
              "rc_mlx5/mlx5_0:1 will not be handled since no error callback is installed",
              UCX + "src/ucp/core/ucp_ep.c",
              UCX_AT + "    ib_mlx5_log.c:179  UCX  ERROR Local protection error on mlx5_0:1/IB (synd 0x4 vend 0x51 "
              "hw_synd 0/2)"),
    Secondary(K + "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 24007, Severity 5 Engine instance 30 Sub-engine instance "
              "00", NVSW + "error_nvswitch.c _nvswitch_dump_error_entry (the report's detail)", SXID_FATAL),
    Secondary(K + "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 24007, Data {0x00000000, 0x00000001, 0x00000000, "
              "0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000}",
              NVSW + "error_nvswitch.c _nvswitch_dump_error_entry", SXID_FATAL),
    Secondary(K + "sd 6:0:0:1: [sdb] tag#17 Sense Key : Medium Error [current]", LINUX + "drivers/scsi/scsi_logging.c "
              "scsi_print_sense_hdr (the failed command's sense data)",
              K + "sd 6:0:0:1: [sdb] tag#17 FAILED Result: hostbyte=DID_OK driverbyte=DRIVER_OK cmd_age=0s"),
    Secondary(K + "sd 6:0:0:1: [sdb] tag#17 Add. Sense: Unrecovered read error - auto reallocate failed",
              LINUX + "drivers/scsi/scsi_logging.c scsi_print_sense_hdr",
              K + "sd 6:0:0:1: [sdb] tag#17 FAILED Result: hostbyte=DID_OK driverbyte=DRIVER_OK cmd_age=0s"),
    Secondary(K + "sd 6:0:0:1: [sdb] tag#9 FAILED Result: hostbyte=DID_NO_CONNECT driverbyte=DRIVER_OK cmd_age=0s",
              LINUX + "drivers/scsi/scsi_lib.c scsi_dispatch_cmd ('DID_NO_CONNECT ... signals that the device is no "
              "longer present': what took it away is the cause)", K + "sd 6:0:0:1: rejecting I/O to offline device"),
    Secondary(K + "EXT4-fs (dm-0): This should not happen!! Data will be lost", LINUX + "fs/ext4/inode.c "
              "mpage_map_and_submit_extent (the second line)", K + "EXT4-fs (dm-0): Delayed block allocation failed "
              "for inode 393228 at logical offset 0 with max blocks 2048 with error 28"),
    Secondary(K + "Aborting journal on device dm-0-8.", LINUX + "fs/jbd2/journal.c jbd2_journal_abort",
              K + "JBD2: Error -5 detected when updating journal superblock for dm-0-8."),
    Secondary(K + "XFS (dm-0): xfs_do_force_shutdown(0x2) called from line 1211 of file fs/xfs/xfs_log.c. Return "
              "address = xlog_ioend_work+0x6e/0x70 [xfs]", LINUX + "fs/xfs/xfs_fsops.c xfs_do_force_shutdown",
              K + "XFS (dm-0): log I/O error -5"),
    Secondary(K + "XFS (dm-0): Please unmount the filesystem and rectify the problem(s)",
              LINUX + "fs/xfs/xfs_fsops.c xfs_do_force_shutdown",
              K + "XFS (dm-0): Log I/O Error Detected. Shutting down filesystem"),
    Secondary(K + "XFS (dm-0): Filesystem has been shut down due to log error (0x2).",
              LINUX + "fs/xfs/xfs_fsops.c xfs_do_force_shutdown (6.x)", K + "XFS (dm-0): log I/O error -5"),
    Secondary("RuntimeError: [enforce fail at inline_container.cc:626] . unexpected pos 4849088 vs 4848976",
              TORCH + "caffe2/serialize/inline_container.cc (the zip writer's end, raised while the first failure "
              "unwinds)", STREAM_WRITER),
    Secondary("torch.distributed.checkpoint.api.CheckpointException: CheckpointException ranks:dict_keys([3])",
              TORCH + "torch/distributed/checkpoint/api.py CheckpointException.__str__ (the ranks' own tracebacks "
              "follow it)", ENOSPC),
]

# Lines of the same producers that report nothing wrong: no root signature may name them.
BENIGN = [
    (K + MLX5 + ": mlx5_port_module_event:1165:(pid 0): Port module event: module 0, Cable plugged",
     LINUX + "mlx5/core/events.c mlx5_port_module_event"),
    (K + MLX5 + " ens1f0np0: Link up", LINUX + "mlx5/core/en_main.c mlx5e_update_carrier"),
    (K + MLX5 + ": firmware version: 28.39.1002", LINUX + "mlx5/core/main.c mlx5_function_setup"),
    ("\t\tState: Active", "infiniband-diags ibstat"),
    ("\t\tPhysical state: LinkUp", "infiniband-diags ibstat"),
    ("\t\t\tstate:\t\t\tPORT_ACTIVE (4)", RDMA_CORE + "libibverbs/examples/devinfo.c port_state_str"),
    ("\t\t\tphys_state:\t\tLINK_UP (5)", RDMA_CORE + "libibverbs/examples/devinfo.c port_phy_state_str"),
    ("libibverbs: Warning: couldn't load driver 'libmlx4-rdmav34.so': libmlx4-rdmav34.so: cannot open shared object "
     "file: No such file or directory", RDMA_CORE + "libibverbs/dynamic_driver.c:207 (a provider for hardware the "
     "node does not have)"),
    (UCX_AT + "     ib_device.c:479  UCX  DIAG  IB Async event on mlx5_0: port active on port 1",
     UCX + "src/uct/ib/base/ib_device.c:479 (IBV_EVENT_PORT_ACTIVE)"),
    (UCX_AT + "       parser.c:2326 UCX  WARN  unused environment variable: UCX_MEM_MMAP_HOOK_MODE (maybe: "
     "UCX_MEM_MMAP_HOOK_MODE?)", UCX + "src/ucs/config/parser.c:2326"),
    (K + "nvidia-nvswitch: Probing device 0000:05:00.0, Vendor Id = 0x10de, Device Id = 0x22a3, Class = 0x68000 ",
     NVSW + "kernel-open/nvidia/linux_nvswitch.c:1276"),
    (K + "Lustre: " + OSC + ": Connection restored to 10.1.1.1@o2ib (at 10.1.1.1@o2ib)",
     LUSTRE + "lustre/ptlrpc/import.c:1641"),
    (K + "nfs: server fs01 OK", LINUX + "fs/nfs (the server answers again)"),
    # A USB stick pulled or a disk hot-removed: the commands still queued to it end with DID_NO_CONNECT.
    (K + "usb 1-1: USB disconnect, device number 5", LINUX + "drivers/usb/core/hub.c usb_disconnect"),
    (K + "sd 6:0:0:0: [sdc] tag#0 FAILED Result: hostbyte=DID_NO_CONNECT driverbyte=DRIVER_OK cmd_age=0s",
     LINUX + "drivers/scsi/scsi_lib.c scsi_dispatch_cmd (SDEV_DEL: a device being removed)"),
    # IPoIB joining a group the subnet manager has none for (an IPv6 one here): the port and its broadcast group work.
    (K + "ib0: multicast join failed for ff12:601b:ffff:0000:0000:0000:0000:0001, status -22",
     LINUX + "ipoib/ipoib_multicast.c ipoib_mcast_join_complete (not the broadcast group, ipoib_main.c "
     "ipv4_bcast_addr)"),
    (K + "ib0: sendonly multicast join failed for ff12:601b:ffff:0000:0000:0001:ff00:0002, status -22",
     LINUX + "ipoib/ipoib_multicast.c ipoib_mcast_join_complete"),
    (K + "EXT4-fs (nvme0n1p1): mounted filesystem with ordered data mode. Quota mode: none.",
     LINUX + "fs/ext4/super.c ext4_fill_super"),
    (K + "XFS (dm-0): Ending clean mount", LINUX + "fs/xfs/xfs_log.c"),
    ("Saving model checkpoint to /ckpt/checkpoint-800", "transformers trainer.py _save (logger.info)"),
]
# A real error after a benign line in the same file: it, not the benign line, is the root.
AFTER_BENIGN = HEALTH_FATAL

# A disk removed on purpose - hot-removed, deleted through sysfs, a USB stick pulled - is put in SDEV_DEL, and the
# I/O still queued to it is rejected as to a "dead device" (scsi_lib.c scsi_device_state_check). With the same
# device's removal in the same kernel log, the rejections are its consequence: no root. The device is named by its
# host:channel:target:lun ("scsi" once sd has let go of it), by its disk through a line naming both, or by the USB
# port its usb-storage host hangs off.
DEAD = "rejecting I/O to dead device"
HOT_REMOVALS = [
    ([K + "sd 13:0:0:1: [sdd] Synchronizing SCSI cache", K + "scsi 13:0:0:1: " + DEAD, K + "scsi 13:0:0:1: " + DEAD],
     LINUX + "drivers/scsi/sd.c sd_remove -> sd_shutdown ('Synchronizing SCSI cache'), then scsi_lib.c's SDEV_DEL "
     "rejection (the wording of a removal test's log in a stable-kernel patch)"),
    ([K + "sd 6:0:0:0: [sdc] Synchronizing SCSI cache",
      K + "sd 6:0:0:0: [sdc] Synchronize Cache(10) failed: Result: hostbyte=DID_NO_CONNECT driverbyte=DRIVER_OK",
      K + "sd 6:0:0:0: " + DEAD],
     LINUX + "drivers/scsi/sd.c sd_sync_cache (sd_print_result 'Synchronize Cache(10) failed' on a disk already gone)"),
    ([K + "sd 6:0:0:0: [sdc] Synchronizing SCSI cache", K + "sd 6:0:0:0: [sdc] Stopping disk",
      K + "scsi 6:0:0:0: " + DEAD],
     LINUX + "drivers/scsi/sd.c sd_shutdown (manage_start_stop: 'Stopping disk')"),
    ([K + "sd 6:0:0:0: [sdc] tag#0 FAILED Result: hostbyte=DID_NO_CONNECT driverbyte=DRIVER_OK cmd_age=0s",
      K + "sd 6:0:0:0: " + DEAD],
     LINUX + "drivers/scsi/scsi_lib.c (a command of the device in SDEV_DEL ended with DID_NO_CONNECT)"),
    ([K + "sd 6:0:0:0: [sdc] Attached SCSI removable disk", K + "sdc: detected capacity change from 62521344 to 0",
      K + "scsi 6:0:0:0: " + DEAD],
     LINUX + "block/genhd.c set_capacity_and_notify ('%s: detected capacity change from %lld to %lld'; the disk "
     "named by sd's attach line)"),
    ([K + "usb-storage 1-1:1.0: USB Mass Storage device detected", K + "scsi host6: usb-storage 1-1:1.0",
      K + "usb 1-1: USB disconnect, device number 5", K + "scsi 6:0:0:0: " + DEAD],
     LINUX + "drivers/usb/core/hub.c usb_disconnect; drivers/scsi/hosts.c scsi_add_host ('scsi host%d: %s', "
     "usb-storage's host info names its interface)"),
    ([K + "scsi host7: usb-storage 3-1.1:1.0", K + "usb 3-1: USB disconnect, device number 2",
      K + "usb 3-1.1: USB disconnect, device number 3", K + "sd 7:0:0:0: " + DEAD],
     LINUX + "drivers/usb/core/hub.c usb_disconnect (a hub unplugged: its children go with it)"),
    ([K + "sd 6:0:0:0: [sdc] Attached SCSI removable disk", K + "sd 6:0:0:0: [sdc] Synchronizing SCSI cache",
      K + "sd 6:0:0:0: " + DEAD, K + "sd 6:0:0:0: [sdc] Attached SCSI removable disk"],
     LINUX + "drivers/scsi/sd.c sd_probe_async (the stick plugged in again after the rejections: the kernel gives "
     "the address out again)"),
]
# A dead device with no removal of its own in view, or a device offlined by error recovery: still the root.
DEAD_DEVICE_ROOTS = [
    ([K + "sd 6:0:0:1: [sdb] Synchronizing SCSI cache", K + "sd 7:0:0:0: " + DEAD],
     "another device's removal"),
    ([K + "scsi host6: usb-storage 1-1:1.0", K + "usb 1-10: USB disconnect, device number 4",
      K + "sd 6:0:0:0: " + DEAD], "another USB port unplugged (1-10, not 1-1)"),
    ([K + "sd 6:0:0:0: [sdc] Attached SCSI removable disk", K + "sdd: detected capacity change from 62521344 to 0",
      K + "sd 6:0:0:0: " + DEAD], "another disk's capacity gone"),
    ([K + "sd 6:0:0:1: [sdb] Synchronizing SCSI cache", K + "sd 6:0:0:1: rejecting I/O to offline device"],
     "offline (error recovery gave up on the device), not dead: not a removal's"),
    # the kernel gives disk names, addresses and host numbers out again: a removal is of the device that held them
    ([K + "sd 6:0:0:0: [sdc] Attached SCSI removable disk", K + "sdc: detected capacity change from 62521344 to 0",
      K + "sd 7:0:0:0: [sdc] Attached SCSI removable disk", K + "sd 7:0:0:0: " + DEAD],
     "the disk name sdc given to another device after the first one's capacity went to 0"),
    ([K + "scsi host6: usb-storage 1-1:1.0", K + "usb 1-1: USB disconnect, device number 5",
      K + "scsi host7: usb-storage 1-1:1.0", K + "sd 7:0:0:0: " + DEAD],
     "another device plugged into port 1-1 after the first one was unplugged from it"),
    ([K + "scsi host6: usb-storage 1-1:1.0", K + "usb 1-1: USB disconnect, device number 5",
      K + "scsi host6: usb-storage 2-3:1.0", K + "sd 6:0:0:0: " + DEAD],
     "host number 6 given to another USB device after the first one was unplugged"),
    ([K + "sd 6:0:0:0: [sdc] Synchronizing SCSI cache", K + "sd 6:0:0:0: [sdd] Attached SCSI removable disk",
      K + "sd 6:0:0:0: " + DEAD],
     "another device attached at 6:0:0:0 after the first one's removal"),
]


@pytest.mark.parametrize("entry", ROOTS, ids=lambda e: e.signature + ":" + e.message[16:56])
def test_a_fabric_or_storage_failure_report_is_a_root(tmp_path: Path, entry: Root) -> None:
    assert_root_alone_and_beside(tmp_path, entry.message, entry.source, entry.signature, entry.filename, entry.relay,
                                 "rank_1.log")


@pytest.mark.parametrize("entry", CONSEQUENCES, ids=lambda e: e.message[16:64])
def test_a_fabric_or_storage_consequence_gives_way_to_its_cause_and_alone_is_named(tmp_path: Path,
                                                                                   entry: Secondary) -> None:
    filename = "rank_0.log" if "UCX" in entry.message or not entry.message.startswith(K) else "dmesg.log"
    assert_consequence_after_its_cause_and_named_alone(tmp_path, entry, filename)


@pytest.mark.parametrize(("message", "source"), BENIGN, ids=lambda v: str(v)[16:64])
def test_a_benign_line_of_the_same_producers_is_never_a_root(tmp_path: Path, message: str, source: str) -> None:
    filename = "rank_0.log" if "UCX" in message or not message.startswith(K) else "dmesg.log"
    assert_benign_never_root(tmp_path, message, source, filename, AFTER_BENIGN)


@pytest.mark.parametrize(("lines", "source"), HOT_REMOVALS, ids=lambda v: str(v)[18:70])
def test_io_rejected_by_a_disk_whose_removal_the_kernel_log_records_is_no_root(tmp_path: Path, lines: list[str],
                                                                              source: str) -> None:
    log = tmp_path / "dmesg.log"
    log.write_text("\n".join(lines) + "\n")
    result = triage(tmp_path)
    assert result.root is None or result.root_basis != "signature", (source, result.summary)
    log.write_text("\n".join([*lines, AFTER_BENIGN]) + "\n")
    result = triage(tmp_path)
    assert result.root is not None and result.root.lineno == len(lines) + 1, (source, result.summary)


@pytest.mark.parametrize(("lines", "why"), DEAD_DEVICE_ROOTS, ids=lambda v: str(v)[18:70])
def test_io_rejected_by_a_dead_or_offline_disk_with_no_removal_of_its_own_stays_the_root(tmp_path: Path,
                                                                                          lines: list[str],
                                                                                          why: str) -> None:
    (tmp_path / "dmesg.log").write_text("\n".join(lines) + "\n")
    result = triage(tmp_path)
    assert result.root is not None and result.root_basis == "signature", (why, result.summary)
    assert (result.root.signature, result.root.lineno) == ("kernel.scsi_device_offline", len(lines)), (
        why, result.summary)
