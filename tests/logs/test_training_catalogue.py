"""Training-process coverage of the signature library, from the producers' own source code: NCCL and PyTorch c10d.

Each row is a message as its producer prints it (NCCL's WARN format strings and ncclGetErrorString, PyTorch's
ProcessGroupNCCL, ProcessGroupGloo / gloo, TCPStore and torchelastic), with a realistic prefix, where it comes from
(repository path and function, NVIDIA/nccl v2.19-v2.28 and pytorch/pytorch v2.1-v2.5 with torch 2.13's own
strings; gloo, aws-ofi-nccl, UCX, DeepSpeed, Megatron-LM, JAX / XLA's coordination service, Ray and Open MPI's
launchers) and what triage must make of it:

* ``Root``: alone in a rank log it is named by a root signature, and beside a line of the layer below it in the
  ranking - hardware / network > NCCL transport error > NCCL's generic error summary > c10d watchdog > launcher
  relay - printed by another rank with no wall-clock time, it is still the root;
* ``Secondary``: a documented consequence - printed before its cause in the same file, the cause is still named.

The rows are the survey of what the library covers; a row that fails is a message triage misses or misranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.logs.catalogue import Secondary, assert_cause_named_after_its_consequence, assert_root_alone_and_beside
from vigil.logs.triage import triage

HOST = "n1:4242:4300 [0]"
PG = "[rank3]:[E1206 04:10:00.000000000 ProcessGroupNCCL.cpp:1595] [PG ID 0 PG GUID 0(default_pg) Rank 3]"
# What a rank prints one layer down the ranking, in another rank's file.
GENERIC = ("torch.distributed.DistBackendError: NCCL error in: "
           "../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO "
           "for details), NCCL version 2.19.3")
WATCHDOG = (f"{PG} Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1, "
            "NumelOut=1, Timeout(ms)=600000) ran for 600023 milliseconds before timing out.")
LAUNCHER = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: "
IB_ROOT = (f"{HOST} transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer 10.0.0.2<4789> with "
           "status=IBV_WC_RETRY_EXC_ERR(12) opcode=0 len=0 vendor_err=129 localGid ::ffff:10.0.0.1 hca mlx5_0")
CUDA_ROOT = f"{HOST} enqueue.cc:1556 NCCL WARN Cuda failure 'an illegal memory access was encountered'"
# What every other JAX process prints once one task is gone (JAX's fault-tolerance docs).
JAX_PEER_DIED = ("F0926 17:26:32.075587  157988 client.h:77] Terminating process because the JAX distributed service "
                 "detected fatal errors. This most likely indicates that another task died; see the other task logs "
                 "for more details. Disable Python buffering, i.e. `python -u`, to be sure to see all the previous "
                 "output. absl::Status: UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats):")



@dataclass(frozen=True)
class Root:
    message: str
    source: str  # where the wording comes from
    signature: str  # the signature that must name it
    against: str  # a line one layer down the ranking, printed by another rank


ROOTS = [
    # --- the network and the host, as NCCL's transports report them ---
    Root(IB_ROOT, "nccl src/transport/net_ib.cc ncclIbTest (wc status)", "nccl.ib_completion_error", GENERIC),
    Root(f"{HOST} transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer 10.0.0.2<4789> with error 12, "
         "opcode 0, len 0, vendor err 129 (Recv)", "nccl v2.19.3-1 src/transport/net_ib.cc:1333 ncclIbTest",
         "nccl.ib_completion_error", GENERIC),
    Root(f"{HOST} transport/net_ib.cc:88 NCCL WARN NET/IB : Got async event : port error",
         "nccl v2.19.3-1 src/transport/net_ib.cc:95 ncclIbAsyncThreadMain", "nccl.ib_async_event", GENERIC),
    Root(f"{HOST} transport/net_ib.cc:120 NCCL WARN NET/IB : mlx5_0:1 async fatal event on QP (0x5f3a00): "
         "local work queue catastrophic error", "nccl v2.23.4-1 src/transport/net_ib.cc:152",
         "nccl.ib_async_event", GENERIC),
    Root(f"{HOST} misc/ibvwrap.cc:190 NCCL WARN Call to ibv_modify_qp failed with error Connection timed out",
         "nccl v2.23.4-1 src/misc/ibvwrap.cc:34 IBV_INT_CHECK_RET_ERRNO", "nccl.ib_call_failed", GENERIC),
    Root(f"{HOST} misc/ibvwrap.cc:128 NCCL WARN Call to ibv_reg_mr_iova2 failed with error Bad address",
         "nccl src/misc/ibvwrap.cc wrap_ibv_reg_mr_iova2", "nccl.ib_call_failed", GENERIC),
    Root(f"{HOST} misc/ibvwrap.cc:66 NCCL WARN Call to ibv_create_cq failed with error Cannot allocate memory",
         "nccl src/misc/ibvwrap.cc wrap_ibv_create_cq", "nccl.ib_call_failed", GENERIC),
    Root(f"{HOST} misc/ibvwrap.cc:250 NCCL WARN Call to ibv_open_device failed",
         "nccl v2.23.4-1 src/misc/ibvwrap.cc:43 IBV_PTR_CHECK", "nccl.ib_call_failed", GENERIC),
    Root(f"{HOST} misc/shmutils.cc:113 NCCL WARN Error while creating shared memory segment /dev/shm/nccl-UbzKZ9 "
         "(size 9637888)", "nccl v2.19.3-1 src/misc/shmutils.cc:113 ncclShmOpen", "nccl.shm_error", GENERIC),
    Root(f"{HOST} misc/shmutils.cc:72 NCCL WARN Error: failed to extend /dev/shm/nccl-UbzKZ9 to 9637892 bytes",
         "nccl v2.19.3-1 src/misc/shmutils.cc:72 ncclShmOpen", "nccl.shm_error", GENERIC),
    Root(f"{HOST} misc/shmutils.cc:60 NCCL WARN Call to posix_fallocate failed : No space left on device",
         "nccl v2.19.3-1 src/include/checks.h:49 SYSCHECKVAL", "nccl.shm_error", GENERIC),
    Root("Error while creating shared memory segment /dev/shm/nccl-cjY8K5 (size 10617216), error: No space left on "
         "device (28)", "nccl src/misc/shmutils.cc ncclShmOpen, as 'Last error' under PyTorch's report",
         "nccl.shm_error", GENERIC),
    Root(f"{HOST} bootstrap.cc:45 NCCL WARN Bootstrap : no socket interface found",
         "nccl 5067397 src/bootstrap.cc:126 bootstrapNetInit", "nccl.no_interface", GENERIC),
    Root(f"{HOST} transport/net_socket.cc:46 NCCL WARN NET/Socket : no interface found",
         "nccl 5067397 src/transport/net_socket.cc:61 ncclNetSocketInit", "nccl.no_interface", GENERIC),
    Root(f"{HOST} init.cc:680 NCCL WARN Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1a000",
         "nccl v2.19.3-1 src/init.cc:824 initTransportsRank", "nccl.duplicate_gpu", GENERIC),
    Root(f"{HOST} misc/socket.cc:50 NCCL WARN Message truncated : received 1048 bytes instead of 1024",
         "nccl 5067397 src/bootstrap.cc:224 (mixed NCCL versions)", "nccl.message_truncated", GENERIC),
    Root(f"{HOST} transport/net_socket.cc:540 NCCL WARN NET/Socket : peer 10.0.0.2<4242> message truncated : "
         "receiving 1048576 bytes instead of 65536. If you believe your socket network is in healthy state, there "
         "may be a mismatch in collective sizes or environment settings (e.g. NCCL_PROTO, NCCL_ALGO) between ranks",
         "nccl v2.19.3-1 src/transport/net_socket.cc:485 ncclNetSocketTest", "nccl.message_truncated", GENERIC),
    Root(f"{HOST} include/socket.h:403 NCCL WARN Connect to 10.148.3.247<56821> failed : No route to host",
         "nccl src/misc/socket.cc socketStartConnect / include/socket.h", "nccl.socket_connect_failed", GENERIC),
    Root(f"{HOST} include/socket.h:361 NCCL WARN Call to connect failed : Connection timed out",
         "nccl v2.3.7-1 src/include/socket.h connectAddress, SYSCHECK (src/include/core.h: "
         "\"Call to \" name \" failed : %s\")", "nccl.socket_connect_failed", GENERIC),
    Root(f"{HOST} misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 10.0.0.2<35133> failed : Network is "
         "unreachable", "nccl v2.19.3-1 src/misc/socket.cc:484 socketStartConnect", "nccl.socket_connect_failed",
         GENERIC),
    Root(f"{HOST} misc/socket.cc:527 NCCL WARN socketPollConnect: exceeded timeouts (20)",
         "nccl v2.23.4-1 src/misc/socket.cc:527 (and socketStartConnect, :477)", "nccl.socket_connect_failed", GENERIC),
    Root(f"{HOST} misc/socket.cc:535 NCCL WARN socketPollConnect: Connect to 10.0.0.2<35133> returned 113(No route to "
         "host) errno 115(Operation now in progress)", "nccl v2.23.4-1 src/misc/socket.cc:535",
         "nccl.socket_connect_failed", GENERIC),
    Root(f"{HOST} misc/socket.cc:238 NCCL WARN Net : No interface found in the same subnet as remote address "
         "10.0.0.2<29500>", "nccl v2.19.3-1 src/misc/socket.cc:238 ncclFindInterfaceMatchSubnet", "nccl.no_interface",
         GENERIC),
    Root(f"{HOST} transport/net_ib.cc:140 NCCL WARN NET/IB : mlx5_0:1 async fatal event: port error",
         "nccl v2.23.4-1 src/transport/net_ib.cc:140 ncclIbAsyncThreadMain", "nccl.ib_async_event", GENERIC),
    Root(f"{HOST} transport/net_ib.cc:2121 NCCL WARN NET/IB: Got completion from peer 10.0.0.2<4789> with status=12 "
         "opcode=0 len=0 vendor err 129 (Recv) localGid ::ffff:10.0.0.1 remoteGids ::ffff:10.0.0.2 hca mlx5_0",
         "nccl v2.23.4-1 src/transport/net_ib.cc:2121 ncclIbTest", "nccl.ib_completion_error", GENERIC),
    Root(f"{HOST} transport/net_ib/gin.cc:749 NCCL WARN NET/IB/GIN: Got completion from peer 10.0.0.2<4789> with "
         "status=12 opcode=0 len=0 vendor err 129 (Recv) hca mlx5_0", "nccl 5067397 src/transport/net_ib/gin.cc:749",
         "nccl.ib_completion_error", GENERIC),
    Root(f"{HOST} misc/shmutils.cc:128 NCCL WARN Error while creating shared memory segment /dev/shm/nccl-UbzKZ9 "
         "(size 9637888), error: No space left on device (28)", "nccl v2.23.4-1 src/misc/shmutils.cc:128 ncclShmOpen",
         "nccl.shm_error", GENERIC),
    Root(f"{HOST} misc/shmutils.cc:60 NCCL WARN Call to posix_fallocate failed: No space left on device",
         "nccl v2.23.4-1 src/include/checks.h:63 SYSCHECKGOTO", "nccl.shm_error", GENERIC),
    # --- CUDA underneath NCCL ---
    Root(CUDA_ROOT, "nccl 5067397 src/include/checks.h:18 CUDACHECK", "cuda.illegal_address", GENERIC),
    Root(f"{HOST} init.cc:1522 NCCL WARN Cuda failure 2 'out of memory'", "nccl src/include/checks.h CUDACHECK "
         "(2.19+ with the error number)", "cuda.other", GENERIC),
    Root(f"{HOST} include/alloc.h:125 NCCL WARN Failed to CUDA calloc 1048576 bytes",
         "nccl v2.19.3-1 src/include/alloc.h:185 ncclCudaCalloc", "nccl.cuda_alloc_failed", GENERIC),
    Root(f"{HOST} include/alloc.h:159 NCCL WARN Cuda failure 'out of memory'", "nccl src/include/alloc.h",
         "cuda.other", GENERIC),
    # --- NCCL's generic summaries (ncclGetErrorString) and PyTorch's wrapping of them ---
    Root(GENERIC, "nccl src/misc/utils.cc ncclGetErrorString via torch/csrc/distributed/c10d/NCCLUtils.hpp "
         "C10D_NCCL_CHECK",
         "nccl.system_error", WATCHDOG),
    Root("ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error. ",
         "torch/csrc/distributed/c10d/NCCLUtils.cpp getNcclErrorDetailStr", "nccl.system_error", WATCHDOG),
    Root("RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, internal error - please "
         "report this issue to the NCCL developers, NCCL version 2.18.1", "nccl ncclGetErrorString (ncclInternalError)",
         "nccl.internal_error", WATCHDOG),
    Root("ncclInternalError: Internal check failed.", "torch/csrc/distributed/c10d/NCCLUtils.cpp "
         "getNcclErrorDetailStr", "nccl.internal_error", WATCHDOG),
    Root("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1691, "
         "invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.19.3",
         "nccl ncclGetErrorString (ncclInvalidUsage)", "nccl.internal_error", WATCHDOG),
    Root("ncclInvalidUsage: This usually reflects invalid usage of NCCL library.",
         "torch/csrc/distributed/c10d/NCCLUtils.cpp getNcclErrorDetailStr", "nccl.internal_error", WATCHDOG),
    Root("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1691, "
         "invalid argument (run with NCCL_DEBUG=WARN for details), NCCL version 2.19.3",
         "nccl 5067397 src/init.cc:3426 ncclGetErrorString (ncclInvalidArgument)", "nccl.internal_error", WATCHDOG),
    Root("ncclInvalidArgument: Invalid value for an argument.", "torch/csrc/distributed/c10d/NCCLUtils.cpp "
         "getNcclErrorDetailStr", "nccl.internal_error", WATCHDOG),
    Root("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, "
         "unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5",
         "nccl ncclGetErrorString (ncclUnhandledCudaError)", "cuda.other", WATCHDOG),
    Root("ncclUnhandledCudaError: Call to CUDA function failed.", "torch/csrc/distributed/c10d/NCCLUtils.cpp "
         "getNcclErrorDetailStr", "cuda.other", WATCHDOG),
    # --- c10d's store and rendezvous failures that start a job's failure ---
    Root("torch.distributed.DistNetworkError: The server socket has failed to listen on any local network address. "
         "The server socket has failed to bind to [::]:29500 (errno: 98 - Address already in use). The server "
         "socket has failed to bind to 0.0.0.0:29500 (errno: 98 - Address already in use).",
         "torch/csrc/distributed/c10d/socket.cpp SocketListenOp", "c10d.store_bind_failed", LAUNCHER),
    Root("[W1206 04:10:00.000000000 socket.cpp:697] [c10d] The server socket has failed to bind to [::]:29500 "
         "(errno: 98 - Address already in use).", "torch/csrc/distributed/c10d/socket.cpp SocketListenOp::tryListen",
         "c10d.store_bind_failed", LAUNCHER),
    Root("RuntimeError: The server socket has failed to listen on any local network address. The server socket has "
         "failed to listen on [::]:29500 (errno: 98 - Address already in use). The server socket has failed to bind to "
         "?UNKNOWN? (errno: 98 - Address already in use).", "torch/csrc/distributed/c10d/socket.cpp SocketListenOp "
         "(torch 2.0-2.1 wording, as printed in public issue threads)", "c10d.store_bind_failed", LAUNCHER),
    Root("[E socket.cpp:462] [c10d] The server socket has failed to listen on [::]:29500 (errno: 98 - Address already "
         "in use).", "torch/csrc/distributed/c10d/socket.cpp SocketListenOp::tryListen (recordError)",
         "c10d.store_bind_failed", LAUNCHER),
    Root("torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 1/2 clients joined.",
         "torch/distributed/distributed_c10d.py / c10d TCPStore server wait", "python.exception", LAUNCHER),
    Root("[E1206 04:10:00.000000000 socket.cpp:1011] [c10d] The client socket has timed out after 900s while trying "
         "to connect to (master, 29500).", "torch/csrc/distributed/c10d/socket.cpp SocketConnectOp",
         "c10d.store_connect_timeout", LAUNCHER),
    # --- NCCL 2.24-2.28: the IB transport's async events and completions, sockets, versions, NVLS, P2P ---
    Root(f"{HOST} transport/net_ib.cc:253 NCCL WARN NET/IB : mlx5_0:1 Got non-fatal async event: port error(10)",
         "nccl v2.28.9-1 src/transport/net_ib.cc:253 ncclIbAsyncThreadMain (IBV_EVENT_PORT_ERR)", "nccl.ib_async_event",
         GENERIC),
    Root(f"{HOST} transport/net_ib.cc:173 NCCL WARN NET/IB : mlx5_0:1 Got async error event: port error",
         "nccl v2.24.3-1 src/transport/net_ib.cc:173 ncclIbAsyncThreadMain (IBV_EVENT_PORT_ERR)", "nccl.ib_async_event",
         GENERIC),
    Root(f"{HOST} transport/net_ib.cc:219 NCCL WARN NET/IB : mlx5_0:1 async fatal event: local catastrophic error",
         "nccl v2.28.9-1 src/transport/net_ib.cc:219 ncclIbAsyncThreadMain (IBV_EVENT_DEVICE_FATAL)",
         "nccl.ib_async_event", GENERIC),
    Root(f"{HOST} transport/net_ib.cc:224 NCCL WARN NET/IB : mlx5_0:1 async fatal event on CQ (0x55d0c0a3b2f0): CQ "
         "error",
         "nccl v2.28.9-1 src/transport/net_ib.cc:224 ncclIbAsyncThreadMain (IBV_EVENT_CQ_ERR)", "nccl.ib_async_event",
         GENERIC),
    Root(f"{HOST} transport/net_ib.cc:2543 NCCL WARN NET/IB: Got completion from peer 10.0.0.2<4789> with "
         "status=IBV_WC_RETRY_EXC_ERR(12) opcode=IBV_WC_RDMA_WRITE(1) reqSize=1048576 vendor_err=129 req_type=Send "
         "localGid ::ffff:10.0.0.1 remoteGids ::ffff:10.0.0.2 hca mlx5_0",
         "nccl v2.28.9-1 src/transport/net_ib.cc:2543 ncclIbTest", "nccl.ib_completion_error", GENERIC),
    Root(f"{HOST} misc/socket.cc:596 NCCL WARN socketStartConnect: connect to 10.0.0.2<35133> failed : No route to "
         "host",
         "nccl v2.28.9-1 src/misc/socket.cc:596 socketConnectCheck", "nccl.socket_connect_failed", GENERIC),
    Root(f"{HOST} misc/socket.cc:582 NCCL WARN socketStartConnect: connect to 10.0.0.2<35133> returned No route to "
         "host, exceeded error retry count after 35 attempts",
         "nccl v2.28.9-1 src/misc/socket.cc:582 socketConnectCheck", "nccl.socket_connect_failed", GENERIC),
    Root(f"{HOST} misc/socket.cc:543 NCCL WARN socketStartConnect: connect returned Connection timed out, exceeded "
         "error retry count (35)", "nccl v2.24.3-1 src/misc/socket.cc:543 socketConnectCheck",
         "nccl.socket_connect_failed", GENERIC),
    Root(f"{HOST} init.cc:896 NCCL WARN Mismatched NCCL version detected : rank 1 version 22809 rank 0 version 22305",
         "nccl v2.28.9-1 src/init.cc:896 initTransportsRank", "nccl.version_mismatch", GENERIC),
    Root(f"{HOST} ras/ras.cc:428 NCCL WARN NCCL version mismatch with remote peer 10.0.0.2<28028> (local: 22809, "
         "remote 22305)", "nccl v2.28.9-1 src/ras/ras.cc:428 (RAS)", "nccl.version_mismatch", GENERIC),
    Root(f"{HOST} transport/nvls.cc:285 NCCL WARN Failed to bind NVLink SHARP (NVLS) Multicast memory of size "
         "1073741824 : CUDA error 801 'operation not supported'.",
         "nccl v2.28.9-1 src/transport/nvls.cc:285 nvlsGroupBindMem", "nccl.nvls_bind_failed", GENERIC),
    Root(f"{HOST} transport/p2p.cc:333 NCCL WARN failed to peer with device 1(=1b000): 217 peer access is not "
         "supported between these two devices", "nccl v2.28.9-1 src/transport/p2p.cc:333 p2pMap", "nccl.p2p_failed",
         GENERIC),
    Root(f"{HOST} transport/p2p.cc:236 NCCL WARN cudaIpcGetMemHandle failed : invalid argument",
         "nccl v2.28.9-1 src/transport/p2p.cc:236 ncclP2pAllocateShareableBuffer", "nccl.p2p_failed", GENERIC),
    Root(f"{HOST} enqueue.cc:1859 NCCL WARN Error : no algorithm/protocol available for function AllReduce with "
         "datatype ncclBfloat16. NCCL_ALGO was set to NVLS.", "nccl v2.28.9-1 src/enqueue.cc:1859 topoGetAlgoInfo",
         "nccl.no_algorithm", GENERIC),
    Root(f"{HOST} rdma_req_handle_error_entry:1580 NCCL WARN NET/OFI Request 0x7f2a4c0123a0 completed with error. RC: "
         "103. Error: 4126 (Unknown error). Completed length: 0, Request: {dev: 0, size: 1048576, state: CREATED, "
         "type: SEND}",
         "aws-ofi-nccl src/nccl_ofi_rdma.cpp rdma_req_handle_error_entry (NCCL_OFI_WARN prefixes NET/OFI and the "
         "function)", "nccl.ofi_completion_error", GENERIC),
    Root("[1733467800.123456] [n1:4242:0]    ib_mlx5_log.c:179  UCX  ERROR Transport retry count exceeded on "
         "mlx5_0:1/IB (synd 0x15 vend 0x81 hw_synd 0/0)",
         "UCX src/uct/ib/mlx5/ib_mlx5_log.c uct_ib_mlx5_completion_with_err", "ucx.ib_completion_error", GENERIC),
    # --- gloo's own failures that start a job's failure ---
    Root("RuntimeError: [enforce fail at ../third_party/gloo/gloo/transport/tcp/device.cc:84] ifa != nullptr. Unable "
         "to find address for: eth9", "gloo 70dc360 gloo/transport/tcp/device.cc:84 lookupAddrForIface (GLOO_ENFORCE, "
         "gloo/common/logging.cc:51)", "python.exception", LAUNCHER),
    Root("RuntimeError: [enforce fail at ../third_party/gloo/gloo/transport/tcp/device.cc:128] bind_rv == 0. Unable to "
         "find address for n1; bind(2) for 10.0.0.1 failed with: Cannot assign requested address",
         "gloo 70dc360 gloo/transport/tcp/device.cc:128 lookupAddrForHostname", "python.exception", LAUNCHER),
    # --- PyTorch 2.x: CUDA, the caching allocator, DTensor ---
    Root("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.15 GiB. GPU 0 has a total capacity of 39.56 "
         "GiB of which 6.80 GiB is free. Including non-PyTorch memory, this process has 36.61 GiB memory in use. Of "
         "the allocated memory 31.66 GiB is allocated by PyTorch, and 4.11 GiB is reserved by PyTorch but "
         "unallocated. If reserved but unallocated memory is large try setting "
         "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.",
         "c10/cuda/CUDACachingAllocator.cpp (2.4+ wording, as docs/source/notes/cuda.rst quotes it)",
         "cuda.oom", WATCHDOG),
    Root("torch.AcceleratorError: CUDA error: an illegal memory access was encountered",
         "c10/cuda/CUDAException.cpp c10_cuda_check_implementation (AcceleratorError since 2.8)",
         "cuda.illegal_address", WATCHDOG),
    Root("RuntimeError: CUDA error: device-side assert triggered", "c10/cuda/CUDAException.cpp", "cuda.device_assert",
         WATCHDOG),
    Root("RuntimeError: aten.add.Tensor: got mixed torch.Tensor and DTensor, need to convert all torch.Tensor to "
         "DTensor before calling distributed operators! Please see "
         "https://docs.pytorch.org/docs/main/distributed.tensor.html#mixed-tensor-and-dtensor-operations for more "
         "details.",
         "torch 2.13.0 torch/distributed/tensor/_dispatch.py:818", "python.exception", LAUNCHER),
    Root("RuntimeError: Detected mismatch between collectives on ranks. Rank 1 is running collective: "
         "CollectiveFingerPrint(SequenceNumber=12, OpType=ALLREDUCE, TensorShape=[1024], TensorDtypes=Float, "
         "TensorDeviceTypes=TensorOptions(dtype=float, device=cuda)), but Rank 0 is running collective: "
         "CollectiveFingerPrint(SequenceNumber=12, OpType=BROADCAST). Collectives differ in the following aspects: "
         "\tOp type: ALLREDUCEvs BROADCAST", "torch/csrc/distributed/c10d/ProcessGroupWrapper.cpp (libtorch_cpu 2.13 "
         "string)", "torch.collective_mismatch", WATCHDOG),
    Root("AssertionError: Expects the parameter to already be moved to device cuda:0 but got cpu",
         "torch 2.13.0 torch/distributed/fsdp/_fully_shard/_fsdp_param.py:248 FSDPParam._init_sharded_param (FSDP2)",
         "python.exception", LAUNCHER),
    # --- DeepSpeed and Megatron-LM ---
    Root("Exception: Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.",
         "DeepSpeed edaa722 deepspeed/runtime/fp16/loss_scaler.py:269 DynamicLossScaler.update_scale",
         "train.loss_scale_at_minimum", LAUNCHER),
    Root("RuntimeError: Rank 3, node n1, device 3, iteration 1201: Unexpected result nan (message='found NaN in local "
         "grad norm for bucket #0 in backward pass before data-parallel communication collective')",
         "Megatron-LM d98e8a6 megatron/core/rerun_state_machine.py:528 validate_result, message from "
         "megatron/core/distributed/param_and_grad_buffer.py:358", "train.nan_grad_norm", LAUNCHER),
    Root("Unexpected result nan on rank 3 at iteration #1201 invocation #1 (message='found NaN in local grad norm for "
         "bucket #0 in backward pass before data-parallel communication collective')",
         "Megatron-LM d98e8a6 megatron/core/rerun_state_machine.py:605 (logger.error, rerun enabled)",
         "train.nan_grad_norm", LAUNCHER),
    # --- JAX / XLA ---
    Root("jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17179869184 "
         "bytes.", "xla/pjrt (XlaRuntimeError with an absl status)", "python.exception", JAX_PEER_DIED),
    Root("jaxlib.xla_extension.XlaRuntimeError: INTERNAL: external/xla/xla/service/gpu/nccl_utils.cc:297: NCCL "
         "operation ncclCommInitRank(&comm, nranks, id, rank) failed: unhandled cuda error",
         "xla/service/gpu (XlaRuntimeError INTERNAL carrying NCCL's result)", "cuda.other", JAX_PEER_DIED),
    # --- NCCL's failed system and verbs calls (v2.28.9-1 src/include/checks.h SYSCHECK, src/include/ibvwrap.h) ---
    Root(f"{HOST} misc/socket.cc:428 NCCL WARN Call to bind failed: Address already in use",
         "nccl v2.28.9-1 src/include/checks.h:45 SYSCHECK (ncclSocketListen bind)", "nccl.syscall_failed", GENERIC),
    Root(f"{HOST} misc/socket.cc:802 NCCL WARN Call to socket failed: Too many open files",
         "nccl v2.28.9-1 src/include/checks.h:45 SYSCHECK (ncclSocketInit socket)", "nccl.syscall_failed", GENERIC),
    Root(f"{HOST} include/ibvwrap.h:62 NCCL WARN Call to ibv_poll_cq() returned -2",
         "nccl v2.28.9-1 src/include/ibvwrap.h:62 wrap_ibv_poll_cq", "nccl.ib_call_failed", GENERIC),
    Root(f"{HOST} misc/ibvwrap.cc:307 NCCL WARN Call to ibv_modify_qp failed with 110 Connection timed out, On "
         "ibv_modify_qp to RTS", "nccl v2.28.9-1 src/misc/ibvwrap.cc:307 wrap_ibv_modify_qp", "nccl.ib_call_failed",
         GENERIC),
    # --- the TCPStore client giving up (torch 2.4+ TCPStore.cpp, libtorch_cpu 2.13 string) ---
    Root("[E1206 04:10:00.000000000 TCPStore.cpp:300] TCP client failed to connect/validate to host master:29500 - "
         "timed out (try=3, timeout=600000ms): The client socket has timed out after 600000ms while trying to "
         "connect to (master, 29500).",
         "torch/csrc/distributed/c10d/TCPStore.cpp TCPClient::connect (libtorch_cpu 2.13 string)",
         "c10d.store_connect_timeout", LAUNCHER),
    # --- NVSHMEM and Open MPI underneath ---
    Root("/build/nvshmem/src/host/transport/transport.cpp:nvshmemi_transport_init:282: init failed for transport: "
         "IBGDA",
         "NVSHMEM 2d7d25f src/host/transport/transport.cpp:282 (NVSHMEMI_ERROR_PRINT, nvshmemx_error.h:57)",
         "nvshmem.transport_init_failed", LAUNCHER),
    Root("*** An error occurred in MPI_Allreduce",
         "Open MPI ompi/errhandler/errhandler_predefined.c (ERRORS_ARE_FATAL)",
         "mpi.errors_are_fatal", LAUNCHER),
    Root("ORTE has lost communication with a remote daemon.", "Open MPI 4 orte/mca/errmgr help-errmgr-base.txt",
         "mpi.daemon_lost", LAUNCHER),
    Root("An MPI communication peer process has unexpectedly disconnected.  This",
         "Open MPI opal/mca/btl/tcp help-mpi-btl-tcp.txt [peer hung up]", "mpi.peer_disconnected", LAUNCHER),
    Root("[n1:4242:0:4300] Caught signal 11 (Segmentation fault: address not mapped to object at address 0x8)",
         "UCX src/ucs/debug/debug.c ucs_debug_handle_error_signal", "process.caught_signal", LAUNCHER),
]

SECONDARIES = [
    # --- c10d's watchdog and abort reports: every healthy rank prints them ---
    Secondary(WATCHDOG, "torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp WorkNCCL::checkTimeout", IB_ROOT),
    Secondary(f"{PG} Exception (either an error or timeout) detected by watchdog at work: 7, last enqueued NCCL work: "
              "7, last completed NCCL work: 6.", "ProcessGroupNCCL.cpp watchdogHandler", IB_ROOT),
    Secondary(f"{PG} Timeout at NCCL work: 7, last enqueued NCCL work: 7, last completed NCCL work: 6.",
              "ProcessGroupNCCL.cpp watchdogHandler", CUDA_ROOT),
    Secondary(f"{PG} Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, "
              "subsequent GPU operations might run on corrupted/incomplete data.",
              "ProcessGroupNCCL.cpp WorkNCCL::handleException", IB_ROOT),
    Secondary(f"{PG} To avoid data inconsistency, we are taking the entire process down.",
              "ProcessGroupNCCL.cpp WorkNCCL::handleException", IB_ROOT),
    Secondary(f"{PG} Heartbeat monitor timed out! Process will be terminated after dumping debug info. "
              "workMetaList_.size()=1", "ProcessGroupNCCL.cpp HeartbeatMonitor::runLoop", IB_ROOT),
    Secondary(f"{PG} ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress in monitoring "
              "enqueued collectives.", "ProcessGroupNCCL.cpp heartbeatMonitor", CUDA_ROOT),
    Secondary(f"{PG} Received a dump signal due to a collective timeout from rank 1 and we will try our best to dump "
              "the debug info. Last enqueued NCCL work: 7, last completed NCCL work: 6.This is most likely caused by "
              "incorrect usages of collectives, e.g., wrong sizes used across ranks, the order of collectives is not "
              "same for all ranks or the scheduled collective, for some reason, didn't run. Additionally, this can be "
              "caused by GIL deadlock or other reasons such as network errors or bugs in the communications library "
              "(e.g. NCCL), etc.", "ProcessGroupNCCL.cpp heartbeatMonitor (2.4+)", IB_ROOT),
    Secondary(f"{PG} Future for ProcessGroup abort timed out after 600000 ms",
              "ProcessGroupNCCL.cpp abort / heartbeatMonitor", IB_ROOT),
    Secondary(f"{PG} Process group watchdog thread terminated with exception: NCCL error: remote process exited or "
              "there was a network error, NCCL version 2.21.5", "ProcessGroupNCCL.cpp ncclCommWatchdog", IB_ROOT),
    Secondary("ncclRemoteError: A call failed possibly due to a network error or a remote process exiting "
              "prematurely.", "torch/csrc/distributed/c10d/NCCLUtils.cpp getNcclErrorDetailStr", IB_ROOT),
    Secondary(f"{PG} NCCL communicator was aborted on rank 3.", "ProcessGroupNCCL.cpp WorkNCCL::checkAndSetException",
              CUDA_ROOT),
    # --- NCCL's own consequences: a peer or the proxy after the failure ---
    Secondary(f"{HOST} misc/socket.cc:49 NCCL WARN socketProgress: Connection closed by remote peer n2<35133>",
              "nccl v2.19.3-1 src/misc/socket.cc:50 socketProgress", IB_ROOT),
    Secondary(f"{HOST} include/socket.h:423 NCCL WARN Net : Connection closed by remote peer 10.0.0.2<35133>",
              "nccl include/socket.h socketProgress (2.12-2.17)", CUDA_ROOT),
    Secondary(f"{HOST} misc/socket.cc:47 NCCL WARN socketProgressOpt: Call to recv from 10.0.0.2<43210> failed : "
              "Connection reset by peer", "nccl v2.19.3-1 src/misc/socket.cc:30 socketProgressOpt", IB_ROOT),
    Secondary(f"{HOST} proxy.cc:1494 NCCL WARN [Service thread] Error encountered progressing operation=Connect, "
              "res=3, closing connection", "nccl v2.19.3-1 src/proxy.cc:1523 ncclProxyService", IB_ROOT),
    Secondary(f"{HOST} proxy.cc:1115 NCCL WARN [Proxy Service 4] Failed to execute operation Connect from rank 5, "
              "retcode 6", "nccl v2.19.3-1 src/proxy.cc:1557 proxyServiceInitOp", IB_ROOT),
    Secondary(f"{HOST} NCCL INFO transport/net.cc:1014 -> 6", "nccl include/checks.h NCCLCHECK trace", IB_ROOT),
    # --- gloo, the store and the launcher once a peer is gone ---
    Secondary("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
              "[10.0.0.2]:23456", "gloo transport/tcp/pair.cc Pair::handleReadWrite", CUDA_ROOT),
    Secondary("RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
              "1800000ms for recv operation to complete", "gloo transport/tcp/unbound_buffer.cc waitRecv", CUDA_ROOT),
    Secondary("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Read error [10.0.0.2]:23456: "
              "Connection reset by peer", "gloo transport/tcp/pair.cc Pair::read", IB_ROOT),
    Secondary("torch.distributed.DistNetworkError: Connection reset by peer",
              "torch/csrc/distributed/c10d/TCPStoreBackend / Utils.hpp", CUDA_ROOT),
    Secondary("torch.distributed.elastic.rendezvous.api.RendezvousClosedError",
              "torch/distributed/elastic/rendezvous/dynamic_rendezvous.py (a peer closed the rendezvous)", CUDA_ROOT),
    Secondary("torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError: The node 'n1_4242_0' rendezvous has "
              "timed out.", "torch/distributed/elastic/rendezvous/dynamic_rendezvous.py (a peer never joined)",
              IB_ROOT),
    Secondary("torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
              "torch/distributed/elastic/multiprocessing/errors/__init__.py", CUDA_ROOT),
    Secondary("[2026-12-06 04:10:00,000] torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: 1) "
              "local_rank: 0 (pid: 4242) of binary: /usr/bin/python",
              "torch/distributed/elastic/multiprocessing/api.py", CUDA_ROOT),
    # --- NCCL 2.24-2.28: what follows a fault elsewhere (RAS, revoked and aborted communicators, refused sockets) ---
    Secondary(f"{HOST} transport/net_ib.cc:147 NCCL WARN communicator encountered a fatal error (detected in "
              "ncclIbTest)",
              "nccl v2.28.9-1 src/transport/net_ib.cc:147 ncclIbStatsCheckFatalCount",
              f"{HOST} transport/net_ib.cc:231 NCCL WARN NET/IB : mlx5_0:1 async fatal event on QP (0x5f3a00): local "
              "work queue catastrophic error"),
    Secondary(f"{HOST} misc/socket.cc:582 NCCL WARN socketStartConnect: connect to 10.0.0.2<35133> returned Connection "
              "refused, exceeded error retry count after 35 attempts",
              "nccl v2.28.9-1 src/misc/socket.cc:582 socketConnectCheck (ECONNREFUSED: nobody listens)", CUDA_ROOT),
    Secondary(f"{HOST} enqueue.cc:2625 NCCL WARN AllReduce: communicator was revoked",
              "nccl v2.28.9-1 src/enqueue.cc:2625 ncclEnqueueCheck (ncclCommRevoke)", IB_ROOT),
    Secondary(f"{HOST} proxy.cc:1286 NCCL WARN Comm 0x55d0c0a3b2f0 is in abort state",
              "nccl v2.28.9-1 src/proxy.cc:1286 ncclPollProxyResponse", IB_ROOT),
    Secondary(f"{HOST} proxy.cc:1300 NCCL WARN Socket recv failed while polling for opId=0x7f2a4c0123a0",
              "nccl v2.28.9-1 src/proxy.cc:1300 ncclPollProxyResponse", CUDA_ROOT),
    Secondary(f"{HOST} proxy.cc:1709 NCCL WARN [Service thread] Could not receive type from localRank 2, res=3, "
              "closed=1",
              "nccl v2.28.9-1 src/proxy.cc:1709 ncclProxyService", CUDA_ROOT),
    Secondary(f"{HOST} init.cc:2348 NCCL WARN commReclaim: cleanup comm 0x55d0c0a3b2f0 rank 3 failed in destroy/abort, "
              "error 6", "nccl v2.28.9-1 src/init.cc:2348 commReclaim", IB_ROOT),
    Secondary(f"{HOST} transport/net_socket.cc:266 NCCL WARN NET/Socket : socket progress error",
              "nccl v2.28.9-1 src/transport/net_socket.cc:266 persistentSocketThread", CUDA_ROOT),
    Secondary(f"{HOST} NCCL INFO RAS declaring peer 10.0.0.2<28028> as DEAD; rasDeadPeersHash 0x5f3a2b1c",
              "nccl v2.28.9-1 src/ras/peers.cc:737 rasPeerDeclareDead", CUDA_ROOT),
    Secondary(f"{HOST} NCCL INFO RAS keep-alive timeout error (20s) on socket connection with 10.0.0.2<28028>",
              "nccl v2.28.9-1 src/ras/rasnet.cc:754 rasConnHandleTimeouts", IB_ROOT),
    Secondary("  1 job process is considered dead (unreachable via the RAS network)",
              "nccl v2.28.9-1 src/ras/client_support.cc:1296 (ncclras report, DEAD)", CUDA_ROOT),
    Secondary("torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
              "ProcessGroupNCCL.cpp:3356, remote process exited or there was a network error, NCCL version 2.28.9",
              "nccl v2.28.9-1 src/init.cc:2691 ncclGetErrorString (ncclRemoteError)", IB_ROOT),
    # --- gloo once its peer is gone (gloo 70dc360) ---
    Secondary("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:554] Connection closed by peer "
              "[10.0.0.2]:23456. This is typically caused by a remote worker crashing. Check the logs of the remote "
              "worker before reporting an error. GLHF!", "gloo 70dc360 gloo/transport/tcp/pair.cc:554 Pair::read",
              CUDA_ROOT),
    Secondary("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:538] Read error [10.0.0.2]:23456: "
              "Connection reset by peer. This is typically caused by a remote worker hanging or bugs in the "
              "application. Check the logs of the remote worker before reporting an error. GLHF!",
              "gloo 70dc360 gloo/transport/tcp/pair.cc:538 Pair::read", IB_ROOT),
    Secondary("RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:130] Timed out waiting "
              "1800000ms for send operation to complete",
              "gloo 70dc360 gloo/transport/tcp/unbound_buffer.cc:130 waitSend",
              CUDA_ROOT),
    Secondary("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:812] Socket closed [10.0.0.2]:23456",
              "gloo 70dc360 gloo/transport/tcp/pair.cc:812 Pair::sendSyncMode", CUDA_ROOT),
    Secondary("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:201] Socket unexpectedly closed "
              "[10.0.0.2]:23456", "gloo 70dc360 gloo/transport/tcp/pair.cc:201 Pair::setSync", IB_ROOT),
    Secondary("RuntimeError: Application timeout caused pair closure",
              "gloo 70dc360 gloo/transport/tcp/unbound_buffer.cc:77 waitRecv (signalled to every other pair)",
              CUDA_ROOT),
    Secondary("torch.distributed.DistStoreError: Failed to recv, got 0 bytes. Connection was likely closed. Did the "
              "remote server shutdown or crash?",
              "torch/csrc/distributed/c10d/Utils.hpp tcputil::recvBytes (libtorch_cpu 2.13 string)", CUDA_ROOT),
    Secondary("RuntimeError: Rank 1 failed to pass monitoredBarrier in 1800000 ms",
              "torch/csrc/distributed/c10d/ProcessGroupGloo.cpp monitoredBarrier (libtorch_cpu 2.13 string)", IB_ROOT),
    # --- torchelastic's agent and CUDA's notes after an error ---
    Secondary("[2026-12-06 04:10:00,000] torch.distributed.elastic.agent.server.api: [WARNING] Received "
              "Signals.SIGTERM death signal, shutting down workers",
              "torch 2.13.0 torch/distributed/elastic/agent/server/api.py:753",
              CUDA_ROOT),
    Secondary("[2026-12-06 04:10:00,000] torch.distributed.elastic.agent.server.api: [INFO] [default] Worker group "
              "FAILED. 3/3 attempts left; will restart worker group",
              "torch 2.13.0 torch/distributed/elastic/agent/server/api.py:943", IB_ROOT),
    Secondary("CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
              "might be incorrect.", "c10/cuda/CUDAException.cpp c10_cuda_check_implementation", CUDA_ROOT),
    Secondary("Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
              "c10/cuda/CUDAException.cpp c10_cuda_check_implementation", CUDA_ROOT),
    # --- DeepSpeed's launcher ---
    Secondary("[2026-12-06 04:10:00,000] [ERROR] [launch.py:341:sigkill_handler] ['/usr/bin/python', '-u', 'train.py', "
              "'--local_rank=0'] exits with return code = 1",
              "DeepSpeed edaa722 deepspeed/launcher/launch.py:341 sigkill_handler", CUDA_ROOT),
    # --- JAX multi-host: the coordination service once a task is gone ---
    Secondary(JAX_PEER_DIED, "jax docs/fault_tolerance.rst (client.h:77, xla/tsl coordination_service.cc heartbeat "
              "timeout)", CUDA_ROOT),
    Secondary("E0926 17:26:32.075402  157988 coordination_service_agent.cc:332] Polled an error from coordination "
              "service (this can be an error from this or another task).",
              "jax docs/fault_tolerance.rst (xla/tsl coordination_service_agent.cc)", CUDA_ROOT),
    Secondary("F0929 17:42:48.594200 1044529 client.h:77] Terminating process because the JAX distributed service "
              "detected fatal errors. This most likely indicates that another task died; see the other task logs for "
              "more details. Disable Python buffering, i.e. `python -u`, to be sure to see all the previous output. "
              "absl::Status: UNAVAILABLE: Failed to send RPC to coordination service. Either the leader task was "
              "preempted/died/restarted unexpectedly or this task is experiencing network issues.",
              "jax docs/fault_tolerance.rst (the leader task gone)", IB_ROOT),
    Secondary("jaxlib.xla_extension.XlaRuntimeError: DEADLINE_EXCEEDED: Barrier timed out. Id: "
              "0_async_write_complete.0.1. This usually happens because a task triggered the barrier too early or too "
              "slowly. Please look at the task logs (both timed out and first task) to debug further.",
              "xla/tsl/distributed_runtime/coordination/coordination_service.cc (barrier timeout)", CUDA_ROOT),
    Secondary("jaxlib._jax.XlaRuntimeError: FAILED_PRECONDITION: Task with incarnation id 3446767950926952685 is not "
              "connected", "jax docs/fault_tolerance.rst (a collective cancelled after a peer died)", CUDA_ROOT),
    # --- Ray Train: the driver once a worker is gone ---
    Secondary("ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.",
              "ray python/ray/exceptions.py ActorDiedError", CUDA_ROOT),
    Secondary("ray.exceptions.RayActorError: The actor died unexpectedly before finishing this task.",
              "ray python/ray/exceptions.py RayActorError", IB_ROOT),
    Secondary("The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit "
              "detail: Worker unexpectedly exits with a connection error code 2. End of file.",
              "ray src/ray/gcs (actor death cause), printed under ActorDiedError", CUDA_ROOT),
    Secondary("ray.exceptions.WorkerCrashedError: The worker died unexpectedly while executing this task. Check "
              "python-core-worker-*.log files for more information.", "ray python/ray/exceptions.py WorkerCrashedError",
              CUDA_ROOT),
    Secondary("ray.train.base_trainer.TrainingFailedError: The Ray Train run failed. Please inspect the previous error "
              "messages for a cause. After fixing the issue (assuming that the error is not caused by your own "
              "application logic, but rather an error such as OOM), you can restart the run from scratch or continue "
              "this run.", "ray python/ray/train/base_trainer.py TrainingFailedError._RESTORE_MSG", CUDA_ROOT),
    Secondary("ray.tune.error.TuneError: The Ray Tune run failed. Please inspect the previous error messages for a "
              "cause.",
              "ray python/ray/tune/tuner.py (TuneError)", IB_ROOT),
    # --- MPI launchers after a rank died ---
    Secondary("prterun noticed that process rank 3 with PID 4242 on node n2 exited on signal 9 (Killed).",
              "PRRTE (Open MPI 5) errmgr help text", CUDA_ROOT),
    Secondary("mpirun noticed that process rank 0 with PID 4242 on node n1 exited on signal 11 (Segmentation fault).",
              "ORTE (Open MPI 4) errmgr help text", CUDA_ROOT),
    Secondary("Primary job  terminated normally, but 1 process returned", "ORTE / PRRTE help text (non-zero exit)",
              IB_ROOT),
    # --- PyTorch 2.6+ ProcessGroupNCCL's heartbeat monitor and flight recorder (HeartbeatMonitor::runLoop,
    # dumpDebuggingInfo, getNCCLWatchdogTimeoutExitMsg): what every rank prints once one rank's collective timed out ---
    Secondary(f"{PG} Observed flight recorder dump signal from another rank via TCPStore.",
              "ProcessGroupNCCL.cpp HeartbeatMonitor::runLoop", CUDA_ROOT),
    Secondary(f"{PG} ProcessGroupNCCL preparing to dump debug info. Include stack trace: 1, only active collectives: 0",
              "ProcessGroupNCCL.cpp dumpDebuggingInfo", IB_ROOT),
    Secondary(f"{PG.replace('[E1206', '[F1206')} {PG[PG.index('[PG'):]} Terminating the process after attempting to "
              "dump debug info, due to collective timeout or exception.",
              "ProcessGroupNCCL.cpp terminateProcess(getNCCLWatchdogTimeoutExitMsg), LOG(FATAL)", CUDA_ROOT),
    Secondary(f"{PG} Terminating the process after attempting to dump debug info, due to ProcessGroupNCCL watchdog "
              "hang.", "ProcessGroupNCCL.cpp getNCCLWatchdogTimeoutExitMsg (heartbeat timeout)", IB_ROOT),
    Secondary(f"{PG} Failed to check the \"should dump\" flag on TCPStore, (maybe TCPStore server has shut down too "
              "early), with error: Connection reset by peer", "ProcessGroupNCCL.cpp HeartbeatMonitor::runLoop",
              CUDA_ROOT),
    Secondary(f"{PG} Could not acquire GIL within 300 ms on exit, possible GIL induced hang",
              "ProcessGroupNCCL.cpp HeartbeatMonitor::runLoop (GIL check)", IB_ROOT),
    Secondary(f"{PG} Process group watchdog thread terminated with exception: unknown",
              "ProcessGroupNCCL.cpp Watchdog::run", CUDA_ROOT),
    Secondary("RuntimeError: [Rank 0]: Ranks 1, 2 failed to pass monitoredBarrier in 30000 ms",
              "torch/csrc/distributed/c10d/ProcessGroupGloo.cpp monitoredBarrier (wait_all_ranks; libtorch_cpu 2.13 "
              "string ' failed to pass monitoredBarrier in ')", CUDA_ROOT),
    Secondary("RuntimeError: Rank 1 timed out in monitoredBarrier after 30000 ms.",
              "torch/csrc/distributed/c10d/ProcessGroupGloo.cpp monitoredBarrier (libtorch_cpu 2.13 string ' timed "
              "out in monitoredBarrier after ')", IB_ROOT),
    # --- the desync report ProcessGroupNCCL appends to a watchdog timeout with TORCH_NCCL_DESYNC_DEBUG=1
    # (torch/csrc/distributed/c10d/TraceUtils.h analyzeMissingRanks / analyzeLaggingRanks) ---
    Secondary("\t - To our best knowledge, ranks [47] are the lagging ranks that caused this timeout. They never "
              "joined any collectives", "TraceUtils.h analyzeMissingRanks", CUDA_ROOT),
    Secondary("\t - To our best knowledge, the lagging/dead/mismatched ranks that caused the desync are:",
              "TraceUtils.h analyzeLaggingRanks", IB_ROOT),
    Secondary("\t   - [47] joined but didn't finish collective #41207 (count from 1)",
              "TraceUtils.h analyzeLaggingRanks", CUDA_ROOT),
    # --- NVSHMEM and Open MPI after the failure ---
    Secondary("/build/nvshmem/src/host/init/init.cu:nvshmemi_check_state_and_init:1200: nvshmem initialization failed, "
              "exiting", "NVSHMEM 2d7d25f src/host/init/init.cu:1200 (NVSHMEMI_ERROR_EXIT)",
              "/build/nvshmem/src/host/transport/transport.cpp:nvshmemi_transport_init:282: init failed for transport: "
              "IBGDA"),
    Secondary("/build/nvshmem/src/host/init/init.cu:1111: non-zero status: 7 nvshmem transport init failed",
              "NVSHMEM 2d7d25f src/host/init/init.cu:1111 (NVSHMEMI_NZ_ERROR_JMP)",
              "/build/nvshmem/src/host/transport/transport.cpp:nvshmemi_transport_init:282: init failed for transport: "
              "IBGDA"),
    Secondary("*** MPI_ERRORS_ARE_FATAL (processes in this communicator will now abort,",
              "Open MPI ompi/errhandler/errhandler_predefined.c", "*** An error occurred in MPI_Allreduce"),
    Secondary("MPI_ABORT was invoked on rank 0 in communicator MPI_COMM_WORLD with errorcode 1.",
              "Open MPI ompi/mpi/help-mpi-api.txt (mpi-abort)", CUDA_ROOT),
    # --- DeepSpeed's launcher relaying a worker's end ---
    Secondary("[2026-12-06 04:10:00,000] [ERROR] [launch.py:341:sigkill_handler] ['/usr/bin/python', '-u', 'train.py', "
              "'--local_rank=0'] exits with return code = -9",
              "DeepSpeed edaa722 deepspeed/launcher/launch.py:341 sigkill_handler (killed by signal 9)",
              "[Mon Dec  7 04:09:58 2026] Out of memory: Killed process 4242 (python) total-vm:90000000kB"),
]


@pytest.mark.parametrize("entry", ROOTS, ids=lambda e: e.signature + ":" + e.message[-40:])
def test_a_training_process_failure_message_is_a_root_above_its_consequences(tmp_path: Path, entry: Root) -> None:
    # beside what another rank prints one layer down the ranking, the message is still the root
    assert_root_alone_and_beside(tmp_path, entry.message, entry.source, entry.signature, "rank_0.log", entry.against,
                                 "rank_1.log")


@pytest.mark.parametrize("entry", SECONDARIES, ids=lambda e: e.message[-48:])
def test_a_documented_training_process_consequence_never_outranks_its_cause(tmp_path: Path, entry: Secondary) -> None:
    assert_cause_named_after_its_consequence(tmp_path, entry, "rank_0.log")
    # printed by another rank, the consequence does not outrank the cause either
    (tmp_path / "rank_0.log").write_text(entry.cause + "\n")
    (tmp_path / "rank_1.log").write_text(entry.message + "\n")
    result = triage(tmp_path)
    assert result.root is not None and result.root.source == "rank_0.log", (entry.source, result.summary)
