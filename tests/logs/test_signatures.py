"""THE signature library: well-formed, one fault vocabulary, real lines map to the right fault or symptom."""

from __future__ import annotations

import re
import shutil
from functools import lru_cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vigil.knowledge.faults import fault_catalogue
from vigil.knowledge.files import kb_dir
from vigil.knowledge.signatures import (
    _PLAIN_LETTER,
    LETTER_PROXY,
    SignatureHit,
    SignatureMatcher,
    load_signature_file,
    proxies_letters,
    re2_screen_line,
    signature_library,
)
from vigil.model import FaultLevel, VigilInputError

# Real line shapes: PyTorch / NCCL / kernel messages as they are printed (see docs/logs.md for sources).
CASES = [
    ("[Sun Feb 23 16:24:18 2025] NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout after 6s "
     "of waiting for RPC response from GPU4 GSP!", "gpu_gsp_timeout", "root"),
    ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.", "gpu_lost",
     "root"),
    ("NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=python, DBE (double bit error) ECC error", "gpu_dbe", "root"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79 GiB",
     "gpu_oom", "root"),
    ("RuntimeError: CUDA error: an illegal memory access was encountered", "cuda_illegal_address", "root"),
    ("RuntimeError: CUDA error: uncorrectable ECC error encountered", "gpu_dbe", "root"),
    ("RuntimeError: CUDA error: unspecified launch failure", "cuda_launch_failure", "root"),
    ("n1:1:2 [3] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer 10.1.1.2<4789> with "
     "status=IBV_WC_RETRY_EXC_ERR(12) opcode=0 len=0 vendor_err=129 localGid ::1 remoteGids ::2 hca mlx5_3",
     "nccl_ib_error", "root"),
    ("[PG ID 0 PG GUID 0 Rank 4] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1580, "
     "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600004 milliseconds before timing out.",
     "nccl_timeout", "cascade"),
    ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, "
     "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3",
     "nccl_unhandled_system_error", "root"),
    ("ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error. "
     "Last error: socketProgress: Connection closed by remote peer n2<54320>", "nccl_net_error", "cascade"),
    ("NCCL error: remote process exited or there was a network error, NCCL version 2.21.5", "nccl_net_error",
     "cascade"),
    ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:5000",
     "nccl_net_error", "cascade"),
    ("Out of memory: Killed process 4242 (python) total-vm:1kB, anon-rss:1kB", "host_oom", "root"),
    # kernels before 4.19 name the victim first, then report the kill
    ("Out of memory: Kill process 4242 (python) score 1031 or sacrifice child", "host_oom", "root"),
    ("h1:238:1219 [0] transport/net_ib.cc:180 NCCL WARN NET/IB : mlx5_ib0:1 async fatal event on QP (0x7f0): local "
     "access violation work queue error", "nic_link_down", "root"),
    ("n1:1:2 [0] transport/net_ib.cc:93 NCCL WARN NET/IB : Got async event : port error", "nic_link_down", "root"),
    ("*** An error occurred in MPI_Init_thread", "mpi.errors_are_fatal", "root"),
    ("pt_main_thread[2536443]: segfault at 7f797fe00000 ip 00007f7c7ac69996 sp 00007f7c12fd7c30 error 4 in "
     "libnccl.so.2[7f7c7ac00000+d3d3000]", "process_crash", "root"),
    ("OSError: [Errno 28] No space left on device: '/ckpt/step_8000/model.pt'", "fs.errno", "root"),
    ("mlx5_core 0000:0c:00.0 ib0: Link down", "link_down", "root"),
    ("pcieport 0000:00:03.1: AER: Uncorrected (Fatal) error received: 0000:3b:00.0", "kernel.aer_uncorrected", "root"),
    ("RuntimeError: DataLoader worker (pid 4567) is killed by signal: Killed.", "torch.dataloader_killed", "root"),
    ("ValueError: batch 3 has 0 samples", "python.exception", "root"),
    ("failed (exitcode: -9) local_rank: 1 (pid: 123) of binary: /usr/bin/python", "launcher.worker_killed", "root"),
    ("failed (exitcode: 1) local_rank: 0 (pid: 123) of binary: /usr/bin/python", "launcher.child_failed", "cascade"),
    # a worker ended by SIGABRT aborted itself after reporting its error: the launcher's account is the abort's echo
    ("ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -6) local_rank: 7 (pid: 561642) of "
     "binary: /usr/bin/python", "launcher.worker_aborted", "cascade"),
    # Open MPI's and horovodrun's reports of a rank ended by a signal: killed outright (a root) or aborted (an echo)
    ("mpirun noticed that process rank 1 with PID 48213 on node gpu-a07 exited on signal 9 (Killed).",
     "launcher.rank_signal_report", "cascade"),
    ("prterun noticed that process rank 3 with PID 512 on node n2 exited on signal 6 (Aborted).",
     "launcher.worker_aborted", "cascade"),
    ("Process 0 exit with status code 137.", "launcher.rank_signal_report", "cascade"),
    ("Process 2 exit with status code 134.", "launcher.worker_aborted", "cascade"),
    ("Process 1 exit with status code 1.", "launcher.child_failed", "cascade"),
    ("Unhandled exception: St13runtime_error. what(): NCCL Error 5: invalid usage", "nccl.internal_error", "root"),
    ("[worker-3:9101:0:9140] Caught signal 11 (Segmentation fault: address not mapped to object at address 0x10)",
     "process_crash", "root"),
    # round 29: glog's / Abseil's failure signal handler, CPython not finding its script, InternLM's relay
    ("*** SIGSEGV (@0x0) received by PID 3371 (TID 0x7f450a559740) from PID 0; stack trace: ***", "process_crash",
     "root"),
    ("*** SIGSEGV received at time=1670000000 on cpu 3 ***", "process_crash", "root"),
    ("/usr/bin/python3: can't open file 'train_mpu.py': [Errno 2] No such file or directory",
     "python.script_not_opened", "root"),
    ("2023-09-07 09:14:40,098 ERROR train.py:308 in <module> -- Raise exception from f363ff97a009 with rank id: 3",
     "internlm.exception_relay", "cascade"),
    # round 30: torch's ExceptionWrapper re-raising a helper's exception, Ray's ActorDiedError for a failed __init__
    ("ValueError: Caught ValueError in DataLoader worker process 0.", "torch.exception_wrapper_relay", "cascade"),
    ("torch.OutOfMemoryError: Caught OutOfMemoryError in replica 0 on device 0.", "torch.exception_wrapper_relay",
     "cascade"),
    ("ray.exceptions.ActorDiedError: The actor died because of an error raised in its creation task, "
     "ray::WorkerDict.__init__() (pid=136980, ip=192.168.100.8, actor_id=802ec5a7e3e04c21babf95d701000000)",
     "ray.task_error_relay", "cascade"),
    # round 32: Ray's ActorUnavailableError, a DataLoader worker ended by SIGTERM, Lightning's note of the SIGTERM, the
    # Prismatic / OpenVLA mixture skipping a dataset whose config raised
    ("ray.exceptions.ActorUnavailableError: The actor d5a12869ca846683c2e9884001000000 is unavailable: The actor is "
     "temporarily unavailable: RpcError: RPC error: Socket closed rpc_code: 14. The task may or may not have been "
     "executed on the actor.", "ray.task_error_relay", "cascade"),
    ("RuntimeError: DataLoader worker (pid 4020138) is killed by signal: Terminated. ", "torch.dataloader_terminated",
     "cascade"),
    ("Epoch 0:  31%|###       | 1225/3999 [1:07:35<2:33:02,  3.31s/it, v_num=29][rank: 2] Received SIGTERM: 15",
     "lightning.sigterm_received", "cascade"),
    ("08/21 [01:46:27] WARNING  | >> [*] Skipping `aloha_game` due  materialize.py:135", "prismatic.dataset_skipped",
     "root"),
    ("WARNING  | >> [*] Skipping `bridge_orig` due to Error: Cannot load `bridge_orig`; only EEF_POS & EEF_R6 & "
     "JOINT_POS_BIMANUAL actions supported!", "prismatic.dataset_skipped", "root"),
    # rich wraps the warning where the terminal's width falls: any cut of the fixed text, the call site at the right
    ("WARNING  | >> [*] Skipping `bridge` due to  materialize.py:135", "prismatic.dataset_skipped", "root"),
    ("WARNING  | >> [*] Skipping `fractal20220817_data`  materialize.py:135", "prismatic.dataset_skipped", "root"),
    ("WARNING  | >> [*] Skipping `bridge` due to Error:  materialize.py:135", "prismatic.dataset_skipped", "root"),
    ("INFO:torch.distributed.elastic.agent.server.api:[default] Worker group FAILED. 3/3 attempts left; will "
     "restart worker group", "launcher.child_failed", "cascade"),
    ("  exitcode  : -9 (pid: 14750)", "launcher.root_cause", "cascade"),
    # libstdc++: a call through a destroyed object, then std::terminate's wordings of the abort
    ("pure virtual method called", "process_crash", "root"),
    ("terminate called without an active exception", "python.aborted", "cascade"),
    ("terminate called recursively", "python.aborted", "cascade"),
    # OpenSSH's client, as DeepSpeed's and MPI's ssh / pdsh launchers run it, cannot reach a host
    ("ssh: Could not resolve hostname node-0: Name or service not known", "ssh.connect_failed", "root"),
    ("gpu-7: ssh: connect to host gpu-7 port 22: Connection refused", "ssh.connect_failed", "root"),
    ("ssh: connect to host 10.0.0.2 port 2222: No route to host", "ssh.connect_failed", "root"),
    # OpenSSH's sshkey_perm_ok refusing a private key readable by others (the key is ignored, the login fails)
    ("@         WARNING: UNPROTECTED PRIVATE KEY FILE!          @", "ssh.key_ignored", "root"),
    ("Permissions 0640 for '/root/.ssh/id_rsa' are too open.", "ssh.key_ignored", "root"),
    # the kernel's hung-task detector; Slurm cancelling a job for a reason of its own
    ("INFO: task python3:4242 blocked for more than 120 seconds.", "kernel.hung_task", "root"),
    ("task:pt_main_thread  state:D stack:0     pid:4242  ppid:4200   flags:0x00004002", "kernel.hung_task", "root"),
    ("slurmstepd: error: *** JOB 494583 ON gpu-3 CANCELLED AT 2024-04-20T09:09:37 DUE TO TIME LIMIT ***",
     "slurm.cancelled", "root"),
    ("slurmstepd: error: *** STEP 81.0 ON gpu-3 CANCELLED AT 2024-04-20T09:09:37 DUE TO NODE FAILURE ***",
     "slurm.cancelled", "root"),
    # the driver refusing a GPU that needs a reset; Slurm's drain reason for an unkillable step; the kubelet's evictions
    ("[373871.354096] NVRM: nvAssertOkFailedNoLog: Assertion failed: Reset required [NV_ERR_RESET_REQUIRED] "
     "(0x00000062) returned from status @ kernel_channel.c:2827", "gpu_xid", "root"),
    ("Kill task failed root 2024-01-25T15:12:23 gpu-23", "slurm.kill_task_failed", "cascade"),
    ("compute001      1     main*       down*   12   12:1:1  64267        0      1   (null) Not responding",
     "slurm.node_not_responding", "cascade"),
    ("[2022-05-27T11:37:57.377] _job_complete: JobId=127441 WTERMSIG 9", "slurm.job_end", "cascade"),
    ("Message:      The node was low on resource: ephemeral-storage. Threshold quantity: 2146223340, available: "
     "1883424Ki.", "k8s.node_pressure_eviction", "root"),
    ("trainer-0   Evicted   gpu-9   Pod The node had condition: [DiskPressure]. ", "k8s.node_pressure_eviction",
     "root"),
    # a Slurm daemon's fatal() (journald and foreground forms); the EFA provider's own completion-queue warning,
    # a root unless its status says the peer is gone
    ("Feb 20 18:59:13 node2 slurmd[57977]: fatal: gres.conf duplicate records for gpu", "slurm.daemon_fatal", "root"),
    ("slurmd: fatal: Unable to determine this slurmd's NodeName", "slurm.daemon_fatal", "root"),
    ("libfabric:451707:1708520807::efa:cq:efa_rdm_txe_handle_error():737<warn> err: 5, message: Invalid address My "
     "EFA addr: fi_addr_efa://[fe80::13:c2ff:fe6f:f03d]:0:1072483550 Peer host id: i-0ce6d3d57139f053c (7)",
     "nccl_ib_error", "root"),
    ("libfabric:9:1708520807::efa:cq:efa_rdm_rxe_handle_error():812<warn> err: 5, message: Bad queue pair (QP) "
     "number (QP does not exist or is in error state) (9)", "nccl_net_error", "cascade"),
    # the twenty-third round's development half, each in its producer's wording
    ("srun: error: fwd_tree_thread: can't find address for host ip-172-31-94-221, check slurm.conf",
     "slurm.address_unresolved", "root"),
    ("[2023-12-05T23:59:28.620] node ua1-dy-i6i4-1 not resumed by ResumeTimeout(1800) - marking down and power_save",
     "slurm.resume_timeout", "root"),
    ("node q-dy-c-3 not resumed by ResumeTimeout(600), setting DOWN and POWERED_DOWN", "slurm.resume_timeout", "root"),
    ("Dec 03 20:30:06 b-dok1 kernel: megaraid_sas 0000:5a:00.0: [30]waiting for 65 commands to complete for scsi0",
     "kernel.megaraid_reset", "root"),
    ("sd 2:2:3:0: [sdd] megasas: RESET cmd=28 retries=0", "kernel.megaraid_reset", "root"),
    ("slurmstepd: Job 1171978 exceeded memory limit (18202456 > 16384000), being killed", "host_oom", "root"),
    ("slurmstepd: error: pyxis: container start failed with error code: 1", "pyxis.relay", "cascade"),
    ("slurmstepd: error: pyxis: couldn't start container", "pyxis.relay", "cascade"),
    ("slurmstepd: error: spank: required plugin spank_pyxis.so: task_init() failed with rc=-1", "slurm.spank_relay",
     "cascade"),
    ("2025-04-05 13:53:24,127 - [slurm_plugin.slurm_resources:is_backing_instance_valid] - WARNING - Node state check: "
     "no corresponding instance in EC2 for node q-dy-c-4(10.6.11.250), node state: ALLOCATED+CLOUD+NOT_RESPONDING",
     "parallelcluster.instance_missing", "root"),
    # round 24: Slurm's memory refusal, configless lookup and CycleCloud's drain; CUDA 802 under a tool's own prefix;
    # ProcessGroupNCCL's take-down, which names no collective
    ("sbatch: error: Memory specification can not be satisfied", "slurm.allocation_failed", "root"),
    ("squeue: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host", "slurm.config_source_lookup", "root"),
    ("cyclecloud_node_fail slurm     2022-11-22T13:25:08 viz3d-1", "cyclecloud.node_failure", "root"),
    ("  what():  Error (gpu_burn-drv.cpp:298): system not yet initialized", "cuda.system_not_ready", "cascade"),
    ("[rank3]:[E901 05:20:03.614723891 ProcessGroupNCCL.cpp:698] [Rank 3] To avoid data inconsistency, we are taking "
     "the entire process down.", "nccl_timeout", "cascade"),
    # round 25: NCCL's RAS report of ranks that stand apart, a record of where the job is rather than why
    ("  Communicator ranks have different AllGather operation counts", "nccl.ras_inconsistent_communicator", "cascade"),
    ("  Missing communicator data from 2 ranks", "nccl.ras_inconsistent_communicator", "cascade"),
]


