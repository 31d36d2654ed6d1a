"""Root error across ranks: simulated multi-rank failures and real crashed gloo jobs."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vigil.knowledge.faults import fault_catalogue
from vigil.logs.miner import read_lines
from vigil.logs.severity import SPECIFIC, strength
from vigil.logs.sources import discover
from vigil.logs.triage import triage
from vigil.model import FaultLevel, VigilInputError
from vigil_eval.logcorpus import FAILURE_KINDS, simulate_corpus, simulate_failure
from vigil_eval.realjobs import logged_an_error, root_label, run_failed_job, terminated_by_launcher


def test_simulated_corpus_root_accuracy(tmp_path: Path) -> None:
    cases = simulate_corpus(tmp_path, per_kind=3, seed=11)
    right = 0
    for case, label in cases:
        result = triage(case)
        assert result.root is not None, case
        right += label.accepts(result.root.source, result.root.lineno) and result.root.rank == label.rank
    assert len(cases) == 3 * len(FAILURE_KINDS)
    assert right / len(cases) >= 0.95


def test_corpus_labels_speak_the_fault_catalogue(tmp_path: Path) -> None:
    catalogue = fault_catalogue()
    for case, label in simulate_corpus(tmp_path, per_kind=1, seed=3):
        assert label.fault_type is None or label.fault_type in {*catalogue.faults, *catalogue.findings}, label
        result = triage(case)
        if result.root is not None and result.root_basis == "signature" and label.accepts(result.root.source,
                                                                                          result.root.lineno):
            # where triage named the labelled line by a signature, both name the same fault (or none)
            assert result.root.fault_type == label.fault_type, (label.kind, result.root.signature)


def test_cascade_and_machine_faults(tmp_path: Path) -> None:
    label = simulate_failure("xid_48_ecc", tmp_path, seed=5, world=8)
    result = triage(tmp_path)
    assert result.root is not None
    assert (result.root.source, result.root.lineno) == (label.source, label.lineno)
    assert result.root.rank == label.rank and result.root.attrs["xid"] == 48
    assert result.probable_cause == "gpu_dbe" and result.root.level == FaultLevel.ISOLATE
    timeouts = [e for e in result.cascade if e.signature == "nccl.watchdog_timeout"]
    # Every healthy rank timed out; each is one cascade entry however many lines it printed.
    assert {e.rank for e in timeouts} == set(range(8)) - {label.rank}
    assert all(e.count >= 2 for e in timeouts)
    assert result.ranks == list(range(8))
    evidence = result.evidence()
    assert evidence[0].summary.startswith("root error: gpu_dbe")


def test_worker_processes_give_the_same_result(tmp_path: Path) -> None:
    label = simulate_failure("xid_48_ecc", tmp_path, seed=7, world=8)
    serial = triage(tmp_path, workers=1)
    read: list[str] = []
    parallel = triage(tmp_path, workers=2, progress=read.append)
    assert parallel.root is not None and (parallel.root.source, parallel.root.lineno) == (label.source, label.lineno)
    assert parallel.model_dump() == serial.model_dump()
    assert read == [source.name for source in discover(tmp_path)]  # every file once, in file order


def test_rank_error_is_linked_to_the_node_fault_before_it(tmp_path: Path) -> None:
    node = tmp_path / "n007"
    node.mkdir()
    (node / "rank_3.log").write_text(
        "2026-03-01 10:00:00,000 INFO step 1 loss 2.0\n"
        "n007:4242:4242 [3] NCCL INFO Init COMPLETE\n"
        "2026-03-01 10:00:05,000 ERROR step failed\n"
        "RuntimeError: CUDA error: unspecified launch failure\n")
    (node / "rank_2.log").write_text("2026-03-01 10:00:00,000 INFO step 1 loss 2.0\n"
                                     "n007:4141:4141 [2] NCCL INFO Init COMPLETE\n")
    (node / "kern.log").write_text("2026-03-01T10:00:07,000000+00:00 NVRM: Xid (PCI:0000:3b:00): 95, pid=4242, "
                                   "name=python, Uncontained ECC error\n")
    result = triage(tmp_path, job="j7")
    assert result.root is not None and result.root.rank == 3
    assert result.root.entity == "job/j7/rank/3" and result.root.kind == "cuda_launch_failure"
    assert [m.attrs["xid"] for m in result.machine_faults] == [95]
    assert result.machine_faults[0].rank == 3  # tied through the pid NCCL printed
    assert result.probable_cause == "gpu_dbe"
    assert result.silent_ranks == [2]


def test_no_root_only_symptoms(tmp_path: Path) -> None:
    (tmp_path / "rank_0.log").write_text("2026-01-01 00:10:00,000 ERROR Watchdog caught collective operation "
                                         "timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, ...) ran for 600000 ms\n")
    (tmp_path / "rank_1.log").write_text("2026-01-01 00:00:00,000 INFO step 4\n")
    result = triage(tmp_path)
    # no root signature: the symptom is named (never nothing), and said to be one
    assert result.root is not None and (result.root.source, result.root.lineno) == ("rank_0.log", 1)
    assert result.root_basis == "symptom" and result.probable_cause is None and result.silent_ranks == [1]
    assert "earliest symptom" in result.summary and "silent ranks [1]" in result.summary


def test_a_plain_error_line_right_above_a_wrapper_summary_is_the_root(tmp_path: Path) -> None:
    # no signature knows either line: the specific summary a wrapper prints right under the plain report gives way
    plain = "2026-01-01 00:00:05,000 WARNING coordinator.py:81 -- a member quit with an unexpected internal error\n"
    summary = "2026-01-01 00:00:05,100 ERROR supervisor.py:12 -- Unhandled error in the member group\n"
    (tmp_path / "job.log").write_text("2026-01-01 00:00:00,000 INFO step 4\n" + plain + summary)
    result = triage(tmp_path)
    assert result.root is not None and (result.root.source, result.root.lineno) == ("job.log", 2)
    assert result.root_basis == "error_wording"
    # not when a line lies between them, nor when the plain line reads as the echo of a failure elsewhere
    (tmp_path / "job.log").write_text(plain + "2026-01-01 00:00:05,050 INFO shutting down\n" + summary)
    result = triage(tmp_path)
    assert result.root is not None and result.root.lineno == 3
    (tmp_path / "job.log").write_text("2026-01-01 00:00:05,000 WARNING a member timed out with an error\n" + summary)
    result = triage(tmp_path)
    assert result.root is not None and result.root.lineno == 2


def test_a_healthy_job_s_routine_line_above_the_error_is_not_the_root(tmp_path: Path) -> None:
    # a step's metrics and a line its logger tagged INFO carry an error word every step, failed run or not
    error = "2026-01-01 00:00:01,000 ERROR train.py:88 -- checkpoint write failed: disk quota exceeded\n"
    for routine in ("2026-01-01 00:00:00,000 INFO step 4 | loss 2.31 | val error 0.12\n",
                    "step 4/1000 loss=2.31 error=0.118 lr=3e-4\n",
                    "epoch 3 done, errors: 0, skipped batches: 0\n",
                    "2026-01-01 00:00:00,000 INFO worker.py:12 -- retrying on error in the data loader\n"):
        (tmp_path / "job.log").write_text(routine + error)
        result = triage(tmp_path)
        assert result.root is not None and result.root.lineno == 2, routine
    # an error code is a report, not a metric
    (tmp_path / "job.log").write_text("2026-01-01 00:00:00,900 got error 404 from the checkpoint store\n" + error)
    result = triage(tmp_path)
    assert result.root is not None and result.root.lineno == 1


def test_an_error_relayed_after_the_childfailederror_report_is_not_the_root(tmp_path: Path) -> None:
    # the platform that ran torchrun reports the failure after torchrun's report: the root cause is still rank 3's exit
    (tmp_path / "job.log").write_text(
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
        "============================================================\n"
        "Root Cause (first observed failure):\n"
        "[0]:\n"
        "  rank      : 3 (local_rank: 3)\n"
        "  exitcode  : 1 (pid: 77)\n"
        "============================================================\n"
        "2024-10-01 12:00:26,710 sagemaker-training-toolkit ERROR    Reporting training FAILURE\n")
    result = triage(tmp_path)
    assert result.root is not None and result.root.lineno == 6 and result.root.signature == "launcher.root_cause"
    # an error the worker printed before the report is still its own account of the failure
    (tmp_path / "job.log").write_text(
        "ValueError: Unable to create tensor, you should probably activate truncation\n"
        + (tmp_path / "job.log").read_text())
    result = triage(tmp_path)
    assert result.root is not None and result.root.lineno == 1


def test_a_launchers_ssh_refusing_its_key_is_the_root(tmp_path: Path) -> None:
    # an MPIJob launcher's key mounted with mode 0640: ssh's known-hosts warnings are routine, its refusal is the root
    (tmp_path / "launcher.log").write_text(
        "Warning: Permanently added 'job-worker-0.job-worker,10.42.0.7' (ECDSA) to the list of known hosts.\n"
        "@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\n"
        "@         WARNING: UNPROTECTED PRIVATE KEY FILE!          @\n"
        "@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\n"
        "Permissions 0640 for '/root/.ssh/id_rsa' are too open.\n"
        "It is required that your private key files are NOT accessible by others.\n"
        "This private key will be ignored.\n")
    result = triage(tmp_path)
    assert result.root is not None and result.root.lineno in (3, 5) and result.root.signature == "ssh.key_ignored"


NVIDIA_SMI_THEN_DMESG = (
    "root@node1:~# nvidia-smi\n"
    "Unable to determine the device handle for GPU0000:A1:00.0: Unknown Error\n"
    "root@node1:~# dmesg -T | grep NVRM\n"
    "[Fri Apr  5 21:29:39 2024] NVRM: Xid (PCI:0000:{bus}:00): 79, pid='<unknown>', name=<unknown>, "
    "GPU has fallen off the bus.\n"
    "[Fri Apr  5 21:29:39 2024] NVRM: GPU 0000:{bus}:00.0: GPU has fallen off the bus.\n")


def _phase(root: dict[str, object] | None,
           *files: str | None) -> tuple[dict[str | None, str | None], dict[str, object] | None]:
    """Log files to write over the ones before (name, text, name, text...; a text of None removes the file), and what
    triage then finds: the fields of its result named (``root.lineno``, ``root.attrs.host``, ``root_basis``...) with
    their values (``{}``: any root), or None where it names no root."""
    return dict(zip(files[::2], files[1::2], strict=True)), root


def _field(result: object, path: str) -> object:
    """The field of ``result`` at ``path`` (``root.attrs.host``: the root's attrs["host"])."""
    value = result
    for name in path.split("."):
        value = value[name] if isinstance(value, dict) else getattr(value, name)
    return value


# sinfo -lNe: the "*" after a state is sinfo's "presently not responding" (man sinfo, NODE STATE CODES), the REASON
# slurmctld's "Not responding"; healthy rows and the header are not errors
_SINFO_NOT_RESPONDING = ("NODELIST    NODES PARTITION       STATE CPUS    S:C:T MEMORY TMP_DISK WEIGHT "
                         "FEATURES REASON\n"
                         "compute000      1     main*        idle   12   12:1:1  64267        0      1   (null) none\n"
                         "compute001      1     main*       down*   12   12:1:1  64267        0      1   (null) Not "
                         "responding\n"
                         "compute002      1     main*       idle*   12   12:1:1  64267        0      1   (null) none\n")

# job_mgr.c job_complete(): "WTERMSIG N" when a signal ended the batch script, "WEXITSTATUS N" otherwise
_SLURMCTLD_WTERMSIG = ("[2022-05-27T10:42:30.155] _slurm_rpc_submit_batch_job: JobId=127441 InitPrio=5772 usec=1032\n"
                       "[2022-05-27T10:42:30.509] sched: Allocate JobId=127441 NodeList=c014 #CPUs=2 Partition=gpu\n"
                       "[2022-05-27T11:37:57.377] _job_complete: JobId=127441 WTERMSIG 9\n"
                       "[2022-05-27T11:37:57.377] _job_complete: JobId=127441 done\n")

_REVERSED_NCCL_REPORT = ("Duplicate GPU detected : rank 9 and rank 1 both on CUDA device 34000\n"
                         " Last error:\n"
                         "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.\n"
                         "torch.distributed.DistBackendError: NCCL error in: NCCLUtils.hpp:268, invalid usage "
                         "(run with NCCL_DEBUG=WARN for details), NCCL version 2.21.5\n")

# libfabric's EFA provider reports a failed send under FI_LOG_LEVEL=warn before NCCL's channel lines go on
_EFA_CQ_ERROR = ("libfabric:451707:1708520807::efa:cq:efa_rdm_txe_handle_error():737<warn> err: 5, message: "
                 "Invalid address My EFA addr: fi_addr_efa://[fe80::13:c2ff:fe6f:f03d]:0:1072483550 Peer host id: "
                 "i-0ce6d3d57139f053c (7)\n")

_VOLCANO_REQUEST = ("I0601 10:00:00.{:06d}       1 job_controller.go:356] Try to handle request <Queue: , "
                    "Job: default/llama, Task:worker, Pod:llama-worker-{}, Event:{}, ExitCode:{}, Action:, JobVersion: "
                    "0>")

_UCX_CGPU12 = "0: [1579244748.8389{}] [cgpu12:56309:2] "


# Jobs' logs and the root triage names in each, in phases: a phase's files are written over the ones before it, and
# triage is run again.
@pytest.mark.parametrize("phases", [
    pytest.param([
        _phase({"root.attrs.exc_type": "KeyError", "root.attrs.user_frame": "/work/train.py:10 in <module>"},
            "rank_0.log",
            "[rank0]: Traceback (most recent call last):\n"
            '[rank0]:   File "/work/train.py", line 10, in <module>\n'
            '[rank0]:   File "/usr/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1, in _call\n'
            "[rank0]: KeyError: 'input_ids'\n"),
    ], id="user_frame_and_exception_type"),
    pytest.param([
        _phase({"root.source": "rank_1.log", "root_basis": "symptom"},
            "rank_0.log",
            "2026-01-01 00:00:01,000 Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, "
            "OpType=ALLREDUCE\n",
            "rank_1.log",
            "2026-01-01 00:00:09,000 RuntimeError: [gloo/transport/tcp/pair.cc:799] connect [10.0.0.3]:13195: "
            "Connection refused\n"),
    ], id="a_timeout_is_the_last_choice_among_symptoms"),
    pytest.param([
        _phase({"root.lineno": 3, "root.signature": "cuda.kernel_assert"},
            "rank_0.log",
            "RuntimeError: CUDA error: device-side assert triggered\n"
            "For debugging consider passing CUDA_LAUNCH_BLOCKING=1.\n"
            "/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:92: operator(): block: [0,0,0], thread: [3,0,0] "
            "Assertion `index >= -sizes[i] && index < sizes[i] && \"index out of bounds\"` failed.\n"),
    ], id="the_kernel_assertion_printed_after_the_host_error_is_the_root"),
    pytest.param([
        # "terminate called" is the process aborting; the "what():" line under it is the error it aborts on
        _phase({"root.lineno": 2, "root_basis": "symptom"},
            "rank_2.log",
            "terminate called after throwing an instance of 'gloo::IoException'\n"
            "  what():  [gloo/transport/tcp/pair.cc:310] read [10.0.0.5]:4411: Connection reset by peer\n"),
        # an abort alone is still named (never nothing)
        _phase({"root.signature": "python.aborted"},
            "rank_2.log",
            "terminate called after throwing an instance of 'std::bad_alloc'\n"),
    ], id="the_message_of_an_aborting_exception_is_the_root_not_the_abort"),
    pytest.param([
        _phase({"root.lineno": 1},
            "rank_0.log",
            "[rank0]:[E ProcessGroupNCCL.cpp:1300] [PG 0 Rank 0] Heartbeat monitor timed out! Process will be "
            "terminated after dumping debug info. workMetaList_.size()=2\n"
            "[rank0]:[E ProcessGroupNCCL.cpp:1150] [PG 0 Rank 0] ProcessGroupNCCL preparing to dump debug info.\n"
            "[rank0]:[F ProcessGroupNCCL.cpp:1170] [PG 0 Rank 0] ProcessGroupNCCL's watchdog got stuck for 600 "
            "seconds "
            "without making progress in monitoring enqueued collectives.\n"),
    ], id="the_heartbeat_timeout_not_its_debug_dump_is_the_root"),
    pytest.param([
        # PyTorch's WorkNCCL::printTraceback: after the timeout, the flight recorder's stack of the timed-out collective
        # under "Stack trace of the failed collective:" (or that it was "not found"); the header reports nothing new
        _phase({"root.lineno": 1},
            "rank_0.log",
            "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE, NumelIn=4, "
            "NumelOut=4, Timeout(ms)=8000) ran for 8097 milliseconds before timing out.\n"
            " - [0] Timeout at collective: ALLREDUCE, #3\n"
            "Stack trace of the failed collective:\n"
            "#2 buggy from collective_mismatch.py:8\n"),
        _phase({"root.lineno": 1},
            "rank_0.log",
            "[rank1]:[E1218 20:27:21.484 ProcessGroupNCCL.cpp:631] [Rank 1] Watchdog caught collective operation "
            "timeout: "
            "WorkNCCL(SeqNum=1, OpType=BROADCAST, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600090 "
            "milliseconds "
            "before timing out.\n"
            "[rank1]:[E1218 20:27:21.484 ProcessGroupNCCL.cpp:667] Stack trace of the failed collective not found, "
            "potentially because FlightRecorder is disabled. You can enable it by setting "
            "TORCH_NCCL_TRACE_BUFFER_SIZE "
            "to a non-zero value.\n"),
    ], id="the_watchdog_timeout_not_the_stack_trace_header_under_it_is_the_root"),
    pytest.param([
        _phase({"root.lineno": 13, "root.signature": "launcher.root_cause"},
            "launcher.log",
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
            "============================================================\n"
            "train.py FAILED\n"
            "------------------------------------------------------------\n"
            "Failures:\n"
            "[1]:\n"
            "  rank      : 3 (local_rank: 3)\n"
            "  exitcode  : -15 (pid: 402)\n"
            "------------------------------------------------------------\n"
            "Root Cause (first observed failure):\n"
            "[0]:\n"
            "  rank      : 1 (local_rank: 1)\n"
            "  exitcode  : -9 (pid: 400)\n"
            "  traceback : Signal 9 (SIGKILL) received by PID 400\n"
            "============================================================\n"),
        # the other failures' exit codes are the report's echo: with no root cause section, the report's head is named
        _phase({"root.lineno": 1},
            "launcher.log",
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
            "Failures:\n"
            "  exitcode  : -15 (pid: 402)\n"),
    ], id="the_root_cause_of_a_childfailederror_report_is_its_first_observed_failure"),
    pytest.param([
        _phase({"root.lineno": 1},
            "agent.log",
            "RuntimeError: Timed out initializing process group in store based barrier on rank: 2, for key: "
            "store_based_barrier_key:1 (world_size=4, worker_count=3, timeout=0:30:00)\n"
            "ERROR:torch.distributed.elastic.agent.server.local_elastic_agent:[default] Worker group failed\n"),
    ], id="the_agent_s_worker_group_failed_is_an_echo"),
    pytest.param([
        _phase({"root.lineno": 2, "root_basis": "signature", "root.fault_type": "process_crash"},
            "rank_5.log",
            "n3:1:1 [5] NCCL INFO Channel 00/0 : 5[5] -> 6[6] via P2P/IPC\n"
            "[n3:7781:0:7790] Caught signal 7 (Bus error: nonexistent physical address)\n"
            "==== backtrace (tid:   7790) ====\n"
            " 0  /usr/lib/libucs.so.0(ucs_handle_error+0x2dc) [0x7f00aa]\n"
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"),
    ], id="a_fatal_signal_caught_by_the_process_is_a_root"),
    pytest.param([
        # the shell's report of a bus error: no signature, but the wording names a fatal signal
        _phase({"root.lineno": 2, "root_basis": "error_wording"},
            "rank_0.log",
            "Data size: 30000\n[1]    4939 bus error  python train.py\n"),
    ], id="a_signal_death_no_signature_knows_is_still_named"),
    pytest.param([
        # PMIx skips a component it cannot open and says so; the fatal MPI error after it is the failure
        _phase({"root.lineno": 2},
            "rank_0.log",
            "[n1:42] pmix_mca_base_component_repository_open: unable to open mca_gds_x: libx.so: undefined symbol: y "
            "(ignored)\n"
            "*** An error occurred in MPI_Init_thread\n"
            "*** on a NULL communicator\n"),
    ], id="a_problem_its_producer_ignored_is_not_the_root"),
    pytest.param([
        # NCCL logs an optional verb the NIC does not support at INFO and goes on; the WARN after it is the failure
        _phase({"root.lineno": 3, "root_basis": "signature"},
            "rank_0.log",
            "h1:10:20 [0] NCCL INFO Call to ibv_set_ece failed with error Operation not supported errno 95\n"
            "\n"
            "h1:10:20 [0] misc/ibvwrap.cc:206 NCCL WARN Call to ibv_modify_qp failed with error No such device "
            "errno 19\n"
            "h1:10:20 [0] NCCL INFO transport/net_ib.cc:937 -> 2\n"),
        # alone, a call NCCL tolerated names no root
        _phase(None,
            "rank_0.log",
            "h1:10:20 [0] NCCL INFO Call to ibv_set_ece failed with error Operation not supported errno 95\n"),
    ], id="a_verbs_call_nccl_reports_at_info_is_not_the_root"),
    pytest.param([
        # the process dies at exit; torchelastic then reports the SIGABRT (-6) of the worker
        _phase({"root.lineno": 2, "root.fault_type": "process_crash"},
            "rank_0.log",
            "[rank0]:[W1019 08:16:22.397556647 ProcessGroupNCCL.cpp:1477] Warning: WARNING: destroy_process_group() "
            "was not called before program exit, which can leak resources.\n"
            "pure virtual method called\n"
            "terminate called without an active exception\n"
            "E1019 08:21:39.599000 3036 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: -6) "
            "local_rank: 0 (pid: 3042) of binary: /usr/bin/python\n"),
    ], id="a_pure_virtual_call_is_the_root_not_the_launchers_report"),
    pytest.param([
        # the DeepSpeed launcher runs "ssh HOST hostname -I"; ssh says why it failed, then Python reports exit status
        # 255
        _phase({"root.lineno": 1, "root_basis": "signature", "root.signature": "ssh.connect_failed",
                "root.attrs.host": "node-0"},
            "launcher.log",
            "ssh: Could not resolve hostname node-0: Name or service not known\n"
            "Traceback (most recent call last):\n"
            '  File "/usr/local/lib/python3.6/dist-packages/deepspeed/launcher/runner.py", line 281, in main\n'
            "    result = subprocess.check_output(hostname_cmd, shell=True)\n"
            "subprocess.CalledProcessError: Command '['ssh node-0 hostname -I']' returned non-zero exit status 255.\n"),
    ], id="the_ssh_failure_is_the_root_not_the_launchers_failed_command"),
    pytest.param([
        # nvidia-smi run first, dmesg after: NVML's report is first in the file, the driver's Xid about that GPU is the
        # root
        _phase({"root.lineno": 4, "root.signature": "nvrm.xid"},
            "session.log",
            NVIDIA_SMI_THEN_DMESG.format(bus="a1")),
    ], id="nvidia_smi_before_the_kernel_log_of_one_session_yields_to_the_drivers_line"),
    pytest.param([
        # the kernel's lines are about GPU 0000:3b:00, nvidia-smi's about 0000:a1:00: nothing ties them, the first
        # stands
        _phase({"root.lineno": 2, "root.signature": "nvml.gpu_lost"},
            "session.log",
            NVIDIA_SMI_THEN_DMESG.format(bus="3b")),
    ], id="nvidia_smi_about_another_gpu_keeps_its_own_report"),
    pytest.param([
        # the tail of one rank's watchdog report (its c10 backtrace) names checkTimeout; the next rank's report is the
        # line
        _phase({"root.lineno": 4, "root_basis": "symptom"},
            "job.log",
            "frame #1: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration<long, "
            "std::ratio<1l, 1000l> > >) + 0x1d2 (0x2b9d2f40c8e2 in /opt/torch/lib/libtorch_cuda.so)\n"
            "frame #2: c10d::ProcessGroupNCCL::watchdogHandler() + 0x1a0 (0x2b9d2f411700 in "
            "/opt/torch/lib/libtorch_cuda.so)\n"
            "\n"
            "[rank2]:[E ProcessGroupNCCL.cpp:563] [Rank 2] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=7487, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for 1800096 "
            "milliseconds before timing out.\n"),
        # frames alone report nothing
        _phase(None,
            "job.log",
            "frame #1: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout() + 0x1d2 (0x2b9d in libtorch_cuda.so)\n"),
    ], id="a_cpp_backtrace_frame_is_not_a_report"),
    pytest.param([
        # a preempted job: the step is cancelled, then the job DUE TO PREEMPTION; the requeued run's exception comes
        # later
        _phase({"root.lineno": 2, "root_basis": "signature", "root.signature": "slurm.cancelled",
                "root.attrs.reason": "PREEMPTION"},
            "job.log",
            "slurmstepd: error: *** STEP 37361369.0 ON node-5 CANCELLED AT 2021-03-15T17:50:23 ***\n"
            "slurmstepd: error: *** JOB 37361369 ON node-5 CANCELLED AT 2021-03-15T18:00:46 DUE TO PREEMPTION ***\n"
            "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.\n"
            "submitit ERROR (2021-03-15 18:45:40,210) - Submitted job triggered an exception\n"),
        # without a reason the report is srun tearing a step down after a task failed: the task's failure is the root
        _phase({"root.lineno": 1},
            "job.log",
            "srun: error: node-1: task 4: Out Of Memory\n"
            "slurmstepd: error: *** STEP 3495064.0 ON node-1 CANCELLED AT 2021-10-27T19:35:36 ***\n"),
    ], id="slurms_cancellation_for_a_reason_is_the_root_not_the_requeued_jobs_exception"),
    pytest.param([
        # neither file has a wall-clock time: the driver's refusal outranks the CUDA error it causes
        _phase({"root.source": "dmesg.log", "root.lineno": 1, "root.signature": "nvrm.reset_required",
                "probable_cause": "gpu_xid"},
            "job.log",
            "Traceback (most recent call last):\n"
            '  File "<stdin>", line 1, in <module>\n'
            "torch.AcceleratorError: CUDA error: CUDA-capable device(s) is/are busy or unavailable\n",
            "dmesg.log",
            "[373871.354096] NVRM: nvAssertOkFailedNoLog: Assertion failed: Reset required [NV_ERR_RESET_REQUIRED] "
            "(0x00000062) returned from status @ kernel_channel.c:2827\n"),
    ], id="a_gpu_that_needs_a_reset_is_the_root_behind_cudas_device_busy"),
    pytest.param([
        # the drain reason says the kill failed; slurmd's log on the node says why (an epilog that could not run)
        _phase({"root.lineno": 2},
            "job.log",
            "Kill task failed root 2024-01-25T15:12:23 gpu-23\n"
            "Feb 22 17:46:38 gpu-23 slurmd[13562]: spank-epilog: error: pyxis: mkdir: cannot create directory "
            "'/opt/enroot/data': Permission denied\n"),
        # alone, the drain reason is still named rather than nothing
        _phase({"root.lineno": 1},
            "job.log",
            "Kill task failed root 2024-01-25T15:12:23 gpu-23\n"),
    ], id="slurms_kill_task_failed_drain_gives_way_to_the_nodes_own_error"),
    pytest.param([
        _phase({"root.lineno": 3, "root_basis": "signature", "root.attrs.resource": "ephemeral-storage"},
            "job.log",
            "Status:       Failed\n"
            "Reason:       Evicted\n"
            "Message:      The node was low on resource: ephemeral-storage. Threshold quantity: 2146223340, "
            "available: "
            "1883424Ki. Container trainer was using 52676Ki, request is 10Mi, has larger consumption of "
            "ephemeral-storage.\n"),
    ], id="a_kubelet_eviction_is_the_root_of_an_evicted_pod"),
    pytest.param([
        # Linux 5.10 and later print the task line above the call trace; older kernels the "blocked for more than" line
        _phase({"root.lineno": 1, "root.signature": "kernel.hung_task", "root.attrs.task": "python3.11"},
            "dmesg.log",
            "[  +0.000049] task:python3.11      state:D stack:    0 pid:15277 ppid: 15257 flags:0x00000002\n"
            "[  +0.000006] Call Trace:\n"
            "[  +0.000005]  uvm_page_tree_get_ptes_async+0x93/0x970 [nvidia_uvm]\n"),
        _phase({"root.lineno": 1, "root.attrs.pid": "5403"},
            "dmesg.log",
            "[ 721.028170] INFO: task nvc:[driver]:5403 blocked for more than 120 seconds.\n"
            "[ 721.028273] \"echo 0 > /proc/sys/kernel/hung_task_timeout_secs\" disables this message.\n"),
        # a task in interruptible sleep (a dump of every task) is no report
        _phase(None,
            "dmesg.log",
            "[  +0.000049] task:python3.11      state:S stack:    0 pid:15277\n"),
    ], id="a_hung_task_report_is_a_root_in_a_kernel_log"),
    pytest.param([
        # c10's glog prefix: severity E or F, then the month without zero padding and the day (April 29)
        _phase({"root.lineno": 1, "root_basis": "error_wording"},
            "rank_6.log",
            "[rank6]:[E429 13:55:49.384372190 ProcessGroupNCCL.cpp:1743] [PG ID 0 PG GUID 0(default_pg) Rank 6] "
            "ProcessGroupNCCL'\n"
            "s watchdog got stuck for 480 seconds without making progress in monitoring enqueued collectives.\n"),
    ], id="a_glog_error_tag_with_an_unpadded_month_reads_as_an_error"),
    pytest.param([
        # tqdm redraws its bar without a newline: the rank's c10 error line lands on the end of the bar's last line
        _phase({"root.lineno": 2, "root_basis": "error_wording"},
            "train.log",
            "  1%|          | 23/1752 [01:05<1:23:14,  2.89s/it]\n"
            "  1%|          | 24/1752 [01:08<1:22:56,  2.88s/it][rank5]:[E602 11:17:52.185053341 "
            "ProcessGroupNCCL.cpp:632] [Rank 5] Something went wrong in PG 1\n"),
        # a warning tag glued there is not an error
        _phase(None,
            "train.log",
            "  1%|          | 24/1752 [01:08<1:22:56,  2.88s/it][rank5]:[W602 11:17:52.185053341 "
            "ProcessGroupNCCL.cpp:632] [Rank 5] Something went wrong in PG 1\n"),
    ], id="a_ranks_glog_error_glued_to_a_progress_bar_reads_as_an_error"),
    pytest.param([
        # Ray's own OOM killer (ray-oom-prevention): the task's report and the raylet's periodic summary
        _phase({"root.lineno": 1, "root_basis": "signature"},
            "driver.log",
            "Memory on the node (IP: 10.0.0.7, ID: 9f1c) where the task (task ID: 4a2b, name=train, pid=4242, memory "
            "used=3.10GB) was running was 60.20GB / 62.00GB (0.970968), which exceeds the memory usage threshold of "
            "0.95. Ray killed this worker (ID: 77aa) because it was the most recently scheduled task; to see more "
            "information about memory usage on this node, use `ray logs raylet.out -ip 10.0.0.7`.\n"),
        _phase({"root.lineno": 2, "root_basis": "signature"},
            "driver.log",
            "(RayTrainWorker pid=812) step 120 loss 2.31\n"
            "(raylet) [2024-03-01 10:00:02,241 E 51 51] (raylet) node_manager.cc:3064: 3 Workers (tasks / actors) "
            "killed due to memory pressure (OOM), 0 Workers crashed due to other reasons at node (ID: 5e, IP: "
            "10.0.0.7) over the last time period.\n"
            "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n"),
    ], id="ray_s_memory_monitor_kill_is_a_root"),
    pytest.param([
        # ORTE's (PRRTE's since Open MPI 5) report of a lost remote daemon; its last sentence says "failure" and
        # "cannot recover", which read as error wording, but the report starts at its first line
        _phase({"root.lineno": 1, "root_basis": "signature"},
            "launcher.log",
            "ORTE has lost communication with a remote daemon.\n"
            "\n"
            "  HNP daemon   : [[4301,0],0] on node job-launcher\n"
            "  Remote daemon: [[4301,0],3] on node job-worker-2\n"
            "\n"
            "This is usually due to either a failure of the TCP network\n"
            "connection to the node, or possibly an internal failure of\n"
            "the daemon itself. We cannot recover from this failure, and\n"
            "therefore will terminate the job.\n"),
    ], id="open_mpi_s_lost_daemon_report_is_named_at_its_first_line"),
    pytest.param([
        _phase({"root.source": "rank_1.log", "root.lineno": 2, "root_basis": "error_wording", "root.fault_type": None},
            "rank_0.log",
            "2026-01-01 00:00:01,000 [E ProcessGroupNCCL.cpp:100] Watchdog caught collective operation timeout\n",
            "rank_1.log",
            "2026-01-01 00:00:00,000 INFO step 4\n"
            "2026-01-01 00:00:05,000 node7:11:12 [1] misc/socket.cc:483 NCCL WARN socketStartConnect: Connect to "
            "10.0.0.2<45763> failed : Software caused connection abort\n"
            "2026-01-01 00:00:05,000 node7:11:12 [1] NCCL INFO misc/socket.cc:564 -> 2\n"),
    ], id="unknown_error_wording_beats_an_earlier_symptom"),
    pytest.param([
        _phase({"root.lineno": 2, "root.signature": "nccl.watchdog_timeout"},
            # an MPI launcher relays the rank's output with its host before each line: the watchdog's what() names the
            # timed-out collective, and the frames after it (checkTimeout) are where it was raised, not a second report
            "job.log",
            "mpi-launcher: terminate called after throwing an instance of 'c10::DistBackendError'\n"
            "mpi-launcher:   what():  [PG 1 Rank 5] Process group watchdog thread terminated with exception: [Rank 5] "
            "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=635, OpType=ALLREDUCE, NumelIn=576156928, "
            "NumelOut=576156928, Timeout(ms)=600000) ran for 600097 milliseconds before timing out.\n"
            "mpi-launcher: Exception raised from checkTimeout at "
            "../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:565 "
            "(most recent call first):\n"
            "mpi-launcher: frame #1: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration"
            "<long, std::ratio<1l, 1000l> > >) + 0x1d2 (0x7f07d4979c62 in /opt/torch/lib/libtorch_cuda.so)\n"),
        _phase({},
            # a line that only mentions a frame further in is not one
            "job.log",
            "RuntimeError: checkTimeout failed, see frame #1: below\n"),
    ], id="a_cpp_backtrace_frame_under_a_launchers_host_prefix_is_not_a_report"),
    pytest.param([
        _phase({"root.lineno": 3, "root.signature": "slurm.node_not_responding"},
            "sinfo.log",
            _SINFO_NOT_RESPONDING),
        _phase({},
            # a down node whose reason is "Not responding", without the suffix, is the same record
            "sinfo.log",
            "node07  1  gpu  down  64  2:16:2  512000  0  1  (null) Not responding\n"),
        _phase({"root.signature": "slurm.node_failure"},
            # the controller's own error, when the log has it, is the root
            "sinfo.log",
            _SINFO_NOT_RESPONDING + "[2016-06-09T22:21:02.017] error: Nodes compute001 not responding\n"),
    ], id="sinfos_rows_of_a_node_not_responding_are_named_and_give_way_to_the_controllers_error"),
    pytest.param([
        _phase({"root.lineno": 3, "root.signature": "slurm.job_end"},
            "slurmctld.log",
            _SLURMCTLD_WTERMSIG),
        _phase(None,
            # a clean exit is not a failure
            "slurmctld.log",
            _SLURMCTLD_WTERMSIG.replace("WTERMSIG 9", "WEXITSTATUS 0")),
        _phase({"root.source": "dmesg.log"},
            # the kernel's OOM kill on the node is why the job ended
            "slurmctld.log",
            _SLURMCTLD_WTERMSIG,
            "dmesg.log",
            "[3321.100] Out of memory: Killed process 4242 (python) total-vm:1kB, "
            "anon-rss:1kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:1kB\n"),
    ], id="slurmctlds_record_of_a_job_ended_by_a_signal_is_named_and_gives_way_to_its_cause"),
    pytest.param([
        _phase({"root.lineno": 2},
            # PyTorch's watchdog times a collective out and terminates the process (std::terminate: SIGABRT);
            # torchelastic then stops the other workers and reports the aborted one as "failed (exitcode: -6)" - the
            # abort seen from outside
            "job.log",
            "terminate called after throwing an instance of 'std::runtime_error'\n"
            "  what():  [Rank 7] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=806, OpType=BROADCAST, "
            "Timeout(ms)=1800000) ran for 1801027 milliseconds before timing out.\n"
            "WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 561635 closing signal SIGTERM\n"
            "WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 561636 closing signal SIGTERM\n"
            "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -6) local_rank: 7 (pid: 561642) of "
            "binary: /usr/bin/python\n"),
        _phase({"root.lineno": 1, "root.signature": "launcher.worker_aborted"},
            # alone, the launcher's report of the abort is still what the job shows
            "job.log",
            "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -6) local_rank: 7 (pid: 561642) of "
            "binary: /usr/bin/python\n"),
        _phase({"root.lineno": 2, "root_basis": "signature"},
            # a worker killed by another signal could log nothing: the launcher's report stays a root signature
            "job.log",
            "  what():  [Rank 7] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=806, OpType=BROADCAST, "
            "Timeout(ms)=1800000) ran for 1801027 milliseconds before timing out.\n"
            "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 3 (pid: 561638) of "
            "binary: /usr/bin/python\n"),
    ], id="the_watchdog_report_beats_the_launchers_report_of_the_sigabrt_it_ends_in"),
    pytest.param([
        _phase({"root.lineno": 4, "root.rank": 3, "root.attrs.failure": "out of memory"},
            "job.log",
            "[rank3]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:3763, unhandled cuda "
            "error (run with NCCL_DEBUG=INFO for details), NCCL version 2.28.8\n"
            "[rank3]: ncclUnhandledCudaError: Call to CUDA function failed.\n"
            "[rank3]: Last error:\n"
            "[rank3]: Cuda failure 2 'out of memory'\n"
            "[rank2]: Traceback (most recent call last):\n"),
        # the header's next non-empty line
        _phase({"root.lineno": 4},
            "job.log",
            "RuntimeError: the loader failed\nLast error:\n\nsomething else entirely\n"),
    ], id="nccl_last_error_under_the_wrapper_is_the_root"),
    pytest.param([
        # PyTorch prints NCCL's error class above "Last error:" and NCCL's own account under it; a report pasted with
        # its lines in reverse order puts the class right under the header, and NCCL's account, above the header, stays
        # the root. Any other line under the header is still the detail.
        _phase({"root.lineno": 1, "root.kind": "nccl.duplicate_gpu"},
            "job.log",
            _REVERSED_NCCL_REPORT),
        _phase({"root.lineno": 3},
            "job.log",
            _REVERSED_NCCL_REPORT.replace("ncclInvalidUsage: This usually reflects invalid usage of NCCL "
            "library.", "Cuda failure 2 'out of memory'")),
    ], id="the_nccl_error_class_under_the_header_of_a_reversed_paste_is_not_its_detail"),
    pytest.param([
        # The raylet's worker_died report (node_manager.cc "A worker died or was killed while executing a task by an
        # unexpected system error ...") comes before what the driver and Tune print about it: Ray's "Unhandled error
        # (suppress with RAY_IGNORE_UNHANDLED_ERRORS=1): ray::..." (worker.py _unhandled_error_handler) and Tune's
        # "Trial NAME: Error processing event." (trial_runner.py) relay an exception raised elsewhere, so the ERROR tag
        # on them does not make them the root.
        _phase({"root.lineno": 1, "root.signature": "ray.worker_died"},
            "driver.log",
            "2023-01-17 17:21:35,472\tWARNING worker.py:1829 -- A worker died or was killed while executing a task by "
            "an "
            "unexpected system error. To troubleshoot the problem, check the logs for the dead worker. RayTask ID: "
            "ffffffffffffffff686c Worker ID: 0c62b78d Node ID: 38300cef Worker IP address: 10.0.0.7 Worker port: 10016 "
            "Worker PID: 1942 Worker exit type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a "
            "connection error code 2. End of file.\n"
            "2023-01-17 17:21:35,509\tERROR trial_runner.py:980 -- Trial TorchTrainer_b13e7_00000: Error processing "
            "event.\n"
            "2023-01-17 17:21:35,511\tERROR worker.py:85 -- Unhandled error (suppress with "
            "'RAY_IGNORE_UNHANDLED_ERRORS=1'): ray::Trainer.train() (pid=8543, ip=10.0.0.7)\n"
            "ray.exceptions.RayActorError: The actor died unexpectedly before finishing this task.\n"),
        _phase({"root.lineno": 4},
            # the relay gives way to the exception its traceback ends in
            "driver.log",
            "2024-05-14 10:03:11,482\tERROR tune_controller.py:1331 -- Trial task failed for trial "
            "TorchTrainer_551a2_00000\n"
            "Traceback (most recent call last):\n"
            '  File "/home/user/train.py", line 12, in train_func\n'
            "torch.AcceleratorError: CUDA error: an illegal memory access was encountered\n"),
        _phase({"root.lineno": 3},
            # and gives way to the dead actor it reports, printed under it by the driver (verl's TaskRunner)
            "driver.log",
            "(TaskRunner pid=892962) Unhandled error (suppress with 'RAY_IGNORE_UNHANDLED_ERRORS=1'): "
            "ray::AsyncSglangServer.wake_up() (pid=913710, ip=100.96.31.18)\n"
            "(TaskRunner pid=892962)     ray.get(futures)\n"
            "(TaskRunner pid=892962) ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this "
            "task.\n"),
    ], id="rays_worker_died_report_outranks_the_driver_and_tune_relaying_it"),
    pytest.param([
        # A C++ failure signal handler reports the signal the process died of before its stack: glog's DumpSignalInfo
        # ("*** SIGSEGV (@0x0) received by PID N (TID 0x...) from PID 0; stack trace: ***"), the variant the TPU runtime
        # prints under JAX ("... received by PID N (TID N) on cpu 17; stack trace: ***"), Abseil's ("*** SIGSEGV
        # received at time=... on cpu 3 ***"). A backend-initialisation UserWarning before it is not the failure; a
        # SIGABRT report follows an error the process reported first, so it is not taken as a root.
        _phase({"root.lineno": 3, "root.signature": "process.failure_signal_report"},
            "host0.log",
            "/home/user/.local/lib/python3.8/site-packages/jax/_src/lib/xla_bridge.py:184: UserWarning: TPU backend "
            "initialization is taking more than 60.0 seconds. Did you run your code on all TPU hosts?\n"
            "  warnings.warn(\n"
            "*** SIGSEGV (@(nil)), see go/stacktraces#s15 received by PID 11743 (TID 12350) on cpu 17; stack trace: "
            "***\n"
            "PC: @     0x7facba4a8de2  (unknown)  (unknown)\n"
            "    @     0x7facbd838294        976  (unknown)\n"),
        _phase({"root.lineno": 2},
            "host0.log",
            "*** Aborted at 1566142545 (unix time) try \"date -d @1566142545\" if you are using GNU date ***\n"
            "*** SIGSEGV (@0x0) received by PID 3371 (TID 0x7f450a559740) from PID 0; stack trace: ***\n"),
        _phase({"root.signature": "process.failure_signal_report"},
            "host0.log",
            "*** SIGBUS received at time=1670000000 on cpu 3 ***\n"),
        _phase({"root.lineno": 1},
            "host0.log",
            "F0507 08:50:25.221193 1769711 tpu_client.cc:88] Check failed: device != nullptr\n"
            "*** SIGABRT (@0x3e800000861) received by PID 2145 (TID 0x7fa14c0a6740) from PID 2145; stack trace: ***\n"),
    ], id="a_failure_signal_handlers_report_is_the_root_over_the_warnings_before_it"),
    pytest.param([
        # InternLM's entry point logs what main() raised at ERROR - logger.error(f"Raise exception from {hostname} with
        # rank id: {rank}\n{traceback}") - after the failure itself was printed: the watchdog's timeout before it is the
        # root, not the relay's ERROR tag.
        _phase({"root.lineno": 1},
            "rank0.log",
            "[E ProcessGroupNCCL.cpp:821] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=316, "
            "OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1803457 milliseconds before timing out.\n"
            "terminate called after throwing an instance of 'std::runtime_error'\n"
            "2023-09-07 09:14:40,098 ERROR train.py:308 in <module> -- Raise exception from f363ff97a009 with rank id: "
            "3\n"
            "Traceback (most recent call last):\n"
            '  File "/home/user/InternLM/train.py", line 306, in <module>\n'),
        _phase({"root.lineno": 4},
            # the relay still gives way to the exception its traceback ends in
            "rank0.log",
            "2024-01-02 10:00:00,000 ERROR train.py:308 in <module> -- Raise exception from node7 with rank id: 12\n"
            "Traceback (most recent call last):\n"
            '  File "/home/user/InternLM/train.py", line 306, in <module>\n'
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"),
    ], id="internlms_exception_relay_gives_way_to_the_timeout_it_reports"),
    pytest.param([
        # torch re-raises a DataLoader worker's (or a DataParallel replica's) exception in the main process as "Caught
        # {type} {where}." with "Original Traceback (most recent call last):" and the original's traceback under it
        # (torch/_utils.py ExceptionWrapper.reraise): the original exception's line is the failure, the first line its
        # relay; with nothing under it the relay is still the failure seen.
        _phase({"root.lineno": 7},
            "job.log",
            "Traceback (most recent call last):\n"
            '  File "/home/user/verl/verl/trainer/fsdp_sft_trainer.py", line 721, in fit\n'
            "ValueError: Caught ValueError in DataLoader worker process 0.\n"
            "Original Traceback (most recent call last):\n"
            '  File "/usr/lib/python3.10/site-packages/torch/utils/data/_utils/worker.py", line 242, in _worker_loop\n'
            '  File "/usr/lib/python3.10/site-packages/transformers/tokenization_utils_base.py", line 1665, in '
            "apply_chat_template\n"
            "ValueError: Tools should either be a JSON schema, or a callable function with type hints and a docstring "
            "suitable for auto-conversion to a schema.\n"),
        _phase({"root.lineno": 1},
            "job.log",
            "fsspec.exceptions.FSTimeoutError: Caught FSTimeoutError in DataLoader worker process 1.\n"),
    ], id="torchs_exception_wrapper_relay_gives_way_to_the_original_exception"),
    pytest.param([
        # An actor whose __init__ raised: the worker logs "Exception raised in creation task: The actor died because of
        # an error raised in its creation task, ray::..." with the traceback under the Ray prefix, and the driver raises
        # ActorDiedError with the same words, ending with the original exception (python/ray/exceptions.py): that
        # exception is the failure, not the relay that heads it.
        _phase({"root.lineno": 6},
            "driver.log",
            "(WorkerDict pid=136980) Exception raised in creation task: The actor died because of an error raised in "
            "its "
            "creation task, ray::WorkerDict.__init__() (pid=136980, ip=192.168.100.8)\n"
            "Traceback (most recent call last):\n"
            '  File "/workspace/verl/verl/trainer/main_ppo.py", line 40, in main\n'
            "ray.exceptions.ActorDiedError: The actor died because of an error raised in its creation task, "
            "ray::WorkerDict.__init__() (pid=136980, ip=192.168.100.8, actor_id=802ec5a7e3e04c21babf95d701000000)\n"
            '  File "/usr/local/lib/python3.10/dist-packages/torch/distributed/device_mesh.py", line 530, in '
            "_init_process_groups\n"
            "RuntimeError: cannot reshape tensor of 0 elements into shape [-1, 0] because the unspecified dimension "
            "size -1 can be any value and is ambiguous\n"),
    ], id="rays_actor_died_in_its_creation_task_gives_way_to_the_exception_it_carries"),
    pytest.param([
        # The driver finds the actor it calls unreachable (ray.exceptions.ActorUnavailableError "The actor ID is
        # unavailable: ... Socket closed", wrapped in the task's RayTaskError); the raylet's report that a worker died,
        # printed after it, is the account of what happened to the actor.
        _phase({"root.lineno": 9},
            "driver.log",
            "Error executing job with overrides: ['algorithm.adv_estimator=grpo']\n"
            "Traceback (most recent call last):\n"
            '  File "/home/user/verl/verl/trainer/main_ppo.py", line 100, in run_ppo\n'
            "ray.exceptions.RayTaskError(ActorUnavailableError): ray::TaskRunner.run() (pid=625502, ip=192.168.77.17)\n"
            '  File "/home/user/verl/verl/single_controller/ray/base.py", line 55, in __call__\n'
            "ray.exceptions.ActorUnavailableError: The actor d5a12869ca846683c2e9884001000000 is unavailable: The "
            "actor "
            "is temporarily unavailable: RpcError: RPC error: Socket closed rpc_code: 14. The task may or may not have "
            "been executed on the actor.\n"
            "\n"
            "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.\n"
            "(raylet) A worker died or was killed while executing a task by an unexpected system error. To "
            "troubleshoot "
            "the problem, check the logs for the dead worker. Lease ID: 01000000c0358f8f\n"),
    ], id="rays_actor_unavailable_gives_way_to_the_raylets_report_of_the_dead_worker"),
    pytest.param([
        # The Prismatic / OpenVLA mixture skips a dataset whose config raised (materialize.py "Skipping `NAME` due to
        # Error: ...", wrapped by rich's console after "due"), loads 0 datasets and fails computing the mixture's
        # length: the skip is the failure, not the IndexError.
        _phase({"root.lineno": 1},
            "job.log",
            "08/21 [01:46:27] WARNING  | >> [*] Skipping `aloha_game` due  materialize.py:135\n"
            "                          to Error: Cannot load `aloha_game`;\n"
            "                          only EEF_POS & EEF_R6 &\n"
            "# Loading the following 0 datasets (incl. sampling weight):                         #\n"
            "Traceback (most recent call last):\n"
            '  File "/home/user/openvla-oft/prismatic/vla/datasets/rlds/dataset.py", line 522, in '
            "make_interleaved_dataset\n"
            "IndexError: arrays used as indices must be of integer (or boolean) type\n"),
    ], id="a_skipped_dataset_is_named_over_the_empty_mixture_failing_after_it"),
    pytest.param([
        _phase({"root.lineno": 1, "root.signature": "slurm.daemon_fatal"},
            # slurmd exits on a configuration it cannot use (log.c fatal()): the one line journald kept is the failure
            "journal.log",
            "Feb 20 18:59:13 node2.example slurmd[57977]: fatal: gres.conf duplicate records for gpu\n"),
    ], id="a_slurm_daemon_s_fatal_in_the_journal_is_the_root"),
    pytest.param([
        _phase({"root.lineno": 4},
            # pyxis_slurmstepd.c: an enroot command failed; pyxis reports it, prints enroot's log ("pyxis:     <line>"),
            # then gives up on the container, and Slurm's SPANK layer and srun relay the plugin's failure
            "job.log",
            "pyxis: importing docker image ...\n"
            "slurmstepd: error: pyxis: container start failed with error code: 1\n"
            "slurmstepd: error: pyxis: printing contents of log file ...\n"
            "slurmstepd: error: pyxis:     enroot-switchroot: failed to execute: /bin/bash: No such file or directory\n"
            "slurmstepd: error: pyxis: couldn't start container\n"
            "slurmstepd: error: spank: required plugin spank_pyxis.so: task_init() failed with rc=-1\n"
            "slurmstepd: error: Failed to invoke spank plugin stack\n"
            "srun: error: node-2: task 1: Exited with exit code 1\n"),
    ], id="the_enroot_line_pyxis_relays_is_the_root_not_pyxis_s_report_around_it"),
    pytest.param([
        _phase({"root.lineno": 3, "root.signature": "slurm.oom_kill"},
            # the count is printed when the step ends, after the parent's report of its killed worker
            "job.log",
            '  File "/usr/lib/python3/site-packages/ray/tune/tune.py", line 272, in run\n'
            "ray.tune.error.TuneError: ('Trials did not complete', [seed:5591])\n"
            "slurmstepd: error: Detected 8 oom-kill event(s) in step 59137890.batch cgroup. Some of your processes may "
            "have been killed by the cgroup out-of-memory handler.\n"),
        _phase({"root.lineno": 1},
            # an exception that names a fault itself keeps its place
            "job.log",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
            "slurmstepd: error: Detected 1 oom_kill event in StepId=7.0. Some of the step tasks have been OOM "
            "Killed.\n"),
    ], id="slurmstepd_s_oom_kill_count_at_the_step_s_end_is_the_root_of_the_exception_before_it"),
    pytest.param([
        _phase({"root.lineno": 2},
            "job.log",
            "[cuda-24-0.local:08642] 2 more processes have sent help message help-mpi-btl-openib.txt / no active "
            "ports\n"
            "slurmstepd: Job 1171978 exceeded memory limit (18202456 > 16384000), being killed\n"
            "slurmstepd: *** JOB 1171978 ON cuda-24-0 CANCELLED AT 2018-10-16T13:24:27 ***\n"
            "slurmstepd: Exceeded step memory limit at some point.\n"),
    ], id="slurms_kill_over_the_memory_limit_is_the_root_not_its_summary_at_the_step_s_end"),
    pytest.param([
        _phase({"root.lineno": 2, "root.signature": "slurm.address_unresolved"},
            "job.log",
            "srun: job 6 has been allocated resources\n"
            "srun: error: fwd_tree_thread: can't find address for host ip-172-31-94-221, check slurm.conf\n"
            "srun: error: Task launch for 6.0 failed on node ip-172-31-94-221: Can't find an address, check "
            "slurm.conf\n"
            "srun: error: Application launch failed: Can't find an address, check slurm.conf\n"),
    ], id="an_unresolvable_node_address_is_the_root_of_srun_s_launch_failure"),
    pytest.param([
        _phase({"root.source": "clustermgtd.log", "root.lineno": 2},
            "job.log",
            "srun: error: Node failure on q-dy-c-4\n"
            "srun: error: Nodes q-dy-c-4 are still not ready\n"
            "srun: error: Something is wrong with the boot of the nodes.\n",
            "clustermgtd.log",
            "2025-04-05 13:53:24,125 - [slurm_plugin.clustermgtd:_maintain_nodes] - INFO - Performing node "
            "maintenance\n"
            "2025-04-05 13:53:24,127 - [slurm_plugin.slurm_resources:is_backing_instance_valid] - WARNING - Node state "
            "check: no corresponding instance in EC2 for node q-dy-c-4(10.6.11.250), node state: ALLOCATED+CLOUD\n"),
    ], id="a_cloud_node_with_no_instance_is_the_root_of_srun_s_node_failure"),
    pytest.param([
        _phase({"root.lineno": 1, "root.signature": "kernel.megaraid_reset"},
            "journal.log",
            "Dec 03 20:30:06 n13 kernel: megaraid_sas 0000:5a:00.0: [30]waiting for 65 commands to complete for scsi0\n"
            "Dec 03 20:30:12 n13 kubelet[206517]: I1203 20:30:12.198232  206517 container_manager_linux.go:428] "
            "[ContainerManager]: Discovered runtime cgroups name: /system.slice/docker.service\n"),
        _phase({"root.signature": "slurm.resume_timeout"},
            "journal.log",
            None,
            "slurmctld.log",
            "[2023-12-05T23:59:28.620] node q-dy-1 not resumed by ResumeTimeout(1800) - marking down and power_save\n"),
    ], id="a_raid_controller_reset_and_a_node_not_resumed_are_roots"),
    pytest.param([
        _phase({"root.lineno": 1, "root.signature": "efa.cq_error"},
            "job.log",
            _EFA_CQ_ERROR + "ip-172-31-69-127:451707:453373 [4] NCCL INFO Channel 00/0 : 0[4] -> 8[4] [send] via "
                            "NET/AWS "
            "Libfabric/4/GDRDMA\n"),
        _phase({"root.source": "peer.log"},
            # status 9 (bad queue pair) is the peer gone: the peer's own error, in its log, is the root
            "job.log",
            _EFA_CQ_ERROR.replace("Invalid address", "Bad queue pair").replace("(7)", "(9)"),
            "peer.log",
            "RuntimeError: CUDA error: an illegal memory access was encountered\n"),
    ], id="the_efa_provider_s_completion_error_is_the_root_unless_the_peer_is_gone"),
    pytest.param([
        _phase({"root.lineno": 3, "root.signature": "nccl.watchdog_timeout"},
            # WorkNCCL::handleException's two lines name no collective and are flushed before the watchdog's own report
            "train.log",
            "[rank3]:[E901 05:20:03.614679108 ProcessGroupNCCL.cpp:684] [Rank 3] Some NCCL operations have failed or "
            "timed "
            "out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on "
            "corrupted/incomplete data.\n"
            "[rank3]:[E901 05:20:03.614723891 ProcessGroupNCCL.cpp:698] [Rank 3] To avoid data inconsistency, we are "
            "taking the entire process down.\n"
            "[rank3]:[E901 05:20:03.616086576 ProcessGroupNCCL.cpp:1899] [PG ID 0 PG GUID 0(default_pg) Rank 3] "
            "Process "
            "group watchdog thread terminated with exception: [Rank 3] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=460631, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600004 "
            "milliseconds before timing out.\n"),
        _phase({"root.signature": "nccl.watchdog_take_down"},
            # alone, the take-down is still named rather than nothing
            "train.log",
            "[rank1]:[E ProcessGroupNCCL.cpp:543] To avoid data inconsistency, we are taking the entire process "
            "down.\n"),
    ], id="processgroupnccl_s_take_down_printed_first_gives_way_to_the_watchdog_s_report"),
    pytest.param([
        _phase({"root.lineno": 2, "root.signature": "cuda.system_not_ready"},
            # gpu_burn: the first worker's CUDA 802, then the next workers' own CUDA errors
            "gpu_burn.log",
            "terminate called after throwing an instance of 'std::runtime_error'\n"
            "  what():  Error (gpu_burn-drv.cpp:298): system not yet initialized\n"
            "terminate called after throwing an instance of 'std::runtime_error'\n"
            "  what():  Error (gpu_burn-drv.cpp:298): OS call failed or operation not supported on this OS\n"),
    ], id="wording_right_below_cuda_802_relays_it"),
    pytest.param([
        # Volcano's job controller logs the pod event it is about to handle (job_controller.go processNextReq: "Try to
        # handle request <%v>", apis.Request.String "... Pod:P, Event:PodEvicted, ExitCode:0, ...") before the policy's
        # action ("Start to execute action RestartTask") and the kills: the request for the pod's end is the first
        # account of the failure in that log. A resync request (Event:OutOfSync) says nothing is wrong.
        _phase({"root.lineno": 2, "root.signature": "controller.replica_failed"},
            "vc-controller.log",
            _VOLCANO_REQUEST.format(100, 0, "OutOfSync", 0) + "\n"
            + _VOLCANO_REQUEST.format(200, 1, "PodEvicted", 0) + "\n"
            "I0601 10:00:00.000300       1 job_controller.go:385] Execute <RestartTask> on Job <default/llama> in "
            "<Running> by <*state.runningState>.\n"
            "I0601 10:00:00.000400       1 job_controller_actions.go:69] Killing task <worker> of Job <default/llama>, "
            "current version 0\n"
            'I0601 10:00:00.000500       1 event.go:377] Event(v1.ObjectReference{Kind:"Job", Namespace:"default", '
            "Name:\"llama\"}): type: 'Normal' reason: 'ExecuteAction' Start to execute action RestartTask\n"),
    ], id="volcano_job_controller_request_for_an_evicted_pod_is_named_before_the_action_it_starts"),
    pytest.param([
        # UCX's CUDA transports log a failed driver call (cuda_iface.h UCT_CUDADRV_FUNC before 1.10: "%s is failed.
        # ret:%s", the call stringified with its arguments; cuda_util.h UCT_CUDADRV_LOG since: "%s failed: %s"); the
        # rkey unpack failure and the segmentation fault UCX's own signal handler reports next in the same process
        # follow from it, as under srun -l with PyTorch's MPI backend broadcasting a CUDA tensor.
        _phase({"root.lineno": 2, "root.signature": "ucx.cuda_call_failed"},
            "slurm-405737.out",
            _UCX_CGPU12.format(71) + "   cuda_ipc_md.c:62   UCX  DEBUG mpool ucp_rkeys: allocated chunk\n"
            + _UCX_CGPU12.format(71) + "   cuda_ipc_md.c:62   UCX  ERROR cuCtxGetDevice(&cu_device) is failed. "
                                       "ret:invalid device "
            "context\n"
            + _UCX_CGPU12.format(89) + "      ucp_rkey.c:250  UCX  ERROR Failed to unpack remote key from remote "
                                       "md[4]: "
            "Input/output error\n"
            "0: [cgpu12:56309:2:56362] Caught signal 11 (Segmentation fault: address not mapped to object at address "
            "0x20)\n"
            "0: ==== backtrace ====\n"
            "0:     2  /usr/lib/ucx/libuct.so.0(uct_rkey_release+0xe) [0x2aab2393f51e]\n"
            "0: ===================\n"
            "srun: error: cgpu12: task 0: Segmentation fault\n"
            "0: slurmstepd: error: *** STEP 405737.0 ON cgpu12 CANCELLED AT 2020-01-16T23:05:49 ***\n"),
    ], id="ucx_cuda_call_failure_is_named_before_the_segfault_ucx_reports_after_it"),
    pytest.param([
        # A long run of '=' or '-' is a separator and skipped, but a process's report glued right after one (mpirun's
        # tagged output flushed without a newline) is read: here it is the job's only failure.
        _phase({"root.lineno": 2, "root.signature": "ucx.ib_completion_error", "root.attrs.error": "Remote QP"},
            "mpirun.out",
            "Tue Mar  2 10:11:12 2021[1,7]<stdout>:# Size       Avg Latency(us)\n"
            " ==========================================Tue Mar  2 10:11:14 2021[1,7]<stderr>:[node12:7731:0:7731] "
            "ib_mlx5_log.c:170  Remote QP on mlx5_0:1/IB (synd 0x13 vend 0x89 hw_synd 0/0)\n"
            "Tue Mar  2 10:11:14 2021[1,7]<stderr>:==== backtrace (tid:   7731) ====\n"),
    ], id="output_glued_to_a_separator_is_read_as_a_line"),
    pytest.param([
        # NCCL warns as a call fails, then returns the code its caller reports by name only (nccl-tests' "NCCL failure
        # common.cu:N 'unhandled system error'"): the WARN above names what failed, even one that reads as a dropped
        # peer.
        _phase({"root.lineno": 4},
            "all_reduce_perf.out",
            "# nThread 1 nGpus 1 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20\n"
            "node7:4410:4431 [0] NCCL INFO Channel 00 : 0[0] -> 1[0] [send] via NET/Socket/0\n"
            "\n"
            "node7:4410:4431 [0] include/socket.h:385 NCCL WARN Net : Connection closed by remote peer\n"
            "NCCL failure common.cu:892 'unhandled system error'\n"),
    ], id="nccls_warn_above_a_bare_error_code_report_is_the_root"),
    pytest.param([
        # ProcessGroupNCCL's take-down over a timed-out collective, wrapped by a terminal mid-word, is still the take-
        # down; the watchdog's own report in its older wording ("NCCL watchdog thread terminated with exception") is
        # what names the failure.
        _phase({"root.lineno": 5},
            "train.log",
            "[rank1]:[E ProcessGroupNCCL.cpp:537] Some NCCL operations have failed or timed out. Due to the asynchr\n"
            "onous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.\n"
            "[rank1]:[E ProcessGroupNCCL.cpp:543] To avoid data inconsistency, we are taking the entire proc\n"
            "ess down.\n"
            "[rank1]:[E ProcessGroupNCCL.cpp:1182] [Rank 1] NCCL watchdog thread terminated with exception: [Rank 1\n"
            "] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=3, OpType=BROADCAST, NumelIn=64, Numel\n"
            "Out=64, Timeout(ms)=600000) ran for 600412 milliseconds before timing out.\n"),
    ], id="a_wrapped_take_down_gives_way_to_the_watchdogs_report"),
    pytest.param([
        # torch.cuda.nccl reports a failed NCCL call by code and ncclGetErrorString (torch/csrc/cuda/nccl.cpp
        # throw_nccl_error: "NCCL Error 5: invalid usage", older NCCL's strings carrying no "(run with NCCL_DEBUG=WARN")
        # hint): an NCCL error, named over a Ray actor's death relayed in prose above it.
        _phase({"root.lineno": 4, "root.signature": "nccl.internal_error"},
            "driver.log",
            "it returns an error: the actor is dead because its worker process has died. Worker exit type: "
            "SYSTEM_ERROR\n"
            "The actor never ran - it was cancelled before it started running.\n"
            "\n"
            "Unhandled exception: St13runtime_error. what(): NCCL Error 5: invalid usage\n"),
    ], id="pytorchs_nccl_error_code_report_is_an_nccl_error"),
    pytest.param([
        # pytest --tb=native prints Python's own traceback under the "____ test ____" banner, no "E" lines: it is read
        # as it is and its exception line named (before: every line of the section was skipped and the short summary's
        # cut line named).
        _phase({"root.lineno": 7},
            "job.log",
            "============================= test session starts ==============================\n"
            "=================================== FAILURES ===================================\n"
            "_________________________________ test_step ____________________________________\n"
            "Traceback (most recent call last):\n"
            '  File "/src/tests/test_train.py", line 12, in test_step\n'
            "    model.step(batch)\n"
            "RuntimeError: CUDA error: an illegal memory access was encountered\n"
            "=========================== short test summary info ============================\n"
            "FAILED tests/test_train.py::test_step - RuntimeError: CUDA error: an illegal...\n"
            "========================= 1 failed, 1 passed in 3.21s ==========================\n"),
    ], id="pytest_native_tracebacks_under_a_failure_banner_are_read"),
])
def test_triage_names_the_root_of_a_job_s_logs(
    tmp_path: Path, phases: list[tuple[dict[str, str | None], dict[str, object] | None]],
) -> None:
    for files, root in phases:
        for name, text in files.items():
            if text is None:
                (tmp_path / name).unlink()
            else:
                (tmp_path / name).write_text(text)
        result = triage(tmp_path)
        if root is None:
            assert result.root is None
        else:
            assert result.root is not None and {path: _field(result, path) for path in root} == root


def test_nccl_s_warn_below_a_bare_wrapper_names_the_failure(tmp_path: Path) -> None:
    # one worker's wrapper only names the error class; NCCL's WARN from the job a few lines below names the call
    lines = ["(pid=11) RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:784, unhandled cuda error, NCCL version 2.7.8",
             "(pid=12) h:12:40 [0] NCCL INFO Channel 00 : 0[2d000] -> 1[2e000] via P2P/IPC",
             "(pid=12) h:12:40 [0] transport/p2p.cc:238 NCCL WARN failed to open CUDA IPC handle : 217 peer access "
             "is not supported between these two devices",
             "(pid=12) h:12:40 [0] NCCL INFO transport.cc:68 -> 1"]
    (tmp_path / "job.log").write_text("\n".join(lines) + "\n")
    result = triage(tmp_path)
    assert result.root is not None and result.root.lineno == 3
    # a wrapper that names the failure itself stays the root
    lines[0] = "RuntimeError: CUDA error: an illegal memory access was encountered"
    (tmp_path / "job.log").write_text("\n".join(lines) + "\n")
    result = triage(tmp_path)
    assert result.root is not None and result.root.lineno == 1


def test_a_dataloader_worker_s_last_words_before_the_parent_s_traceback_are_the_root(tmp_path: Path) -> None:
    lines = ["step 40 loss 2.31",
             "free(): invalid pointer, worker failed to allocate",
             "Traceback (most recent call last):",
             '  File "/usr/lib/python3.11/site-packages/torch/utils/data/_utils/signal_handling.py", line 67, '
             'in handler',
             "    _error_if_any_worker_fails()",
             "RuntimeError: DataLoader worker (pid 69916) is killed by signal: Aborted."]
    (tmp_path / "rank_4.log").write_text("\n".join(lines) + "\n")
    result = triage(tmp_path)
    assert result.root is not None and result.root.lineno == 2
    # no words of its own before the traceback: the parent's report stays the root
    lines[1] = "step 41 loss 2.30"
    (tmp_path / "rank_4.log").write_text("\n".join(lines) + "\n")
    result = triage(tmp_path)
    assert result.root is not None and result.root.lineno == 6 and result.root.signature == "torch.dataloader_killed"


def test_bad_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(VigilInputError, match="does not exist"):
        triage(tmp_path / "missing")
    (tmp_path / "model.bin").write_bytes(b"\x00")
    with pytest.raises(VigilInputError, match="no log files"):
        triage(tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "world", "culprit"), [("exception", 3, 1), ("kill", 2, 0)])
def test_real_gloo_job_crash(tmp_path: Path, mode: str, world: int, culprit: int) -> None:
    job = run_failed_job(tmp_path / mode, world=world, mode=mode, culprit=culprit)
    assert job.returncode != 0
    label = root_label(job)
    result = triage(job.directory)
    assert result.root is not None, result.summary
    assert label.accepts(result.root.source, result.root.lineno)
    assert result.root.rank == culprit
    # each healthy rank's own error is cascade; one the launcher terminated before it saw the peer go has none
    cascade = {e.rank for e in result.cascade}
    for rank in set(range(world)) - {culprit}:
        if logged_an_error(job, rank):
            assert rank in cascade, result.summary
        else:
            assert rank in terminated_by_launcher(job), f"rank {rank} logged no error and was not terminated"


@settings(max_examples=30, deadline=None)
@given(st.lists(st.binary(max_size=3000), min_size=1, max_size=3))
def test_hostile_files_never_crash_triage(tmp_path_factory: pytest.TempPathFactory, blobs: list[bytes]) -> None:
    job = tmp_path_factory.mktemp("hostile")
    for rank, blob in enumerate(blobs):
        (job / f"rank_{rank}.log").write_bytes(blob + b"\nRuntimeError: CUDA error: out of memory\xff\n")
    result = triage(job)
    assert result.root is not None and result.root.fault_type == "gpu_oom"
    assert result.files == len(blobs)


def test_pids_are_matched_per_host(tmp_path: Path) -> None:
    # Two ranks on two hosts share a pid; the OOM killer on n001 killed the rank on n001.
    for node, rank in (("n000", 0), ("n001", 1)):
        (tmp_path / node).mkdir()
        (tmp_path / node / f"rank_{rank}.log").write_text(
            f"2026-03-01 10:00:00,000 INFO start\n{node}:5000:5000 [0] NCCL INFO Init COMPLETE\n")
        (tmp_path / node / "dmesg.log").write_text("2026-03-01T09:00:00,000000+00:00 NVRM: loading module\n")
    (tmp_path / "n001" / "dmesg.log").write_text(
        "2026-03-01T10:00:09,000000+00:00 Out of memory: Killed process 5000 (python) total-vm:1kB\n")
    with (tmp_path / "n000" / "rank_0.log").open("a") as healthy:
        healthy.write("2026-03-01 10:00:10,000 ERROR NCCL error: remote process exited or there was a network error\n")
    result = triage(tmp_path)
    assert result.root is not None and result.root.fault_type == "host_oom"
    assert (result.root.node, result.root.rank) == ("n001", 1)


def test_own_error_beats_the_launcher_report_of_the_abort_after_it(tmp_path: Path) -> None:
    # The rank raises, aborts while tearing down (SIGABRT), and torchrun reports a signal death.
    rank_dir = tmp_path / "torchrun" / "none_x" / "attempt_0" / "0"
    rank_dir.mkdir(parents=True)
    (rank_dir / "stderr.log").write_text(
        "2026-11-30 17:00:30,900 INFO train: step 2 loss 0.94\n"
        "[rank0]: Traceback (most recent call last):\n"
        '[rank0]:   File "/work/train.py", line 9, in main\n'
        "[rank0]: ValueError: batch 3 has 0 samples\n"
        "[W1130 17:00:32.600000 77 ProcessGroupGloo.cpp:1] Warning: destroy_process_group() was not called\n"
        "Fatal Python error: Aborted\n")
    (tmp_path / "launcher.log").write_text(
        "E1130 17:00:32.700000 70 api.py:1002] failed (exitcode: -6) local_rank: 0 (pid: 71) of binary: python\n")
    result = triage(tmp_path)
    assert result.root is not None
    assert (result.root.kind, result.root.lineno, result.root.rank) == ("python.exception", 4, 0)


def test_another_ranks_line_after_an_empty_last_error_is_not_its_detail(tmp_path: Path) -> None:
    """ncclGetLastError had nothing, so the report ends with its header; the next rank's watchdog timeout printed
    after it in the job-wide log is that rank's own report, not the detail of rank 3's internal error."""
    job = tmp_path / "job"
    job.mkdir()
    (job / "job.log").write_text(
        "[rank3]: ncclInternalError: Internal check failed.\n"
        "[rank3]: Last error:\n"
        "\n"
        "[rank2]:[E1101 15:32:04.276254351 ProcessGroupNCCL.cpp:616] [Rank 2] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=1, OpType=COALESCED, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600073 "
        "milliseconds before timing out.\n")
    result = triage(job, workers=1)
    assert result.root is not None and (result.root.lineno, result.root.rank) == (1, 3), result.summary
    (job / "job.log").write_text(job.joinpath("job.log").read_text().replace("[rank2]:[E1101", "[rank3]:[E1101"))
    result = triage(job, workers=1)
    assert result.root is not None and result.root.lineno == 4  # the same rank's next line is still the detail


def test_an_nccl_ras_report_names_its_finding_not_its_headings(tmp_path: Path) -> None:
    """ncclras prints its table's "Status  Errors" columns and its "Errors" / "Warnings" headings even when nothing is
    under them; with no error of a process in view, the mismatch it found is named."""
    (tmp_path / "ras.log").write_text(
        "Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors\n"
        "    #  in group  per comm  per node  per comm  in group\n"
        "    0         1         4         8        32        32   RUNNING  MISMATCH\n\n"
        "Errors\n======\n\nWarnings\n========\n\n"
        "#0-0 (fa93daea854b060b) MISMATCH\n"
        "  Communicator ranks have different AllGather operation counts\n"
        "  30 ranks have launched up to operation 640\n")
    result = triage(tmp_path, workers=1)
    assert result.root is not None and result.root.lineno == 12, result.summary
    assert result.root.kind == "nccl.ras_inconsistent_communicator" and result.root.attrs["collective"] == "AllGather"
    (tmp_path / "train.log").write_text(
        "[rank12]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    result = triage(tmp_path, workers=1)
    assert result.root is not None and result.root.source == "train.log"  # a process's own error outranks it


def test_the_driver_containers_nvswitch_probe_is_not_the_root(tmp_path: Path) -> None:
    """The GPU driver container's script lists /proc/driver/nvidia-nvswitch/devices/* to learn whether the node has
    NVSwitches (_assert_nvswitch_system); on a node without them ls prints its complaint and the script goes on, so
    the failure after it - containerd's socket refused - is the one named."""
    prefix = "nvidia-driver-daemonset-c78b4 nvidia-driver-ctr "
    (tmp_path / "driver.log").write_text(
        f"{prefix}Starting NVIDIA persistence daemon...\n"
        f"{prefix}ls: cannot access '/proc/driver/nvidia-nvswitch/devices/*': No such file or directory\n"
        f"{prefix}Mounting NVIDIA driver rootfs...\n"
        f"{prefix}Done, now waiting for signal\n"
        f"{prefix}rpc error: code = Unavailable desc = connection error: desc = \"transport: Error while dialing dial "
        "unix /var/run/containerd/containerd.sock: connect: connection refused\"\n")
    result = triage(tmp_path, workers=1)
    assert result.root is not None and result.root.lineno == 5, result.summary
    assert strength(f"{prefix}ls: cannot access '/proc/driver/nvidia-nvswitch/devices/*': No such file") == 0
    assert strength("ls: cannot access '/data/run/*': No such file or directory") > 0  # another path still does


def test_the_interpreter_not_finding_its_script_is_the_root_under_a_host_prefix(tmp_path: Path) -> None:
    """CPython's pymain_run_file_obj prints "%S: can't open file %R: [Errno %d] %s" and exits 2 when the script a
    launcher started is missing on that node; pdsh prefixes each node's output with its host. The launcher's INFO
    lines before it name no failure, and every local rank repeats it."""
    (tmp_path / "launch.log").write_text(
        "10.141.113.189: [2021-01-26 18:10:28,114] [INFO] [launch.py:100:main] dist_world_size=32\n"
        "10.141.113.189: [2021-01-26 18:10:28,114] [INFO] [launch.py:102:main] Setting CUDA_VISIBLE_DEVICES=0,1,2,3\n"
        "10.141.250.227: /usr/bin/python3: can't open file 'train_mpu.py': [Errno 2] No such file or directory\n"
        "10.141.113.189: /usr/bin/python3: can't open file 'train_mpu.py': [Errno 2] No such file or directory\n")
    result = triage(tmp_path, workers=1)
    assert result.root is not None and result.root.lineno == 3, result.summary
    assert result.root.signature == "python.script_not_opened"
    (tmp_path / "launch.log").write_text("python3: 'src' is a directory, cannot continue\n")
    assert triage(tmp_path, workers=1).root.signature == "python.script_not_opened"  # type: ignore[union-attr]
    # prose that merely says so is not the interpreter's report
    (tmp_path / "launch.log").write_text("note: the viewer can't open file previews larger than 10 MB\n")
    result = triage(tmp_path, workers=1)
    assert result.root is None or result.root.signature != "python.script_not_opened"


def test_a_sigterm_reaching_lightning_is_named_over_the_dataloader_workers_it_ends(tmp_path: Path) -> None:
    """Lightning notes the SIGTERM its process got ("[rank: 2] Received SIGTERM: 15", glued here to the progress bar);
    the same signal ends the DataLoader workers ("... is killed by signal: Terminated.", raised twice as the trainer
    tears down): the note is the first sign of the stop and is named. A DataLoader worker ended by SIGTERM alone is
    still the failure seen, and the scheduler's cancellation, when in view, outranks both."""
    bar = "Epoch 0:  31%|###       | 1225/3999 [1:07:35<2:33:02,  3.31s/it, v_num=29, train_total_loss=0.375]"
    lines = [bar, bar + "[rank: 2] Received SIGTERM: 15", "Traceback (most recent call last):",
             '  File "/home/user/QcNet/train_qcnet.py", line 48, in <module>',
             "RuntimeError: DataLoader worker (pid 4020138) is killed by signal: Terminated. ", "",
             "During handling of the above exception, another exception occurred:", "",
             "Traceback (most recent call last):",
             "RuntimeError: DataLoader worker (pid 4020404) is killed by signal: Terminated. "]
    (tmp_path / "job.log").write_text("\n".join(lines) + "\n")
    result = triage(tmp_path, workers=1)
    assert result.root is not None and result.root.lineno == 2, result.summary
    (tmp_path / "job.log").write_text("\n".join(lines[2:]) + "\n")
    result = triage(tmp_path, workers=1)
    assert result.root is not None and result.root.lineno == 3, result.summary
    (tmp_path / "job.log").write_text("\n".join(lines) + "\nslurmstepd: error: *** JOB 4242 ON gpu-07 CANCELLED AT "
                                      "2025-06-01T10:00:00 DUE TO PREEMPTION ***\n")
    result = triage(tmp_path, workers=1)
    assert result.root is not None and result.root.lineno == 11, result.summary


def test_the_training_operators_replica_tally_is_not_an_error(tmp_path: Path) -> None:
    """The Kubeflow training operator logs a replica tally at every reconcile (pytorchjob_controller.go UpdateJobStatus
    "PyTorchJob=NAME, ReplicaType=Master expected=1, running=0, succeeded=0, failed=1, Replicas=1"), failed=0 or not:
    the pod's exit, its container's Error event (common/pod.go "Error pod POD container NAME exitCode: 1 terminated
    message:") and the job's condition are what report the failure."""
    tally = 'time="2024-02-21T09:30:56Z" level=info msg="PyTorchJob=pytorch-simple, ReplicaType=Master expected=1, ' \
            'running=1, succeeded=0, failed=0, Replicas=1"'
    assert strength(tally) == 0
    assert strength("INFO[0289] PyTorchJob=kfto-01, ReplicaType=Master expected=1, running=0, succeeded=0, failed=1, "
                    "Replicas=1") == 0
    (tmp_path / "operator.log").write_text(
        tally + "\n"
        "1.708507856644096e+09\tDEBUG\tevents\tError pod pytorch-simple-worker-0 container pytorch exitCode: 1 "
        'terminated message: \t{"type": "Warning", "reason": "Error"}\n'
        "1.7085078566441019e+09\tDEBUG\tevents\tPod: kubeflow.pytorch-simple-worker-0 exited with code 1\t"
        '{"type": "Normal", "reason": "ExitedWithCode"}\n' + tally + "\n")
    result = triage(tmp_path, workers=1)
    assert result.root is not None and result.root.lineno == 2, result.summary
    assert result.root.signature == "controller.replica_failed"
    # still an error when a replica's own failure is worded so: a tally is not a shield for the line after it
    assert strength("PyTorchJob=x, ReplicaType=Worker is not ready: failed to create pod") > 0


def test_nccl_last_error_far_below_an_nccl_warn_does_not_replace_it(tmp_path: Path) -> None:
    job = tmp_path / "job"
    job.mkdir()
    (job / "job.log").write_text(
        "host:2852:3596 [0] include/alloc.h:112 NCCL WARN Cuda failure 999 'unknown error'\n"
        + "".join(f"host:2852:3596 [0] NCCL INFO init.cc:{n} -> 1\n" for n in range(500, 505))
        + "ERROR - NCCL error in: NCCLUtils.hpp:268, unhandled cuda error, NCCL version 2.21.5\n"
        "ncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\nCuda failure 999 'unknown error'\n")
    result = triage(job, workers=1)
    assert result.root is not None and result.root.lineno == 1, result.summary


def test_lines_are_graded_only_while_a_worded_line_can_be_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The severity grade is the scan's dearest call: once a file has kept its worded lines, the rest of a chatty
    log is not graded (a regression once made triage 3.5x slower on large jobs), and the root is still found."""
    import vigil.logs.triage as triage_module

    calls = 0
    graded = triage_module.strength

    def counting(line: str) -> int:
        nonlocal calls
        calls += 1
        return graded(line)

    monkeypatch.setattr(triage_module, "strength", counting)
    chatty = [f"2026-11-30 10:00:{i % 60:02d},000 WARNING retrying request {i}: error talking to the cache"
              for i in range(5 * triage_module.MAX_WORDED_PER_FILE)]
    chatty.append("2026-11-30 11:00:00,000 ERROR RuntimeError: CUDA error: an illegal memory access was encountered")
    (tmp_path / "rank_0.log").write_text("\n".join(chatty) + "\n")
    result = triage(tmp_path)
    assert result.root is not None and result.root.signature == "cuda.illegal_address"
    assert calls <= triage_module.MAX_WORDED_PER_FILE + 1


def test_a_capitalised_could_not_reads_as_a_specific_error(tmp_path: Path) -> None:
    # aws-ofi-nccl's test finds no libfabric provider; its main's "OFI NCCL failure: 2" after it only relays that
    (tmp_path / "job.log").write_text(
        "10.3.35.83: INFO: Function: ofi_init Line: 1102: NET/OFI Setting RDMAV_FORK_SAFE environment variable to 1.\n"
        "10.3.35.83: WARN: Function: find_ofi_provider Line: 543: NET/OFI Couldn't find any optimal provider\n"
        "10.3.35.83: WARN: Function: main Line: 66: NET/OFI OFI NCCL failure: 2\n")
    result = triage(tmp_path, workers=1)
    assert result.root is not None and result.root.lineno == 2, result.summary
    assert strength("NET/OFI Couldn't find any optimal provider") == SPECIFIC
    assert strength("Could not open device mlx5_0") == SPECIFIC


def test_the_e_tag_of_tensorflow_s_log_prefix_reads_as_an_error(tmp_path: Path) -> None:
    # TSL's prefix (time.micros: severity file:line]) as JAX and XLA print it: the coordination service's own
    # error comes before the glog-tagged line of the agent that polled it
    (tmp_path / "task_0.log").write_text(
        "2024-05-02 08:00:01.000001: I external/xla/xla/pjrt/distributed/client.cc:131] Connected to the service.\n"
        "2024-05-02 08:01:10.837611: E external/xla/xla/tsl/distributed_runtime/coordination/"
        "coordination_service.cc:962] /job:jax_worker/replica:0/task:3 unexpectedly tried to connect with a "
        "different incarnation. It has likely restarted.\n"
        "E0502 08:01:10.837983     387 coordination_service_agent.cc:455] Polled an error from coordination "
        "service (this can be an error from this or another task).\n")
    result = triage(tmp_path)
    assert result.root is not None and result.root.lineno == 2
    assert strength("2024-05-02 08:01:10.837611: E external/xla/service.cc:962] task restarted") == SPECIFIC
    assert strength("2024-05-02 08:00:01.000001: I external/xla/client.cc:131] Connected to the service.") == 0


def test_an_undated_file_is_searched_for_its_year_in_its_first_block_only(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A log with no dated line (a plain traceback log) is read once per line, not also once per block for a year."""
    import vigil.logs.triage as triage_module

    sought: list[int] = []
    first_year = triage_module._first_year

    def counted(block: list[str]) -> int | None:
        sought.append(len(block))
        return first_year(block)

    monkeypatch.setattr(triage_module, "_first_year", counted)
    job = tmp_path / "job"
    job.mkdir()
    (job / "rank0.log").write_text("".join(f"step {i} loss 0.5\n" for i in range(10_000))
                                   + "RuntimeError: CUDA error: an illegal memory access was encountered\n")
    result = triage(job)
    assert len(sought) == 1
    assert result.root is not None and "illegal memory access" in result.root.line


def test_ucx_completion_error_at_the_fatal_level_is_named_by_its_syndrome(tmp_path: Path) -> None:
    """UCX logs a failed mlx5 completion at the fatal level under its fatal prefix, without a level tag and with the
    syndrome named without "error" (ib_mlx5_log.c uct_ib_mlx5_completion_with_err): it is the rank's IB failure, not
    the backtrace UCX's error handler prints after it."""
    at = "[gpu-a07:48213:0:48213] "
    (tmp_path / "rank_3.log").write_text(
        at + "ib_mlx5_log.c:143  Local protection on mlx5_1:1/IB (synd 0x4 vend 0x51 hw_synd 0/0)\n"
        + at + "ib_mlx5_log.c:143  RC QP 0x1c2f wqe[12]: RDMA_READ s-- [rva 0x7f00a0 rkey 0x3e1] "
        "[va 0x7f11b0 len 8192]\n"
        "==== backtrace (tid:  48213) ====\n"
        " 0 0x0000000000021f43 uct_ib_mlx5_completion_with_err()  src/uct/ib/mlx5/ib_mlx5_log.c:135\n"
        " 1 0x000000000003a2c1 uct_rc_mlx5_iface_progress()  src/uct/ib/rc/accel/rc_mlx5_iface.c:160\n")
    result = triage(tmp_path, workers=1)
    assert result.root is not None and result.root.lineno == 1, result.summary
    assert result.root.signature == "ucx.ib_completion_error"
    assert result.root.attrs["error"] == "Local protection" and result.root.attrs["hca"] == "mlx5_1:1"


def test_ncclcheck_return_code_trace_is_the_last_choice_for_a_root(tmp_path: Path) -> None:
    """A failure NCCL returns without a WARN leaves only its INFO trace of the code on the way up ("file.cc:N -> 2",
    src/include/checks.h): the first line, where the error arose, is the root when nothing else reads as an error -
    and never over a line that does."""
    trace = ("gpu3:9120:9175 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.3<0>\n"
             "gpu3:9120:9175 [0] NCCL INFO Channel 00/02 :    0   1\n"
             "gpu3:9120:9175 [0] NCCL INFO misc/socket.cc:564 -> 2\n"
             "gpu3:9120:9175 [0] NCCL INFO bootstrap.cc:270 -> 2\n"
             "gpu3:9120:9175 [0] NCCL INFO group.cc:64 -> 2 [Async thread]\n"
             "gpu3:9120:9120 [0] NCCL INFO group.cc:422 -> 2\n")
    only = tmp_path / "only"
    only.mkdir()
    (only / "rank_0.log").write_text(trace)
    result = triage(only, workers=1)
    assert result.root is not None and result.root.lineno == 3, result.summary
    worded = tmp_path / "worded"
    worded.mkdir()
    (worded / "rank_0.log").write_text(trace + "RuntimeError: NCCL error: unhandled system error\n")
    result = triage(worded, workers=1)
    assert result.root is not None and result.root.lineno == 7, result.summary


def test_two_handlers_reporting_one_fatal_signal_leave_the_first_report_the_root(tmp_path: Path) -> None:
    """A process that installed Abseil's failure signal handler (absl/debugging/failure_signal_handler.cc, as Ray's
    and XLA's C++ cores do) reports a SIGSEGV as "*** SIGSEGV received at time=T on cpu N ***" with its stack, then
    calls the handler installed before it - CPython's faulthandler (Modules/faulthandler.c faulthandler_fatal_error),
    which prints "Fatal Python error: Segmentation fault" and the Python stack. Both name only the signal: the second
    is the same crash told again, not the fault named more specifically. Before: faulthandler's line, earlier in the
    library, was named over the first report."""
    (tmp_path / "job.log").write_text(
        "*** SIGSEGV received at time=1678337610 on cpu 12 ***\n"
        "PC: @     0x7fe04ff8d46a  (unknown)  pollset_work()\n"
        "   @     0x7fe053202090  (unknown)  (unknown)\n"
        "[2023-03-09 12:53:30,446 E 957 30467] logging.cc:361: *** SIGSEGV received at time=1678337610 on cpu 12 ***\n"
        "Fatal Python error: Segmentation fault\n"
        "\n"
        "Stack (most recent call first):\n"
        ' File "/usr/local/lib/python3.8/site-packages/grpc/_channel.py", line 813 in _blocking\n')
    result = triage(tmp_path, workers=1)
    assert result.root is not None and result.root.lineno == 1, result.summary
    assert result.root.signature == "process.failure_signal_report"
    # faulthandler's report alone is still the crash
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "job.log").write_text("step 7 loss 2.1\nFatal Python error: Segmentation fault\n")
    result = triage(alone, workers=1)
    assert result.root is not None and result.root.lineno == 2 and result.root.signature == "python.fatal_signal"


def test_open_mpis_peer_disconnected_report_gives_way_to_the_peers_own_error_in_another_file(tmp_path: Path) -> None:
    """Open MPI's TCP transport prints "An MPI communication peer process has unexpectedly disconnected" in the process
    that SURVIVED (opal/mca/btl/tcp help-mpi-btl-tcp.txt: "the root cause of this problem is the failure of the peer").
    Where the peer's own output names its failure, that is the root, however early the peer report's signature stands
    in the library. Before: rank 1's report of rank 0 going away was named over rank 0's ValueError."""
    block = ("--------------------------------------------------------------------------\n"
             "An MPI communication peer process has unexpectedly disconnected.  This\n"
             "usually indicates a failure in the peer process (e.g., a crash or\n"
             "otherwise exiting without calling MPI_FINALIZE first).\n"
             "\n"
             "  Local host: node2\n"
             "  Local PID:  12741\n"
             "  Peer host:  node1\n"
             "--------------------------------------------------------------------------\n")
    (tmp_path / "rank1.log").write_text("step 12 loss 2.31\n" + block)
    (tmp_path / "rank0.log").write_text(
        "step 12 loss 2.31\n"
        "Traceback (most recent call last):\n"
        '  File "train.py", line 88, in <module>\n'
        "    batch = next(loader)\n"
        "ValueError: could not broadcast input array from shape (3,224,224) into shape (3,256,256)\n")
    result = triage(tmp_path, workers=1)
    assert result.root is not None and result.root.source.endswith("rank0.log"), result.summary
    assert result.root.lineno == 5
    # the peer's report alone is still the root: nothing else says which process failed
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "job.log").write_text("step 12 loss 2.31\n" + block)
    result = triage(alone, workers=1)
    assert result.root is not None and result.root.lineno == 3 and result.root.signature == "mpi.peer_disconnected"


def test_open_mpis_report_of_a_rank_killed_by_a_signal_is_the_root(tmp_path: Path) -> None:
    """Open MPI's launcher names the rank a signal ended (PRRTE help-prun.txt proc-aborted-strsignal: "%s noticed that
    process rank %lu with PID %lu on node %s exited on signal %d (%s)."), after its notice that the job was aborted: a
    rank killed outright logs nothing itself, so with no other report that line is the root; a rank that aborted
    itself (signal 6) did report its error, and the launcher's line is only its echo. The PID may be masked."""
    notice = ("Primary job  terminated normally, but 1 process returned\n"
              "a non-zero exit code. Per user-direction, the job has been aborted.\n")
    killed = tmp_path / "killed"
    killed.mkdir()
    (killed / "mpirun.out").write_text(
        notice + "mpirun noticed that process rank 1 with PID xxxxxx on node gpu-a07 exited on signal 9 (Killed).\n")
    result = triage(killed, workers=1)
    assert result.root is not None and result.root.lineno == 3, result.summary
    assert result.root.signature == "launcher.rank_signal_report" and result.root.attrs["signal_number"] == "9"
    aborted = tmp_path / "aborted"
    aborted.mkdir()
    (aborted / "mpirun.out").write_text(
        "[1,3]<stderr>:RuntimeError: CUDA error: an illegal memory access was encountered\n" + notice
        + "mpirun noticed that process rank 3 with PID 48215 on node gpu-a07 exited on signal 6 (Aborted).\n")
    result = triage(aborted, workers=1)
    assert result.root is not None and result.root.lineno == 1, result.summary


def test_horovodruns_report_of_a_process_exit_code_reads_its_signal(tmp_path: Path) -> None:
    """horovodrun's gloo runner prints each failed process's exit code (horovod/runner/gloo_run.py: "Process {idx} exit
    with status code {ec}."), then raises from its own traceback: 137 (128 + SIGKILL) is a process killed outright -
    with no other report, the root; 1 is a process that raised, whose own traceback is the account."""
    killed = tmp_path / "killed"
    killed.mkdir()
    (killed / "horovodrun.out").write_text(
        "Process 0 exit with status code 137.\n"
        "Traceback (most recent call last):\n"
        '  File "/usr/local/bin/horovodrun", line 8, in <module>\n'
        "    sys.exit(run_commandline())\n")
    result = triage(killed, workers=1)
    assert result.root is not None and result.root.lineno == 1, result.summary
    assert result.root.signature == "launcher.rank_signal_report" and result.root.attrs["status"] == "137"
    raised = tmp_path / "raised"
    raised.mkdir()
    (raised / "horovodrun.out").write_text(
        "[1]<stderr>:ValueError: Expected input batch_size (32) to match target batch_size (16).\n"
        "Process 1 exit with status code 1.\n")
    result = triage(raised, workers=1)
    assert result.root is not None and result.root.lineno == 1, result.summary


def test_ucx_completion_error_handled_at_diag_level_is_not_a_root(tmp_path: Path) -> None:
    """UCX logs a completion error it handles at the interface's failure level (diag by default: "UCX  DIAG  Remote
    access on ..."), the survivor's side of a peer that went away; only the ERROR tag or the fatal prefix's untagged
    line is the IB failure. A peer's DIAG lines do not take the root from rank 0's KeyError."""
    from vigil.knowledge.signatures import SignatureMatcher

    matcher = SignatureMatcher()
    at = "[1714557603.512345] [gpu-b02:7712:0]    ib_mlx5_log.c:177  UCX  "
    for level in ("DIAG  ", "WARN  ", "DEBUG ", "INFO  "):
        hit = matcher.match(at + level + "Remote access on mlx5_0:1/IB (synd 0x13 vend 0x88 hw_synd 0/0)")
        assert hit is None or hit.signature.id != "ucx.ib_completion_error", level
    hit = matcher.match(at + "ERROR Remote access on mlx5_0:1/IB (synd 0x13 vend 0x88 hw_synd 0/0)")
    assert hit is not None and hit.signature.id == "ucx.ib_completion_error" and hit.attrs["error"] == "Remote access"
    (tmp_path / "rank_0.log").write_text(
        "[2024-05-01 10:00:01] step 100 loss 2.1\n"
        "Traceback (most recent call last):\n  File \"train.py\", line 9, in <module>\n    step()\n"
        "[2024-05-01 10:00:02] KeyError: 'input_ids'\n")
    (tmp_path / "rank_1.log").write_text(
        "[2024-05-01 10:00:01] step 100 loss 2.1\n"
        + at + "DIAG  Remote access on mlx5_0:1/IB (synd 0x13 vend 0x88 hw_synd 0/0)\n"
        + at + "DIAG  RC QP 0x1a2 wqe[3]: RDMA_WRITE --- [rva 0x7f0 rkey 0x1e]\n")
    result = triage(tmp_path, workers=1)
    assert result.root is not None and result.root.source == "rank_0.log", result.summary
    assert "KeyError" in result.root.line


_ADVISORY = ("node7:4410:4410 [0] /long/pathname/so/that/rpms/can/be/packaged/for/all/platforms/rccl/src/init.cc:133 "
             "NCCL WARN Missing \"iommu=pt\" from kernel command line which can lead to system instablity or hang!\n")


def test_the_warn_heading_the_run_above_a_bare_report_is_the_root_not_an_advisory_one(tmp_path: Path) -> None:
    """Above a bare NCCL report the WARN that names the failure heads the process's unbroken run of WARN and trace
    lines right above it; an advisory WARN printed on healthy runs (RCCL's 'Missing "iommu=pt"', NCCL's unknown
    NCCL_P2P_LEVEL) reads only as error wording and is passed over - alone above the report it is not the root."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "rccl.out").write_text(
        _ADVISORY
        + "node7:4410:4431 [0] NCCL INFO Channel 00 : 0[0] -> 1[0] [send] via NET/Socket/0\n"
        "node7:4410:4431 [0] include/socket.h:385 NCCL WARN Net : Connection closed by remote peer\n"
        "node7:4410:4431 [0] NCCL INFO transport/net_socket.cc:540 -> 2\n"
        "node7:4410:4431 [0] proxy.cc:1496 NCCL WARN [Proxy Service 0] Failed to execute operation Connect from "
        "rank 1, retcode 2\n"
        "node7:4410:4431 [0] NCCL INFO proxy.cc:1520 -> 2\n"
        "NCCL failure common.cu:892 'unhandled system error'\n")
    result = triage(run, workers=1)
    assert result.root is not None and result.root.lineno == 3, result.summary
    for name, advisory in (("rccl", _ADVISORY),
                           ("p2p", "node7:4410:4410 [0] init.cc:212 NCCL WARN NCCL_P2P_LEVEL set to an unknown "
                                   "value\n")):
        alone = tmp_path / name
        alone.mkdir()
        (alone / "rank_0.log").write_text(
            advisory
            + "node7:4410:4431 [0] NCCL INFO misc/socket.cc:564 -> 2\n"
            "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1269, unhandled system "
            "error, NCCL version 2.18.1\n")
        result = triage(alone, workers=1)
        assert result.root is not None and result.root.lineno == 3, (name, result.summary)


_CLOSED = " [0] include/socket.h:385 NCCL WARN Net : Connection closed by remote peer\n"
_NODE7 = "node7: Test NCCL failure common.cu:892 'unhandled cuda error' .. node7 pid 4410: Test failure common.cu:844\n"


@pytest.mark.parametrize(("warn", "report", "root"), [
    # mpirun --tag-output: rank 1's WARN above rank 0's report
    ("[1,1]<stderr>:node8:5120:5140" + _CLOSED,
     "[1,0]<stderr>:NCCL failure common.cu:892 'unhandled cuda error'\n", 3),
    # untagged, the report naming its host and pid: another host's WARN
    ("node8:5120:5140" + _CLOSED,
     _NODE7, 3),
    # the same host, another process
    ("node7:5120:5140" + _CLOSED,
     _NODE7, 3),
    # a tagged rank's WARN above the untagged report of another host
    ("[1,1]<stderr>:node8:5120:5140" + _CLOSED,
     _NODE7, 3),
    # the report's own process: its WARN names the failure
    ("node7:4410:4431" + _CLOSED,
     _NODE7, 2),
    ("[1,0]<stderr>:node7:4410:4431" + _CLOSED,
     "[1,0]<stderr>:NCCL failure common.cu:892 'unhandled cuda error'\n", 2),
])
def test_only_the_reporting_process_s_warn_above_a_bare_report_names_it(
        tmp_path: Path, warn: str, report: str, root: int) -> None:
    """In a job-wide file another process's WARN (another tagged rank; untagged, another host or pid than the one
    nccl-tests' report names) is its own consequence of the failure, not the report's detail."""
    (tmp_path / "all_reduce_perf.out").write_text(
        "node7:4410:4431 [0] NCCL INFO Channel 00 : 0[0] -> 1[0] [send] via NET/Socket/0\n" + warn + report)
    result = triage(tmp_path, workers=1)
    assert result.root is not None and result.root.lineno == root, result.summary


def _banner(title: str, mark: str = "=") -> str:
    side = mark * ((78 - len(title)) // 2)
    return f"{side} {title} {side}\n"


def test_banners_are_not_lines_but_a_sanitizer_s_margin_is(tmp_path: Path) -> None:
    """A title between two runs ("===== ERRORS =====", pytest's "== 1 passed, 1 error in 3.10s ==") is a banner, not
    a line; a run, a space, then text is compute-sanitizer's / cuda-memcheck's margin ("========= Invalid __global__
    write of size 4 bytes"), whose record is read - and its "ERROR SUMMARY: 0 errors" tally is no failure."""
    pytest_log = tmp_path / "pytest"
    pytest_log.mkdir()
    (pytest_log / "pytest.log").write_text(
        _banner("test session starts") + "collected 2 items\n" "tests/test_nccl.py E.  [100%]\n\n" + _banner("ERRORS")
        + "E       ModuleNotFoundError: No module named 'apex'\n" + _banner("short test summary info")
        + _banner("1 passed, 1 error in 3.10s"))
    result = triage(pytest_log, workers=1)
    assert result.root is not None and result.root.lineno == 6, result.summary
    sanitizer = tmp_path / "sanitizer"
    sanitizer.mkdir()
    (sanitizer / "rank_0.log").write_text(
        "========= COMPUTE-SANITIZER\n"
        "========= Invalid __global__ write of size 4 bytes\n"
        "=========     at unaligned_kernel()+0x70 in /home/user/memcheck_demo.cu:6\n"
        "=========     by thread (0,0,0) in block (0,0,0)\n"
        "=========     Address 0x7f0a4c000001 is misaligned\n"
        "=========\n"
        "RuntimeError: CUDA error: unspecified launch failure\n"
        "========= ERROR SUMMARY: 1 error\n")
    result = triage(sanitizer, workers=1)
    assert result.root is not None and result.root.lineno == 2, result.summary
    assert result.root.signature == "cuda.sanitizer_memory_error"
    clean = tmp_path / "clean"
    clean.mkdir()
    (clean / "rank_0.log").write_text(
        "========= COMPUTE-SANITIZER\nstep 1 loss 2.1\n========= ERROR SUMMARY: 0 errors\n")
    assert triage(clean, workers=1).root is None


def test_text_glued_to_a_separator_is_read_with_its_own_relay_prefix(tmp_path: Path) -> None:
    """The text glued after rank 0's separator is rank 3's line: its own prefix names the rank."""
    (tmp_path / "job.log").write_text(
        "[default0]:step 5 ok\n"
        "[default0]:" + "=" * 60 + "[default3]:RuntimeError: CUDA error: an illegal memory access was encountered\n"
        "[default1]:RuntimeError: NCCL communicator was aborted on rank 1.\n")
    result = triage(tmp_path, workers=1)
    assert result.root is not None and result.root.lineno == 2, result.summary
    assert result.root.rank == 3 and result.root.line.startswith("RuntimeError: CUDA error")


def test_nccl_trace_with_the_function_named_and_one_followed_by_a_clean_teardown(tmp_path: Path) -> None:
    """NCCL 2.2x's trace names the function ("transport/nvls.cc:558 (ncclNvlsSetup) -> 1"); a trace the communicator's
    clean teardown ("Destroy COMPLETE") follows was an error ignored on a cleanup path: no root."""
    at = "w3:2736:2736 [0] NCCL INFO "
    named = tmp_path / "named"
    named.mkdir()
    (named / "rank_0.log").write_text(
        at + "Ring 00 : 0 -> 1 via P2P/IPC\n" + at + "transport/nvls.cc:558 (ncclNvlsSetup) -> 1\n"
        + at + "init.cc:1558 (initTransportsRank) -> 1\n")
    result = triage(named, workers=1)
    assert result.root is not None and result.root.lineno == 2, result.summary
    torn = tmp_path / "torn"
    torn.mkdir()
    (torn / "rank_0.log").write_text(
        at + "comm 0x55d1 rank 0 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE\n"
        + at + "misc/socket.cc:50 -> 3\n" + at + "[Service thread] Connection closed by localRank 0\n"
        + at + "comm 0x55d1 rank 0 nranks 2 cudaDev 0 busId 1000 - Destroy COMPLETE\n")
    assert triage(torn, workers=1).root is None


def test_rotated_generations_are_read_oldest_first_as_one_stream(tmp_path: Path) -> None:
    """logrotate's numbered generations (train.log.2.gz, train.log.1, train.log) and its dateext ones
    (kern.log-20261206.xz) are one stream each, read oldest first and inflated; the root is named in the generation
    that holds it, numbered in it. Before, only train.log was read (no root) and a .gz was read as bytes."""
    import bz2
    import gzip
    import lzma

    (tmp_path / "train.log.2.gz").write_bytes(gzip.compress(
        b"2026-12-05 10:00:00,000 INFO step 1\n"
        b"2026-12-05 10:00:01,000 ERROR RuntimeError: CUDA error: an illegal memory access was encountered\n"))
    (tmp_path / "train.log.1").write_text("2026-12-06 10:00:00,000 INFO step 2\n"
                                          "2026-12-06 10:00:01,000 RuntimeError: NCCL communicator was aborted on "
                                          "rank 1.\n")
    (tmp_path / "train.log").write_text("2026-12-07 10:00:00,000 INFO step 3\n")
    (tmp_path / "rank_1.log.1.bz2").write_bytes(bz2.compress(b"2026-12-05 09:00:00,000 INFO rank 1 up\n"))
    (tmp_path / "kern.log-20261206.xz").write_bytes(lzma.compress(b"2026-12-06T10:00:05 kernel: ok\n"))
    (tmp_path / "kern.log-20261205").write_text("2026-12-05T10:00:05 kernel: ok\n")
    sources = discover(tmp_path)
    assert [(s.name, [p.name for p in s.files]) for s in sources] == [
        ("kern.log", ["kern.log-20261205", "kern.log-20261206.xz"]),
        ("rank_1.log", ["rank_1.log.1.bz2"]),
        ("train.log", ["train.log.2.gz", "train.log.1", "train.log"])]
    assert [s.kind for s in sources] == ["node", "rank", "job"]
    result = triage(tmp_path, workers=1)
    assert result.root is not None and (result.root.source, result.root.lineno) == ("train.log.2.gz", 2)
    assert [(e.source, e.lineno) for e in result.cascade] == [("train.log.1", 2)]
    assert result.files == 3 and result.lines == 8


def test_a_compressed_generation_is_read_up_to_the_inflated_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """A decompression bomb: a few KiB of gzip inflating far past the bound is read up to it, with a warning; a
    generation cut short is read up to where it breaks."""
    import gzip

    from vigil.logs import miner

    monkeypatch.setattr(miner, "MAX_INFLATED_BYTES", 1 << 20)
    (tmp_path / "train.log.1.gz").write_bytes(gzip.compress(b"INFO ok\n" * (8 << 20)))  # 64 MiB inflated
    read = sum(len(block) for block in read_lines(tmp_path / "train.log.1.gz"))
    assert read == (1 << 20) // 8
    assert "inflates past" in caplog.text
    whole = gzip.compress(b"RuntimeError: CUDA error: an illegal memory access was encountered\n" + b"x\n" * 100000)
    (tmp_path / "train.log.1.gz").write_bytes(whole[:len(whole) // 2])
    lines = [line for block in read_lines(tmp_path / "train.log.1.gz") for line in block]
    assert lines[0].startswith("RuntimeError: CUDA error") and 1 < len(lines) < 100001
    assert "cut short" in caplog.text


def test_pytest_failure_sections_name_the_exception_line(tmp_path: Path) -> None:
    """pytest's report of a collection error or a failed test (src/_pytest/terminal.py write_sep("_", ...) under
    "= ERRORS =" / "= FAILURES =", the exception on the "E   " lines): the E line is the root, not the banner nor
    pytest's ImportError note above it (before: the banner was named)."""
    (tmp_path / "train.log").write_text(
        "============================= test session starts ==============================\n"
        "collected 0 items / 1 error\n"
        "\n"
        "==================================== ERRORS ====================================\n"
        "______________________ ERROR collecting tests/test_model.py ______________________\n"
        "ImportError while importing test module '/repo/tests/test_model.py'.\n"
        "Hint: make sure your test modules/packages have valid Python names.\n"
        "Traceback:\n"
        "/usr/lib/python3.11/importlib/__init__.py:126: in import_module\n"
        "    return _bootstrap._gcd_import(name[level:], package, level)\n"
        "tests/test_model.py:3: in <module>\n"
        "    import flash_attn\n"
        "E   ModuleNotFoundError: No module named 'flash_attn'\n"
        "=========================== short test summary info ============================\n"
        "ERROR tests/test_model.py\n")
    result = triage(tmp_path, workers=1)
    assert result.root is not None and result.root.lineno == 13, result.summary
    assert result.root.line == "ModuleNotFoundError: No module named 'flash_attn'"
    failed = tmp_path / "failed"
    failed.mkdir()
    (failed / "test.log").write_text(
        "=================================== FAILURES ===================================\n"
        "________________________________ test_allreduce ________________________________\n"
        "\n"
        "    def test_allreduce():\n"
        ">       dist.all_reduce(t)\n"
        "E       RuntimeError: CUDA error: an illegal memory access was encountered\n"
        "E       Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
        "\n"
        "tests/test_dist.py:12: RuntimeError\n"
        "----------------------------- Captured stderr call -----------------------------\n"
        "NCCL WARN Cuda failure 'an illegal memory access was encountered'\n")
    result = triage(failed, workers=1)
    assert result.root is not None and result.root.lineno == 6, result.summary
    assert result.root.signature == "cuda.illegal_address"
    # an underscore banner outside pytest's summary hides nothing
    other = tmp_path / "other"
    other.mkdir()
    (other / "train.log").write_text("______ stage 2 ______\nRuntimeError: CUDA error: an illegal memory access was "
                                     "encountered\n")
    result = triage(other, workers=1)
    assert result.root is not None and result.root.lineno == 2, result.summary


def test_an_nccl_trace_after_the_communicators_teardown_is_no_root(tmp_path: Path) -> None:
    """A return-code trace the process prints after its communicator's "Destroy COMPLETE" is the teardown's own
    (before: it was named as the root); once the process brings a communicator up again, its trace counts."""
    at = "node1:4410:4450 [0] NCCL INFO "
    (tmp_path / "rank_0.log").write_text(
        at + "comm 0x55d1 rank 0 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE\n"
        "step 1 loss 2.3\n"
        + at + "comm 0x55d1 rank 0 nranks 2 cudaDev 0 busId 1000 - Destroy COMPLETE\n"
        + at + "misc/socket.cc:564 -> 2\n"
        + at + "transport/net.cc:1302 (ncclProxyProgress) -> 2\n")
    assert triage(tmp_path, workers=1).root is None
    with (tmp_path / "rank_0.log").open("a") as handle:
        handle.write(at + "comm 0x77e1 rank 0 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE\n"
                     + at + "misc/socket.cc:564 -> 2\n")
    result = triage(tmp_path, workers=1)
    assert result.root is not None and result.root.lineno == 7, result.summary


def test_a_terminal_capture_with_one_or_two_cuts_at_80_columns_is_read_whole(tmp_path: Path) -> None:
    """tmux capture-pane without -J at its default 80 columns: a file with a single cut line (fewer than the three
    the whole-file rule needs) is read whole and the root named at its first piece (before: the piece alone, cut
    mid-word, was read and the root missed)."""
    line = ("[E socket.cpp:957] [c10d] The server socket has failed to listen on any local network address. "
            "RuntimeError: The server socket has failed to listen on [::]:29500 (errno: 98 - Address already in use).")
    (tmp_path / "job.log").write_text(
        "W1207 10:00:00.000 launch.py:181] starting 8 processes\n"
        + "".join(line[k:k + 80] + "\n" for k in range(0, len(line), 80)) + "done\n")
    assert len(line) > 160 and len(line[160:]) < 80
    result = triage(tmp_path, workers=1)
    assert result.root is not None and result.root.lineno == 2, result.summary
    assert result.root.line == line


def test_ordinary_80_character_lines_are_not_joined(tmp_path: Path) -> None:
    """In a file read cut at 80 columns, lines of exactly 80 characters that are whole - followed by the next record
    (both stamped, or starting as they do), by an indented continuation or by a blank line - are not joined to what
    follows; only the cut line is."""
    from vigil.logs.triage import scan_directory

    first = "2026-12-07 10:00:00,000 INFO loading the dataset from /data/shards/train-000.arr"
    second = "2026-12-07 10:00:01,000 INFO the dataset holds 1,048,576 samples in 4096 shardsx"
    third = "step 100 | loss 2.3141 | lr 3.0e-04 | grad norm 0.412 | tokens/s 91234 | mem 71G"
    cut = ("2026-12-07 10:00:02,000 ERROR RuntimeError: CUDA error: an illegal memory access was encountered "
           "(device 3)")
    assert len(first) == len(second) == len(third) == 80 < len(cut) < 160
    (tmp_path / "job.log").write_text(
        f"{first}\n{second}\n\n{third}\nstep 101 | loss 2.3\n{cut[:80]}\n{cut[80:]}\n{third}\n  at step 100\n"
        f"{third}\n\nstep 102 | loss 2.3\n")
    (scan,) = scan_directory(tmp_path, "job", workers=1)
    assert scan.unwrapped is not None and scan.unwrapped.starts == [1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12]
    result = triage(tmp_path, workers=1)
    assert result.root is not None and result.root.lineno == 6 and result.root.line == cut, result.summary


def test_an_nccl_trace_of_a_communicator_still_up_counts_after_another_ones_teardown(tmp_path: Path) -> None:
    """NCCL names the communicator in its "Init COMPLETE" and "Destroy COMPLETE" lines ("comm 0x55d1 ..."); a process
    that tears down one communicator (a subgroup's) while another is still up has not ended its NCCL work: a later
    trace is the live one's (before: no root, the process counted as torn down), and the subgroup's clean teardown does
    not make an earlier trace of the live communicator an ignored error."""
    at = "node1:4410:4450 [0] NCCL INFO "
    (tmp_path / "rank_0.log").write_text(
        at + "comm 0x55d1 rank 0 nranks 8 cudaDev 0 busId 1000 - Init COMPLETE\n"
        + at + "comm 0x66e2 rank 0 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE\n"
        + at + "comm 0x66e2 rank 0 nranks 2 cudaDev 0 busId 1000 - Destroy COMPLETE\n"
        + at + "misc/socket.cc:564 -> 2\n"
        + at + "transport/net.cc:1302 (ncclProxyProgress) -> 2\n")
    result = triage(tmp_path, workers=1)
    assert result.root is not None and result.root.lineno == 4, result.summary
    (tmp_path / "rank_0.log").write_text(
        at + "comm 0x55d1 rank 0 nranks 8 cudaDev 0 busId 1000 - Init COMPLETE\n"
        + at + "comm 0x66e2 rank 0 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE\n"
        + at + "misc/socket.cc:564 -> 2\n"
        + at + "comm 0x66e2 rank 0 nranks 2 cudaDev 0 busId 1000 - Destroy COMPLETE\n")
    result = triage(tmp_path, workers=1)
    assert result.root is not None and result.root.lineno == 3, result.summary
    # both torn down: the trace after is the teardown's own, as before
    with (tmp_path / "rank_0.log").open("a") as handle:
        handle.write(at + "comm 0x55d1 rank 0 nranks 8 cudaDev 0 busId 1000 - Destroy COMPLETE\n")
    assert triage(tmp_path, workers=1).root is None


def test_a_generation_cut_short_right_at_the_inflation_cap_keeps_its_lines(tmp_path: Path) -> None:
    """A compressed generation cut short exactly where the cap ends its reading: the lines up to there are read and
    the file ends there with a warning (before: the look past the cap raised EOFError out of the reader)."""
    import gzip

    from vigil.logs.miner import _open_log

    text = b"".join(b"2026-12-05 10:00:%02d,000 INFO step %d\n" % (i, i) for i in range(40))
    whole = gzip.compress(text)
    path = tmp_path / "train.log.1.gz"
    path.write_bytes(whole[:-8])  # the trailer (CRC, size) lost: the stream inflates whole, then ends short
    with _open_log(path, limit=len(text)) as handle:
        assert handle.read() == text


def test_a_full_width_line_followed_by_an_exception_is_not_joined_to_it(tmp_path: Path) -> None:
    """A file whose longest line is 80 wide (a progress bar at a terminal's width) and the crash right under it: the
    exception's line starts anew and is named as it is (before: joined to the progress bar, named at its line)."""
    bar = "Epoch 3/10: 100%|##########| 500/500 [01:40<00:00, 4.98it/s, loss=2.3141, acc=0.4]"[:80]
    (tmp_path / "job.log").write_text("starting\n" + bar + "\n"
                                      "RuntimeError: CUDA error: an illegal memory access was encountered\nsaving\n")
    result = triage(tmp_path, workers=1)
    assert result.root is not None and result.root.lineno == 3, result.summary
    assert result.root.line.startswith("RuntimeError: CUDA error")


def test_files_numbered_from_0_are_one_a_process_not_rotated_generations(tmp_path: Path) -> None:
    """srun --output=train.log.%t writes train.log.0, train.log.1, ...: numbered from 0, which logrotate and
    RotatingFileHandler never use. Each is a rank's file of its own, the root named in its rank (before: all read as
    one stream, the highest number first, and the rank lost)."""
    from vigil.logs.sources import discover

    for rank in range(4):
        (tmp_path / f"train.log.{rank}").write_text(f"2026-12-07 10:00:0{rank},000 INFO step 1\n")
    with (tmp_path / "train.log.2").open("a") as handle:
        handle.write("2026-12-07 10:00:06,000 ERROR RuntimeError: CUDA error: an illegal memory access was "
                     "encountered\n")
    assert [(s.name, s.rank, len(s.files)) for s in discover(tmp_path)] == [
        (f"train.log.{rank}", rank, 1) for rank in range(4)]
    result = triage(tmp_path, workers=1)
    assert result.root is not None and (result.root.source, result.root.lineno, result.root.rank) == (
        "train.log.2", 2, 2), result.summary


_ILLEGAL = b"RuntimeError: CUDA error: an illegal memory access was encountered\n"


def _gz_generations(folder: Path, count: int, lines: int) -> None:
    import gzip

    for number in range(1, count + 1):  # each generation inflates to lines * 23 bytes
        day = 28 - number
        text = b"".join(b"2026-11-%02d 10:00:00 ok\n" % day
                        for _ in range(lines))
        if number == count:  # the oldest holds an error before its lines
            text = b"2026-11-%02d 09:00:00 " % day + _ILLEGAL + text
        (folder / f"train.log.{number}.gz").write_bytes(gzip.compress(text))


def test_a_total_inflation_budget_leaves_the_oldest_generations_out(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """Many compressed generations, each under the per-file cap, inflate under one total budget: the newest are read,
    the oldest left out, and one warning line names them (before: every generation was inflated, without bound)."""
    _gz_generations(tmp_path, count=6, lines=10_000)  # 230,000 bytes each, the oldest a little more
    (tmp_path / "train.log").write_text("2026-11-28 10:00:00 INFO step 9\n")
    whole = triage(tmp_path, workers=1, inflate_budget=None)
    assert whole.root is not None and whole.root.source == "train.log.6.gz"
    assert whole.lines == 60_002
    with caplog.at_level("WARNING"):
        kept = triage(tmp_path, workers=1, inflate_budget=506_000)
    # .1 and .2 whole (460,000 bytes), .3 read up to the 46,000 left (2,000 lines), .4 to .6 not read
    assert kept.root is None and kept.lines == 1 + 20_000 + 2_000
    warnings = [r.getMessage() for r in caplog.records if "total budget" in r.getMessage()]
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert "not read: train.log.4.gz, train.log.5.gz, train.log.6.gz" in warnings[0]
    assert "read short: train.log.3.gz after 46000 bytes" in warnings[0]
    # the result does not depend on the number of reading processes
    assert triage(tmp_path, workers=2, inflate_budget=506_000).lines == kept.lines


def test_numbered_per_process_files_in_an_old_directory_are_no_generations(tmp_path: Path) -> None:
    """An old/ directory holding an earlier run's srun --output=train.log.%t files (train.log.0 ... .2): each is a
    process's log of its own, ranks 0 to 2 - none joins the current train.log as a rotated generation (before: .1
    and .2 were read as train.log's history, another run's lines in this job's stream, and rank 0 alone was kept)."""
    (tmp_path / "old").mkdir()
    (tmp_path / "train.log").write_text("2026-11-28 10:00:00 INFO step 9\n")
    for rank in range(3):
        (tmp_path / "old" / f"train.log.{rank}").write_text(f"2026-11-20 10:00:00 INFO rank {rank}\n")
    sources = {source.name: source for source in discover(tmp_path)}
    assert sources["train.log"].generations == ()
    assert {name: source.rank for name, source in sources.items() if name.startswith("old/")} == {
        "old/train.log.0": 0, "old/train.log.1": 1, "old/train.log.2": 2}


def test_a_triage_within_the_inflation_budget_inflates_each_file_once(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Where each file's bound (1,032 times a gzip's size) sums past the budget but what they inflate does not, each
    compressed file is opened once (before: once to count, once to read - twice the decompression of every job with a
    few large generations); where the read does pass the budget, the plan's result is the same as before."""
    import gzip

    from vigil.logs import miner

    _gz_generations(tmp_path, count=6, lines=10_000)  # 230,000 bytes each inflated, about 500 bytes compressed
    (tmp_path / "train.log").write_text("2026-11-28 10:00:00 INFO step 9\n")
    opened: list[Path] = []

    def counting(path: Path, mode: str = "rb") -> object:
        opened.append(path)
        return gzip.open(path, mode)

    monkeypatch.setitem(miner.COMPRESSED, ".gz", counting)
    assert miner.inflation_could_pass([sorted(tmp_path.glob("*.gz"))], 2_000_000)
    result = triage(tmp_path, workers=1, inflate_budget=2_000_000)  # 1,380,000 bytes inflate
    assert result.root is not None and result.root.source == "train.log.6.gz"
    assert sorted(Counter(opened).values()) == [1] * 6
    opened.clear()
    kept = triage(tmp_path, workers=1, inflate_budget=506_000)  # passed: read again under the plan
    assert kept.root is None and kept.lines == 1 + 20_000 + 2_000


def test_reading_processes_count_one_inflation_budget(tmp_path: Path) -> None:
    """The count is shared by the reading processes: a read that passes the budget in any of them is read again under
    the plan, with what one process reads."""
    import gzip

    for rank in range(3):
        (tmp_path / f"rank{rank}").mkdir()
        for number in (1, 2):
            (tmp_path / f"rank{rank}" / f"train.log.{number}.gz").write_bytes(
                gzip.compress(b"2026-11-27 10:00:00 ok\n" * 20_000))  # 460,000 bytes each
        (tmp_path / f"rank{rank}" / "train.log").write_text("2026-11-28 10:00:00 INFO step 9\n")
    assert triage(tmp_path, workers=2, inflate_budget=10_000_000).lines == 3 + 6 * 20_000
    # the three .1 whole would pass it: rank0's and rank1's .1, rank2's up to 80,000 bytes (3,479 lines, the last cut)
    passed = triage(tmp_path, workers=2, inflate_budget=1_000_000)
    assert passed.lines == triage(tmp_path, workers=1, inflate_budget=1_000_000).lines == 3 + 2 * 20_000 + 3_479


def test_the_inflation_budget_serves_every_logs_newest_generations_first(tmp_path: Path) -> None:
    """Across logs the budget goes to each log's newest compressed generation before any older one."""
    from vigil.logs.miner import inflation_plan

    for log in ("rank_0", "rank_1"):
        (tmp_path / log).mkdir()
        _gz_generations(tmp_path / log, count=3, lines=1_000)  # 23,000 bytes each
    streams = [[tmp_path / log / f"train.log.{n}.gz" for n in (3, 2, 1)] for log in ("rank_0", "rank_1")]
    limits, line = inflation_plan(streams, 50_000, tmp_path)
    # rank_0's and rank_1's .1 whole (46,000 bytes), rank_0's .2 up to the 4,000 left, the rest not read
    assert limits == {tmp_path / "rank_0" / "train.log.2.gz": 4_000, tmp_path / "rank_1" / "train.log.2.gz": 0,
                      tmp_path / "rank_0" / "train.log.3.gz": 0, tmp_path / "rank_1" / "train.log.3.gz": 0}
    assert "not read: rank_1/train.log.2.gz, rank_0/train.log.3.gz, rank_1/train.log.3.gz;" in line
    assert "read short: rank_0/train.log.2.gz after 4000 bytes" in line
    assert inflation_plan(streams, 10 << 20) == ({}, "")  # within the budget: nothing counted, nothing cut


def test_copytruncate_with_compress_leaves_no_line_in_the_hole(tmp_path: Path) -> None:
    """logrotate copytruncate + compress: train.log.2.gz, train.log.1.gz, then train.log emptied while its writer
    keeps writing at its old offset (no O_APPEND): a hole of zeros before its first new line. The generations are one
    stream in order and the line after the hole is read (before: the zeros and that line were one over-long line, cut
    and dropped, and no root was found)."""
    import gzip

    (tmp_path / "train.log.2.gz").write_bytes(gzip.compress(b"2026-12-05 10:00:00,000 INFO step 1\n"))
    (tmp_path / "train.log.1.gz").write_bytes(gzip.compress(b"2026-12-06 10:00:00,000 INFO step 2\n"))
    with (tmp_path / "train.log").open("wb") as handle:
        handle.seek(300_000)  # a sparse hole, as the writer's old offset leaves it
        handle.write(b"2026-12-07 10:00:00,000 " + _ILLEGAL + b"2026-12-07 10:00:01,000 INFO exiting\n")
    (tmp_path / "rank_1.log").write_bytes(b"\0" * 100_000 + b"2026-12-07 10:00:05,000 INFO rank 1 step 3\n")
    (sources,) = [s for s in discover(tmp_path) if s.name == "train.log"]
    assert [p.name for p in sources.files] == ["train.log.2.gz", "train.log.1.gz", "train.log"]
    assert [line for block in read_lines(tmp_path / "rank_1.log") for line in block] == [
        "2026-12-07 10:00:05,000 INFO rank 1 step 3"]
    result = triage(tmp_path, workers=1)
    assert result.root is not None and (result.root.source, result.root.lineno) == ("train.log", 1), result.summary


def test_olddir_generations_beside_the_log_or_its_directory_are_one_stream(tmp_path: Path) -> None:
    """logrotate's olddir moves generations to a directory of their own: old/ beside the log (olddir old) or
    archive/ beside its directory (olddir ../archive) - read with the log, oldest first, each named where it lies
    (before: a log of its own, old/train.log, and the root's cascade split from it)."""
    import gzip

    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "train.log.2.gz").write_bytes(gzip.compress(
        b"2026-12-05 10:00:00,000 INFO step 1\n2026-12-05 10:00:01,000 ERROR " + _ILLEGAL))
    (tmp_path / "old" / "train.log.1.gz").write_bytes(gzip.compress(b"2026-12-06 10:00:00,000 INFO step 2\n"))
    (tmp_path / "train.log").write_text("2026-12-07 10:00:00,000 INFO step 3\n")
    (tmp_path / "n1" / "logs").mkdir(parents=True)
    (tmp_path / "n1" / "archive").mkdir()
    (tmp_path / "n1" / "logs" / "kern.log").write_text("2026-12-07T10:00:05 kernel: ok\n")
    (tmp_path / "n1" / "archive" / "kern.log-20261206.gz").write_bytes(gzip.compress(b"2026-12-06T10:00:05 k: ok\n"))
    sources = discover(tmp_path)
    assert [(s.name, [p.relative_to(tmp_path).as_posix() for p in s.files]) for s in sources] == [
        ("n1/logs/kern.log", ["n1/archive/kern.log-20261206.gz", "n1/logs/kern.log"]),
        ("train.log", ["old/train.log.2.gz", "old/train.log.1.gz", "train.log"])]
    result = triage(tmp_path, workers=1)
    assert result.root is not None and (result.root.source, result.root.lineno) == ("old/train.log.2.gz", 2)
    assert result.files == 2


def test_an_olddir_named_explicitly_is_read_with_its_logs(tmp_path: Path) -> None:
    """An olddir of another name, or outside the job directory (olddir /var/log/train-history), cannot be told from
    the files: named explicitly its generations join the log of their name (before: not read, or a log of its own)."""
    import gzip
    import json

    from typer.testing import CliRunner

    from vigil.faces.cli.main import app

    job, history = tmp_path / "job", tmp_path / "history"
    job.mkdir()
    history.mkdir()
    (history / "train.log.1.gz").write_bytes(gzip.compress(b"2026-12-06 10:00:01,000 ERROR " + _ILLEGAL))
    (job / "train.log").write_text("2026-12-07 10:00:00,000 INFO step 3\n")
    assert triage(job, workers=1).root is None
    result = triage(job, workers=1, olddirs=[history])
    assert result.root is not None and (result.root.source, result.root.lineno) == (
        (history / "train.log.1.gz").as_posix(), 1)
    out = CliRunner().invoke(app, ["logs", "triage", str(job), "--json", "--olddir", str(history),
                                   "--inflate-budget", "1M"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["root"]["lineno"] == 1
    bad = CliRunner().invoke(app, ["logs", "triage", str(job), "--inflate-budget", "lots"])
    assert bad.exit_code == 2 and "not a size" in bad.output
