"""Training-process coverage of the signature library, from the producers' own source code: NCCL and PyTorch c10d.

Each row is a message as its producer prints it (NCCL's WARN format strings and ncclGetErrorString, PyTorch's
ProcessGroupNCCL, ProcessGroupGloo / gloo, TCPStore and torchelastic), with a realistic prefix, where it comes from
(repository path and function, NVIDIA/nccl v2.19-v2.23 and pytorch/pytorch v2.1-v2.5) and what triage must make of it:

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