@pytest.mark.parametrize(("line", "kind", "role"), CASES)
def test_real_lines_map_to_their_fault(line: str, kind: str, role: str) -> None:
    hit = SignatureMatcher().match(line)
    assert hit is not None, line
    # kind: the catalogue fault the line establishes, else its RCA symptom, else the signature id
    assert (hit.kind, hit.signature.role) == (kind, role)


@pytest.mark.parametrize("line", [
    "2026-01-01 10:00:00,000 INFO step 10 loss 2.31 lr 3e-4",
    "eval error rate 0.12 above target 0.10, continuing",
    "n1:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via NET/IB/0",
    "mlx5_core 0000:0c:00.0: Port module event: module 0, Cable plugged",
    "Traceback (most recent call last):",
    "",
])
def test_ordinary_lines_match_nothing(line: str) -> None:
    assert SignatureMatcher().match(line) is None


def test_xid_details_come_from_the_catalogue() -> None:
    hit = SignatureMatcher().match("NVRM: Xid (PCI:0000:3b:00): 79, pid=77, name=python, GPU has fallen off the bus.")
    assert hit is not None
    assert hit.level == FaultLevel.ISOLATE
    assert hit.attrs["xid"] == 79 and hit.attrs["pid"] == 77 and hit.attrs["pci"] == "0000:3b:00"


def test_real_dmesg_samples(shared_data: Path) -> None:
    matcher = SignatureMatcher()
    xid_log = (shared_data / "xid" / "log_samples" / "gpud_testdata_dmesg-with-xid-119.log").read_text()
    xids = [matcher.match(line) for line in xid_log.splitlines() if "NVRM: Xid" in line]
    assert xids and all(h is not None and h.attrs["xid"] == 119 and h.fault == "gpu_gsp_timeout" for h in xids)
    nccl_log = (shared_data / "xid" / "log_samples" / "gpud_testdata_nccl_dmesg.decode.iso.log").read_text()
    hits = [matcher.match(line) for line in nccl_log.splitlines() if line.strip()]
    assert hits and all(h is not None and h.attrs["library"] == "libnccl.so.2" for h in hits)


def test_every_fault_is_in_the_one_vocabulary() -> None:
    catalogue = fault_catalogue()
    signatures = signature_library()
    assert len(signatures) >= 50 and len({s.id for s in signatures}) == len(signatures)
    assert all(s.fault in catalogue.faults or s.fault in catalogue.findings for s in signatures if s.fault)


def test_hostile_lines_are_cheap_and_safe() -> None:
    matcher = SignatureMatcher()
    assert matcher.match("x" * (1 << 20)) is None
    assert matcher.match("\x00\ufffd" * 1000 + "CUDA out of memory") is not None


def test_bad_library_is_a_clear_error(tmp_path: Path) -> None:
    shutil.copytree(kb_dir(), tmp_path / "kb")
    library = tmp_path / "kb" / "signatures.yaml"
    shipped = library.read_text()
    library.write_text(shipped.replace("fault: host_oom", "fault: host_oom_kill", 1))
    with pytest.raises(VigilInputError, match="kernel.oom_kill: fault 'host_oom_kill' is neither"):
        load_signature_file(tmp_path / "kb")
    library.write_text(shipped.replace("- id: cuda.ecc", "- id: cuda.oom", 1))
    with pytest.raises(VigilInputError, match="'cuda.oom' appears twice"):
        load_signature_file(tmp_path / "kb")


def test_the_fast_screen_agrees_with_python_re(shared_data: Path) -> None:
    """The screen runs on RE2 where available; on every line of the real log corpora and of the cases above
    it must pick exactly the lines Python's ``re`` picks (a line it missed would be a missed root cause)."""
    import re

    matcher = SignatureMatcher()
    reference = re.compile(matcher._screen.pattern)
    assert type(matcher._screen).__module__.startswith("re2"), "google-re2 is a pinned dependency"
    lines = [case[0] for case in CASES] + ["Traceback (most recent call last):",
                                           "\x00\ufffd" * 50 + "CUDA out of memory"]
    for path in sorted((shared_data / "xid" / "log_samples").glob("*.log")):
        lines += path.read_text(errors="replace").splitlines()
    for path in sorted((shared_data / "loghub2k_corrected").rglob("*_2k.log")):
        lines += path.read_text(errors="replace").splitlines()
    assert len(lines) > 20000
    fast = [matcher._screen.search(line) is not None for line in lines]
    slow = [reference.search(line) is not None for line in lines]
    assert fast == slow
    assert sum(fast) >= len(CASES)


def test_the_screen_runs_on_re2s_dfa_within_its_memory_budget(shared_data: Path,
                                                              capfd: pytest.CaptureFixture[str]) -> None:
    """Past its memory budget RE2's DFA gives up on a line ("DFA out of memory" on stderr) and the search falls back to
    the NFA, several times slower: the whole library's screen must stay within the budget it is given."""
    matcher = SignatureMatcher()
    lines = [line for path in sorted((shared_data / "loghub2k_corrected").rglob("*_2k.log"))
             for line in path.read_text(errors="replace").splitlines()]
    assert len(lines) >= 20000
    capfd.readouterr()
    for line in lines:
        matcher._screen.search(line)
    assert "DFA out of memory" not in capfd.readouterr().err


def test_the_signature_set_names_the_signature_trying_each_in_turn_would(shared_data: Path,
                                                                       capfd: pytest.CaptureFixture[str]) -> None:
    """A line the screen lets through is tried only against the signatures RE2's set says it matches: on every
    line of the real failure-log corpus, the real log corpora and the cases above, the hit (signature and the
    attributes read from the line) is the one trying every signature in priority order gives, and the set's
    DFA stays within its memory budget."""
    matcher = SignatureMatcher()
    one_by_one = SignatureMatcher()
    one_by_one._set = None
    assert matcher._set is not None, "google-re2 is a pinned dependency"
    lines = [case[0] for case in CASES]
    real = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "real"
    for path in sorted(p for p in real.rglob("*") if p.is_file() and p.suffix != ".yaml"):
        lines += path.read_text(errors="replace").splitlines()
    for path in sorted((shared_data / "xid" / "log_samples").glob("*.log")):
        lines += path.read_text(errors="replace").splitlines()
    for path in sorted((shared_data / "loghub2k_corrected").rglob("*_2k.log")):
        lines += path.read_text(errors="replace").splitlines()
    capfd.readouterr()
    hits = 0
    for line in lines:
        fast, slow = matcher.match(line), one_by_one.match(line)
        assert (fast and (fast.signature.id, fast.attrs)) == (slow and (slow.signature.id, slow.attrs)), line
        hits += fast is not None
    assert "DFA out of memory" not in capfd.readouterr().err
    assert hits >= 1000


def by_re_alone() -> SignatureMatcher:
    """``SignatureMatcher`` by its definition: screened with Python's ``re``, every signature tried in turn."""
    matcher = SignatureMatcher()
    matcher._screen, matcher._set = re.compile(matcher._screen_pattern), None
    return matcher


def read(hit: SignatureHit | None) -> tuple[str, dict[str, object]] | None:
    return None if hit is None else (hit.signature.id, hit.attrs)


@pytest.mark.parametrize("line, signature", [
    ("Received Generic Notice type:\u0661 num:129 (x)", "ib.sm_trap"),  # an Arabic-Indic one: \d to re alone
    ("NVRM: Xid (PCI:0000:3b:00): \u0667\u0669, pid=1234, name=python, GPU has fallen off the bus.", "nvrm.xid"),
    ("[ 1234.5] task:python\u00a0state:D stack:0 pid:4242", "kernel.hung_task"),  # a no-break space: \s to re alone
    ("State:\u00a0Down", "ib.port_down"),
])
def test_a_line_re2_reads_otherwise_is_matched_as_re_matches_it(line: str, signature: str) -> None:
    """Python's ``re`` decides what a line matches; RE2 screens. On a line past ASCII the engines part (``\\d`` and
    ``\\s`` are Unicode to ``re`` alone): RE2's screen passed over these lines, which triage then missed."""
    import re2

    pattern = next(s.pattern for s in signature_library() if s.id == signature)
    assert re.search(pattern, line) is not None and re2.search(pattern, line) is None  # the engines part here
    hit = SignatureMatcher().match(line)
    assert hit is not None and hit.signature.id == signature
    assert read(hit) == read(by_re_alone().match(line))


# what a pasted or re-encoded log puts in place of an ASCII character: a tab, a no-break or thin space for a space,
# digits of other scripts, letters whose case folds to ASCII (the long s, the Kelvin sign) or with an accent; and
# characters both engines read alike, which keep RE2 (a progress bar's block, box drawing, an ellipsis)
STAND_INS = {" ": ["\t", "\u00a0", "\u2009", "\u3000", "\u2588", "\u2502", "\u2026"],
             "1": ["\u0661", "\uff11"], "7": ["\u0667", "\u0967"],
             "s": ["\u017f"], "k": ["\u212a"], "e": ["\u00e9"], "K": ["\u212a"]}


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_line_past_ascii_or_with_tabs_is_matched_as_re_alone_matches_it(data: st.DataObject) -> None:
    """The real cases with characters replaced by non-ASCII stand-ins or tabs: the hit (signature and attributes)
    is the one Python's ``re`` gives trying every signature in turn."""
    line = data.draw(st.sampled_from([case[0] for case in CASES]))
    spots = [i for i, char in enumerate(line) if char in STAND_INS]
    chosen = data.draw(st.sets(st.sampled_from(spots), min_size=1, max_size=4))
    mutated = "".join(data.draw(st.sampled_from(STAND_INS[char])) if i in chosen else char
                      for i, char in enumerate(line))
    matcher, alone = matchers()
    assert read(matcher.match(mutated)) == read(alone.match(mutated)), mutated


@lru_cache(maxsize=1)
def matchers() -> tuple[SignatureMatcher, SignatureMatcher]:
    """The matcher and ``by_re_alone``, built once for the examples."""
    return SignatureMatcher(), by_re_alone()


def test_a_plain_letter_is_to_re_what_the_proxy_is_but_for_literals_and_negated_classes() -> None:
    """Every letter ``re2_screen_line`` makes ``LETTER_PROXY`` (all of Unicode) is matched by each construct that
    matches the proxy's class - ``\\w``, ``\\W``, ``\\d``, ``\\D``, ``\\s``, ``\\S``, ``.``, ``\\b`` - exactly as the
    proxy is, and folds to no ASCII character under ``(?i)`` (the Kelvin sign and the long s keep ``re``'s screen)."""
    letters = [chr(c) for c in range(0x80, 0x110000) if not 0xD800 <= c <= 0xDFFF and _PLAIN_LETTER.fullmatch(chr(c))]
    assert len(letters) > 100_000 and "\u4e2d" in letters and "\u00e9" in letters
    assert "\u212a" not in letters and "\u017f" not in letters and "\u0661" not in letters
    for construct in [r"\w", r"\W", r"\d", r"\D", r"\s", r"\S", ".", r"(?i)[\x00-\x7f]", r"(?i)[^\x00-\x7f]"]:
        compiled = re.compile(construct)
        expected = compiled.fullmatch(LETTER_PROXY) is not None if "x7f" not in construct else construct[5] == "^"
        assert all((compiled.fullmatch(c) is not None) == expected for c in letters), construct
    assert not any(re.search(r"a\b", "a" + c) for c in letters)


@pytest.mark.parametrize("pattern", [r"a[^q]b", r"(?i)a[^Q]", r"x[^a-z]", r"(?!q)\w", r"(?a)\W", r"x(?a:\b)"])
def test_letters_are_not_proxied_for_a_pattern_whose_negated_class_holds_the_proxy(pattern: str) -> None:
    """A negated class holding the proxy matches a Chinese letter and not the proxy, a look-ahead's negation turns,
    and an ASCII-only ``\\W`` or ``\\b`` reads a letter apart from it: such a library's lines go to ``re``."""
    assert proxies_letters([r"\d+ \w+ [^C\n]"]) and not proxies_letters([r"\d+", pattern])
    assert re2_screen_line("\u8bad\u7ec3 step 1", False) is None
    assert re2_screen_line("\u8bad\u7ec3 step 1", True) == "qq step 1"
    assert re2_screen_line("\u8bad\u7ec3\u00a0step 1", True) is None  # a no-break space: re alone


@pytest.mark.parametrize("line, signature", [
    ("2024-01-01 \u8bad\u7ec3\u8fdb\u7a0b rank 3 \u51fa\u73b0\u9519\u8bef\uff1aNCCL error in: "
     "ProcessGroupNCCL.cpp:1191, unhandled system error", "nccl.system_error"),
    ("[rank3]: \u8bad\u7ec3 torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "cuda.oom"),
    ("[rank3]: \u4e2d\u6587\u65e5\u5fd7 \u4e00\u5207\u6b63\u5e38 step 100 loss 0.5", None),
])
def test_a_chinese_line_keeps_re2s_screen_and_is_matched_as_re_alone_matches_it(line: str,
                                                                                signature: str | None) -> None:
    """Chinese letters are ``\\w`` to ``re`` alone: the line was screened by ``re`` and tried against every signature
    (0.1-0.5 ms a line); RE2 screens it with its letters made the proxy, and the hit is ``re``'s."""
    matcher = SignatureMatcher()
    hit = matcher.match(line)
    assert read(hit) == read(by_re_alone().match(line))
    assert (None if hit is None else hit.signature.id) == signature
    assert "_python_screen" not in matcher.__dict__  # re's screen never built


SCRIPT_LETTERS = ["\u4e2d", "\u8bad\u7ec3", "\u9519\u8bef\uff1a", "\u0436", "\u00e9", "\u00df", "\u03a9"]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_line_with_letters_of_other_scripts_is_matched_as_re_alone_matches_it(data: st.DataObject) -> None:
    """The real cases with Chinese, Cyrillic, Greek or accented letters put in anywhere, or put for ASCII letters:
    the hit (signature and attributes) is the one Python's ``re`` gives trying every signature in turn."""
    line = data.draw(st.sampled_from([case[0] for case in CASES]))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(line)))
        if data.draw(st.booleans()) and at < len(line):
            line = line[:at] + data.draw(st.sampled_from(SCRIPT_LETTERS))[0] + line[at + 1:]
        else:
            line = line[:at] + data.draw(st.sampled_from(SCRIPT_LETTERS)) + line[at:]
    matcher, alone = matchers()
    assert read(matcher.match(line)) == read(alone.match(line)), line
