"""The root error across ranks: of all the error lines in a failed job's logs, which one started it.

When one rank of a large job dies, every other rank prints timeouts, resets and launcher noise; the
line that matters is buried. ``triage(dir)`` reads every rank log and the nodes' kernel logs, matches
each line against the signature library, and decides:

* root: among lines whose signature can start a failure (role ``root``: CUDA, Xid, IB, OOM, Python
  exceptions, ...), the earliest; within ``tie_s`` seconds of it the most specific signature wins
  (hardware before CUDA before a generic exception). A line without a timestamp (a traceback line)
  happened between the stamps above and below it; it takes the one below (the last one above when
  nothing follows), so an unstamped error never looks earlier than it can have been; a kernel log with no
  wall-clock time at all (dmesg's seconds since boot) is not ordered against stamped files, its root stands beside
  the earliest stamped one. When no signature
  names a root, the earliest line that reads as a specific error (:mod:`vigil.logs.severity`: an exception
  class, an NCCL WARN, a failed call) is the root - or the line right above it in the same file when that one
  reads as an error in generic words only (the plain first report, a wrapper's summary under it); failing that,
  the earliest symptom, preferring one that is not a timeout or watchdog report (``root_basis`` says which of
  the three named it).
* cascade: every other error line - symptoms on healthy ranks (NCCL watchdog timeouts, closed
  connections, launcher reports) and later errors - one per rank and fault type, with a count.
* machine faults: kernel-log errors (Xid, link down, OOM killer, AER) near the root's time, tied to
  ranks through the pids and host names that NCCL prints.
* silent ranks: ranks that logged no error at all while others did - a rank killed outright often
  leaves nothing in its own log.
"""

from __future__ import annotations

import bisect
import logging
import math
import multiprocessing
import os
import re
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from functools import lru_cache
from itertools import chain
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from vigil.knowledge.error_file import ATTEMPT_ATTR, ERROR_FILE_NAME, read_error_file
from vigil.knowledge.line_prefix import LinePrefix, split_prefix
from vigil.knowledge.signatures import SignatureMatcher, signature_library
from vigil.logs.miner import (
    INFLATE_BUDGET_BYTES,
    InflateBudgetPassed,
    count_inflated,
    inflation_could_pass,
    inflation_plan,
    read_lines,
)
from vigil.logs.severity import GENERIC, SPECIFIC, echoes, reports, strength, warns
from vigil.logs.sources import LogSource, discover, entity_name
from vigil.logs.timestamps import line_time
from vigil.model import Evidence, FaultLevel, node_id, rank_id

MAX_LINE_CHARS = 2000
# A line no signature knows but that reads as an error is kept for the fallback; a chatty log keeps its first few.
MAX_WORDED_PER_FILE = 200
WORDED_SIGNATURE = "generic.error_wording"
# PyTorch prints NCCL's own account of a failure under its wrapper: "DistBackendError: NCCL error in: ... /
# ncclRemoteError: ... / Last error: / <NCCL's last WARN>". The line after the header names what failed - a line of
# the same process: in a job-wide log another rank's line after an empty "Last error:" (ncclGetLastError had nothing,
# so the report ends with the header) is that rank's own report, not this one's detail.
NCCL_LAST_ERROR_HEADER = "Last error:"
# The error class PyTorch names above the header (torch/csrc/distributed/c10d/NCCLUtils.cpp getNcclErrorDetailStr:
# "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.", then "\nLast error:\n" and NCCL's last
# WARN) is never the detail: a report pasted with its lines reversed puts it right under the header.
_NCCL_ERROR_CLASS = re.compile(r"nccl(?:UnhandledCudaError|SystemError|InternalError|InvalidArgument|InvalidUsage"
                               r"|RemoteError|InProgress|Timeout): ")
NCCL_LAST_ERROR = "nccl_last_error"
# The detail belongs to the report whose head is the root: wrapper, NCCL's error class, header, detail. Further down
# it repeats an error NCCL already reported on its own (a WARN line above the wrapper stays the root).
NCCL_REPORT_LINES = 3
# A more specific report of the same fault this many lines below the first one replaces it.
SAME_REPORT_LINES = 12
# Symptoms that every healthy rank prints once another one is gone: the last choice for a root.
# srun's "Job step aborted: Waiting up to N seconds for job step to finish." is the same for a step whose task failed,
# that was cancelled or that hit its time limit: the teardown, printed before slurmstepd's own account of the end.
# Ray's driver and Tune relaying an exception raised in another process ("Unhandled error (suppress with
# RAY_IGNORE_UNHANDLED_ERRORS=1): ray::...", "Trial NAME: Error processing event.") head the report of it: not the
# cause.
# InternLM's entry point relays what main() raised the same way ("Raise exception from HOST with rank id: N" at ERROR,
# the traceback under it).
ECHO_SIGNATURES = frozenset({"nccl.watchdog_timeout", "gloo.collective_timeout", "nccl.watchdog_stuck",
                             "launcher.child_failed", "launcher.root_cause", "slurm.step_aborted",
                             "nccl.watchdog_take_down", "ray.task_error_relay", "internlm.exception_relay"})
# ProcessGroupNCCL taking the process down names no collective and is often flushed before the watchdog's own report of
# the timeout it follows: the last of the echoes.
FOLLOW_THROUGH_SIGNATURES = frozenset({"nccl.watchdog_take_down"})
# A process's report that the node is not ready for it (CUDA 802 before the Fabric Manager has brought the GPUs into
# the fabric): the node's own log outranks it, but wording the process or its tool prints right below it relays it
# (a probe's "cuda probe failed", the next worker's CUDA error).
CONDITION_REPORTS = frozenset({"cuda.system_not_ready"})
# An abort is what a process does after reporting its error ("terminate called after throwing an instance of X" is
# followed by X's message on the "what():" line), and the launcher's report of a worker ended by SIGABRT ("failed
# (exitcode: -6)") is that abort seen from outside: never a root while any other report exists.
ABORT_SIGNATURES = frozenset({"python.aborted", "launcher.worker_aborted"})
# A launcher's report that a child ended (torchelastic's "failed (exitcode: N)", its SIGTERMs to the other workers)
# follows that child's own report of its failure: between the two streams of one process, which have no order between
# their unstamped lines, it yields to a report in the other stream.
LAUNCHER_REPORTS = frozenset({"launcher.child_failed", "launcher.worker_aborted"})
# A launcher's report that a child it started ended - torchelastic's exit report and ChildFailedError, srun's task
# exits and step teardown, mpirun's and horovodrun's notice of a rank ended by a signal - comes after whatever the child
# printed as it failed, in the same stream: error wording above the launcher's first such report in the same file, even
# in generic words ("Error operation not supported at line 351 in file ...", "amrex::Abort::0::CUDA error 3 in file
# ...: initialization error !!!"), is the child's own account, and the launcher's report its consequence. Ray's raylet
# relaying a worker's death is no such report: the worker's output is elsewhere, and the driver's lines above the relay
# are what the death did to the driver.
WRAPPER_REPORTS = frozenset({"launcher.child_failed", "launcher.root_cause", "launcher.worker_aborted",
                             "launcher.rank_signal_report", "slurm.step_ended", "slurm.task_exit",
                             "slurm.step_aborted"})
# A launcher starting its workers anew (torchelastic's "[default] Starting worker group" on each attempt, "Worker group
# FAILED. 3/3 attempts left; will restart worker group"): what a child printed above it belongs to an earlier attempt,
# which the launcher recovered from, never to the failure of a later one.
WORKERS_START = re.compile(r"\] (?:Starting|Restarting) worker group\b|\bwill restart worker group\b")
# torchelastic's agent restarts its workers after a failed attempt, which multiprocessing/api.py reported first
# ("failed (exitcode: N) local_rank: R"), with agent/server/api.py's "[default] Worker group FAILED. 3/3 attempts left;
# will restart worker group" (the same words in torchelastic 0.2 and torch 1.9 to 2.x): what the file prints after that
# belongs to a later attempt the first failure caused (a rendezvous the restart cannot complete, a peer still gone).
# Its other restart, "[default] Detected 1 new nodes from group_rank=0; will restart worker group", follows a node
# joining a healthy group - no attempt failed - so only the failed attempt's words count.
WORKERS_RESTART = re.compile(r"\bWorker group (?:FAILED|UNHEALTHY)\. \d+/\d+ attempts left; will restart worker group")
# torchelastic's agent stops the workers still running ("Sending process P closing signal SIGTERM", then after its wait
# "Unable to shutdown process P via SIGTERM, forcefully exiting via SIGKILL", multiprocessing/api.py _close) in the same
# _poll call that then logs the failure that made it stop them ("failed (exitcode: N) local_rank: R"): the closing
# signals are that report's consequence, printed first - as many lines above it as the node had workers, and more.
# the root's attribute naming the restart line below which a later attempt's errors were not taken for the root
RESTART_LINE = "restart_line"
# the root's attributes naming torchelastic's attempt it came from (ATTEMPT_ATTR), and the later attempts of the same
# run whose errors were not taken for the root
LATER_ATTEMPTS_ATTR = "later_attempts"
CLOSING_SIGNAL = re.compile(r"Sending process \d+ closing signal SIG\w+")
EXIT_REPORT = re.compile(r"failed \(exitcode: -?\d+\) local_rank: \d+")
# A process's stdout and stderr written to files of their own (sbatch --output=<name>.out --error=<name>.err,
# torchrun's stdout.log / stderr.log): the same name but for these, the order between their lines lost.
_STREAM_SUFFIXES = ((".out", ".err"), (".stdout", ".stderr"), ("stdout.log", "stderr.log"),
                    ("stdout.txt", "stderr.txt"))
# torchelastic's ChildFailedError report: the exit code under this header is the failure the launcher saw first.
ROOT_CAUSE_HEADER = "Root Cause (first observed failure):"
ROOT_CAUSE_SIGNATURE = "launcher.root_cause"
FIRST_OBSERVED = "first_observed"
# A report's separators ("=====", "-----": torchelastic's ChildFailedError summary, mpirun's notices) are not lines of
# their own, nor are banners, a title between two runs ("===== ERRORS =====", pytest's "== 1 failed in 2.10s =="); a
# long run with text right after it, no space between, is output glued to one (a report that ended without a newline
# before another process's line: "=====...=====[1,115]<stderr>:[host:pid:0:tid] ib_mlx5_log.c:170  Invalid request on
# ..."), read with its own prefix. A run, a space, then text is a tool's margin: compute-sanitizer's and cuda-memcheck's
# "========= Invalid __global__ write of size 4 bytes" is read as it is.
_SEPARATOR_STARTS = ("===", "---", "___")
GLUED_SEPARATOR_RUN = 20
# pytest's terminal reporter heads each failure's report with a banner of underscores (src/_pytest/terminal.py
# summary_failures / summary_errors: write_sep("_", msg) - "____ test_name ____", "____ ERROR collecting tests/x.py
# ____", "____ ERROR at setup of test_name ____"); under it the test's source and pytest's notes, and the exception on
# the lines it marks with "E" (src/_pytest/_code/code.py FormattedExcinfo.fail_marker "E   ", then the exception's
# own lines, indented as the source was). In such a section the "E" lines are the report, read without the marker and
# the first one's indentation; the other lines are the test's code and pytest's account of it, no root. The section
# ends at the next separator (pytest's "---- Captured stderr call ----" is other output, read as it is). Such banners
# count only under pytest's "==== FAILURES ====" or "==== ERRORS ====" title (summary_failures, summary_errors), up to
# the next "=" separator: another tool's underscore banner hides nothing.
PYTEST_BANNER = "_"
PYTEST_SUMMARIES = frozenset({"FAILURES", "ERRORS"})
_PYTEST_EXC = re.compile(r"^E(?: (?P<text>.*))?$")
# Kernel-log faults this long before the root (or shortly after it) are linked to it.
MACHINE_WINDOW_BEFORE_S = 600.0
MACHINE_WINDOW_AFTER_S = 120.0

# A DataLoader worker shares its parent's stderr: what it printed as it died is the line right before the traceback in
# which the parent reports the death ("DataLoader worker (pid N) is killed by signal: Aborted").
CHILD_DEATH_REPORTS = frozenset({"torch.dataloader_killed"})
# A task the kernel reports blocked ("INFO: task python:4242 blocked for more than 120 seconds") waits behind something:
# when the GPU driver reported an error earlier in the same file - even one NVIDIA's catalogue calls a consequence, like
# Xid 45 with its own cause out of view - that report is the earlier account of the failure the task is stuck behind.
BLOCKED_TASK_REPORTS = frozenset({"kernel.hung_task"})
GPU_DRIVER_PREFIX = "nvrm."
# NVML only reads the state the kernel driver keeps: nvidia-smi's "Unable to determine the device handle for GPU
# 0000:A1:00.0: Unknown Error" (nvmlDeviceGetHandleByIndex failing, or "GPU is lost") and "Failed to initialize NVML"
# report what the driver logged as NVRM lines (an Xid, a GPU fallen off the bus, RmInitAdapter failures). A pasted
# session runs nvidia-smi first and dmesg after, so in one file the driver's line follows the tool's though it was
# logged earlier: the driver's line about the same GPU (or any, where either names none) is the root.
NVML_CLIENT_REPORTS = frozenset({"nvml.gpu_lost", "nvml.init_failed"})
_PCI_BUS_DEVICE = re.compile(r"([0-9a-f]{2}):([0-9a-f]{2})(?:\.[0-9a-f])?$")
# slurmstepd counts a step's cgroup OOM kills when the step ends ("Detected 8 oom-kill event(s) in step N.batch cgroup")
# and prints the count after whatever the killed processes' parent printed on the way down (Ray Tune's "TuneError:
# Trials did not complete" once its actor was killed): in the same file it stands before a report that names no fault
# itself.
STEP_END_REPORTS = frozenset({"slurm.oom_kill"})
# A process's fatal-signal handlers, chained: Abseil's or glog's handler reports the signal, then calls the one
# installed before it (CPython's faulthandler: "Fatal Python error: Segmentation fault"), which reports it again. Each
# names only the signal, so the second report is never the more specific account of the first.
FATAL_SIGNAL_REPORTS = frozenset({"process.failure_signal_report", "process.caught_signal", "python.fatal_signal"})
# A process's report that another process went away (Open MPI's "peer process has unexpectedly disconnected", whose own
# text says the root cause is the failure of the peer): the root only where no other file names a failure of its own.
PEER_FAILURE_REPORTS = frozenset({"mpi.peer_disconnected"})
PRINTED_BEFORE_TRACEBACK = "printed_before_traceback"
# What a relay's prefix said of the line's writer (vigil.knowledge.line_prefix): context, not a field the line filled.
WORKER_ATTR = "worker"
REPEATED_ATTR = "repeated"
# Other processes' lines inside the report an NCCL "Last error:" detail ends (a job-wide log): its reach is that longer.
INTERLEAVED_ATTR = "interleaved_lines"
_CONTEXT_ATTRS = frozenset({"frames", "user_frame", PRINTED_BEFORE_TRACEBACK, WORKER_ATTR, REPEATED_ATTR,
                            INTERLEAVED_ATTR})
_NOTHING_RELAYED: dict[str, Any] = {}  # shared by the lines with no prefix: read, never written
# Who wrote a line, as its relays' prefixes say: a rank's number, (worker, host, rank), or None for no prefix.
_Writer = int | tuple[str | None, str | None, int | None] | None
# ibstat prints a port's state, then its physical state: "State: Down" over "Physical state: Disabled" is a port the
# administrator switched off (an unused one in a status dump), not a port that failed.
PORT_DOWN = "ib.port_down"
PORT_DISABLED = "ib.port_disabled"
# A daemon's fatal() is how it exits: when the lines just above it in its own log name a failure in specific words
# (slurmctld's "error: Couldn't find the specified plugin name for crypto/munge" before "fatal:
# slurm_cred_creator_ctx_create((null)): Operation not permitted"), the first of them is what it could not get past.
DAEMON_FATAL_SIGNATURES = frozenset({"slurm.daemon_fatal"})
# NCCL reports what it fails on as WARN; at INFO it notes what it tolerates and goes on (an optional verbs call the NIC
# does not support: "NCCL INFO Call to ibv_set_ece failed with error Operation not supported errno 95"), or unwinds a
# WARN ("net.cc:1302 -> 6"). A root signature on an INFO line is not a root.
_NCCL_INFO = re.compile(r"\bNCCL INFO\b")
# NCCL traces an error code on its way up at INFO (src/include/checks.h NCCLCHECK and kin: INFO(NCCL_ALL, "%s:%d -> %d",
# __FILE__, __LINE__, res), " [Async thread]" after it on the init thread): "misc/socket.cc:564 -> 2". Its first line is
# where the error arose; a failure NCCL returns without a WARN (socketPollConnect's ncclSystemError) leaves only that
# trace - the last choice for a root, when no line of the job reads as an error.
# NCCL 2.2x's INFO names the function too ("transport/nvls.cc:558 (ncclNvlsSetup) -> 1"). A trace followed by the
# communicator's clean teardown ("comm 0x55d1 rank 0 ... - Destroy COMPLETE") was an error NCCL ignores on a cleanup
# path (NCCLCHECKIGNORE): no root.
_NCCL_TRACE = re.compile(r"\bNCCL INFO [\w./-]+\.(?:cc|cu|cpp|c|h):\d+(?: \([\w:~]+\))? -> (?P<code>[1-9]\d*)\b")
NCCL_DESTROYED = "Destroy COMPLETE"
# After its communicator's teardown a process's trace is the teardown's own (a proxy or service thread unwinding as the
# socket closes): no root, until the same process ("host:pid") brings a communicator up again ("Init COMPLETE").
NCCL_INITIALISED = "Init COMPLETE"
# Both lines name the communicator (NCCL's init.cc: "comm %p rank %d nranks %d ... - Init COMPLETE", "comm %p rank %d
# nranks %d cudaDev %d busId %lx - Destroy COMPLETE"): a process with several (a subgroup's beside the world's) has
# ended its NCCL work only when the last one it brought up is torn down.
_NCCL_COMM = re.compile(r"\bcomm (0x[0-9a-fA-F]+|\(nil\))")
MAX_TRACES = 256  # trace lines kept a file, by line: the runs of WARN and trace lines above a bare report
NCCL_TRACE = "nccl.return_code_trace"
# Colour codes (SGR: ESC [ params m) a formatter writing to a terminal puts around a level or a name ("NCCL
# \x1b[32mINFO\x1b[0m", "[\x1b[31mERROR\x1b[0m]"), kept when the terminal's output is captured: no part of the text.
_SGR = re.compile(r"\x1b\[[\d;]*m")
# The SCSI midlayer rejects I/O to a device in SDEV_DEL with "rejecting I/O to dead device" (drivers/scsi/scsi_lib.c
# scsi_device_state_check): the device is being removed. Where the same kernel log records that device's removal - sd's
# removal path (drivers/scsi/sd.c sd_remove -> sd_shutdown: "sd 6:0:0:1: [sdb] Synchronizing SCSI cache", "...
# Stopping disk", the flush failing with "Synchronize Cache(10) failed: Result: hostbyte=DID_NO_CONNECT"), a command
# ended with DID_NO_CONNECT (scsi_lib.c: the device "is no longer present"), its disk's capacity dropping to zero
# (block/genhd.c: "sdb: detected capacity change from 62521344 to 0") or the USB device under its usb-storage host
# unplugged (drivers/usb/core/hub.c usb_disconnect: "usb 1-1: USB disconnect, device number 5", the host named at
# probe as "scsi host6: usb-storage 1-1:1.0") - the rejections are that removal's consequence, not a failure of
# their own. A device taken offline by error recovery ("rejecting I/O to offline device") stays a root.
DEAD_DEVICE = "kernel.scsi_device_offline"
_DEAD_DEVICE = re.compile(r"\b(?P<addr>\d+:\d+:\d+:\d+): rejecting I/O to dead device")
# sd's probe ends with "sd 6:0:0:1: [sdb] Attached SCSI removable disk" (sd.c sd_probe_async): a device, maybe a new one
# at an address, a disk name or behind a host number another device had before (the kernel gives them out again).
_SCSI_DISK = re.compile(r"\b\w+ (?P<addr>\d+:\d+:\d+:\d+): \[(?P<disk>\w+)\] (?:(?P<what>Synchronizing SCSI cache|"
                        r"Stopping disk|Synchronize Cache\(10\) failed: Result: hostbyte=DID_NO_CONNECT\b|"
                        r"(?:tag#\d+ )?FAILED Result: hostbyte=DID_NO_CONNECT\b)|(?P<attached>Attached SCSI\b))?")
_CAPACITY_GONE = re.compile(r"\b(?P<disk>\w+): detected capacity change from \d+ to 0\b")
_USB_HOST = re.compile(r"\bscsi host(?P<host>\d+): usb-storage (?P<port>\d+-[\d.]+):")
_USB_GONE = re.compile(r"\busb (?P<port>\d+-[\d.]+): USB disconnect\b")
_NCCL_ORIGIN = re.compile(r"^(?:\[[^\]]*\] )?(?P<host>[\w.\-]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\]")
_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
# A frame of a C++ backtrace as c10 prints it under an exception ("frame #1: c10d::ProcessGroupNCCL::WorkNCCL::
# checkTimeout(...) + 0x1d2 (0x2b9d2f40c8e2 in .../libtorch_cuda.so)"): it names code, not an event, so a signature
# matching a function name in it (checkTimeout, ncclCommWatchdog) reports nothing - also under the "HOST: " prefix a
# multi-node launcher (pdsh, DeepSpeed's runner, an MPI launcher's tagged output) puts before each line it relays.
_CPP_FRAME = re.compile(r"^(?:[\w.\-]+: )?\s*frame #\d+: ")
_CPP_FRAME_SCREEN = 120  # how far into a line a frame's "frame #" may start (the launcher's host prefix before it)
_LIBRARY_PATH = re.compile(r"(site-packages|dist-packages|/lib/python\d|<frozen |/torch/|\\lib\\)")


class LogEvent(BaseModel):
    """One error line of a job's logs and what it means."""

    model_config = ConfigDict(extra="forbid")

    source: str
    lineno: int
    ts: float | None
    entity: str
    rank: int | None = None
    node: str | None = None
    signature: str
    fault_type: str | None = Field(description="the fault type or finding of the fault catalogue the line "
                                                 "establishes, None when the line alone does not tell")
    symptom: str | None = Field(default=None, description="the RCA symptom (log:<symptom>) of its signature")
    level: FaultLevel
    role: Literal["root", "cascade"]
    line: str = Field(max_length=MAX_LINE_CHARS)
    attrs: dict[str, Any] = Field(default_factory=dict)
    count: int = 1

    @property
    def kind(self) -> str:
        """What the line reports, to group the reports of one failure: its fault, else its symptom, else its
        signature."""
        return self.fault_type or self.symptom or self.signature


RootBasis = Literal["signature", "error_wording", "symptom"]


class TriageResult(BaseModel):
    """The verdict on a failed job's logs."""

    job: str
    directory: str
    root: LogEvent | None
    root_basis: RootBasis | None = Field(
        default=None, description="what named the root: a root signature, the generic error wording of a "
                                  "line no signature knows, or (last resort) the earliest symptom")
    probable_cause: str | None = Field(description="fault type of the root, or of a linked machine fault")
    cascade: list[LogEvent] = Field(default_factory=list)
    machine_faults: list[LogEvent] = Field(default_factory=list)
    silent_ranks: list[int] = Field(default_factory=list)
    ranks: list[int] = Field(default_factory=list)
    nodes: list[str] = Field(default_factory=list)
    files: int = 0
    lines: int = 0
    error_lines: int = 0
    summary: str = ""

    def evidence(self) -> list[Evidence]:
        """The root, the machine faults and the cascade as Evidence records for RCA."""
        items = [self.root] if self.root else []
        items += self.machine_faults + self.cascade
        out = []
        for event in items:
            role = "root error" if event is self.root else event.role
            out.append(Evidence(
                kind="log",
                entity=event.entity,
                ts=event.ts or 0.0,
                summary=f"{role}: {event.kind} at {event.source}:{event.lineno}: {event.line[:300]}",
                attrs={"signature": event.signature, "fault_type": event.fault_type, "symptom": event.symptom,
                       "level": event.level.label, "source": event.source, "lineno": event.lineno,
                       "count": event.count, **{k: v for k, v in event.attrs.items() if k != "frames"}},
            ))
        return out


@dataclass
class _Scan:
    """What one file told us."""

    source: LogSource
    events: list[LogEvent] = field(default_factory=list)
    worded: list[LogEvent] = field(default_factory=list)  # lines no signature knows that read as errors
    lines: int = 0
    hosts: dict[int, str] = field(default_factory=dict)
    pids: dict[tuple[str, int], int] = field(default_factory=dict)  # (host, pid) -> rank
    ranks: set[int] = field(default_factory=set)
    removals: _Removals | None = None  # SCSI devices a kernel log records being removed (made on the first line)
    trace: LogEvent | None = None  # the file's first line of NCCL's return-code trace (NCCL_TRACE)
    traces: dict[int, str] = field(default_factory=dict)  # line -> "host:pid" of NCCL's return-code trace lines
    unwrapped: _Unwrap | None = None  # the file's lines were cut at a terminal's width: where each whole one starts
    # a rotated log read as one stream (LogSource.generations): each generation's name and the stream's lines before it
    generations: list[tuple[str, int]] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)  # lines where a launcher (re)started its workers (WORKERS_START)
    restarts: list[int] = field(default_factory=list)  # lines where it restarted them after a failure (WORKERS_RESTART)
    # the node or agent each error, start and restart line came through, where a relay's prefix names one (_agent_of)
    agents: dict[int, str] = field(default_factory=dict)


# A log taken from the Markdown source of an issue or a mail (CommonMark: a block quote's ">" and its optional space,
# an indented code block's four spaces) carries the marker before every line of it: a file whose every non-blank line
# of its first block starts with one is read without it.
QUOTE_MARKER = ">"
CODE_INDENT = "    "


def _margin(block: list[str]) -> str | None:
    text = [line for line in block if line.strip()]
    if not text:
        return None
    for marker in (QUOTE_MARKER, CODE_INDENT):
        if all(line.startswith(marker) for line in text):
            return marker
    return None


def _dedent(blocks: Iterable[list[str]], margin: str) -> Iterator[list[str]]:
    """The blocks' lines without the Markdown ``margin`` (a quote's marker takes its space with it)."""
    cut = len(margin)
    for block in blocks:
        if margin == QUOTE_MARKER:
            yield [line[2:] if line.startswith("> ") else line[1:] if line.startswith(">") else line
                   for line in block]
        else:
            yield [line[cut:] if line.startswith(margin) else line for line in block]


# A log saved from a terminal's scrollback (`tmux capture-pane` without -J, a pasted screen) has every line longer than
# the terminal cut into lines of exactly its width. Read whole, a cut exception or NCCL report is one line again. A file
# is read as cut when, in its first block, at least WRAP_MIN_CUTS lines are of the longest length (WRAP_MIN_COLUMNS or
# more) and less than half of the lines after them start as they do (the next of one rank's repeated reports starts
# like it, the rest of a cut line does not), and they are not one message repeated (WRAP_MIN_CUTS different texts once
# numbers and spaces are set aside: a trainer's fixed-width progress line is the longest of many a log). A cut that
# ends in two spaces ends its line (a screen copy pads a line's last piece to the width).
# A file whose longest lines are TERMINAL_COLUMNS wide (80: a VT100's, xterm's and screen's default width, tmux's
# default-size for a detached session) is read as cut with fewer cuts too, or cuts that the rule above does not take,
# when one of them is followed by the rest of a line. Either way a cut is joined to the next line unless that one starts
# anew (_starts_anew: blank, indented, starting with the cut one's first word, or both stamped at their heads) or the
# cut one is a banner (pytest draws its own to the terminal's width): an ordinary line as wide as the longest, followed
# by the next record or a blank line, is not joined.
WRAP_MIN_COLUMNS = 40
WRAP_MIN_CUTS = 3
TERMINAL_COLUMNS = 80
_STAMP_HEAD = 32  # how far into a line its own time stands
_DIGITS = re.compile(r"[\d\s]+")  # numbers and the padding that aligns them (a progress line's counters)


@dataclass
class _Unwrap:
    """How one file's lines cut at ``width`` are joined: the physical line each whole line starts at."""

    width: int
    starts: list[int] = field(default_factory=list)
    lines: int = 0  # physical lines read

    @classmethod
    def of(cls, block: list[str]) -> _Unwrap | None:
        width = max(map(len, block), default=0)
        if width < WRAP_MIN_COLUMNS:
            return None
        cuts = [i for i in range(len(block) - 1) if len(block[i]) == width]
        if len(cuts) >= WRAP_MIN_CUTS:
            alike = sum(block[i + 1][:2] == block[i][:2] for i in cuts)
            texts = {_DIGITS.sub(" ", block[i]) for i in cuts}
            if 2 * alike < len(cuts) and len(texts) >= WRAP_MIN_CUTS:
                return cls(width)
        if width == TERMINAL_COLUMNS and any(not _starts_anew(block[i], block[i + 1]) for i in cuts):
            return cls(width)
        return None

    def join(self, blocks: Iterable[list[str]]) -> Iterator[list[str]]:
        """The blocks' lines with each cut line joined to the rest of it."""
        pending: str | None = None
        last = ""  # the physical line before
        for block in blocks:
            out: list[str] = []
            for line in block:
                self.lines += 1
                if pending is not None and _starts_anew(last, line):
                    out.append(pending)
                    pending = None
                last = line
                if pending is None:
                    self.starts.append(self.lines)
                    pending = line
                else:
                    pending += line
                if len(line) != self.width or line.endswith("  "):
                    out.append(pending)
                    pending = None
            if out:
                yield out
        if pending is not None:
            yield [pending]

    def physical(self, lineno: int) -> int:
        return self.starts[lineno - 1]


# A line that opens a record of its own: Python's traceback header or an exception's line ("RuntimeError: CUDA error",
# "torch.OutOfMemoryError: ..."). A trainer's last full-width line (a progress bar, a table's rule) is often followed
# by the crash; a cut falling right before such a word is the rarer case.
_RECORD_HEAD = re.compile(r"Traceback \(most recent call last\):|[A-Za-z_][\w.]*(?:Error|Exception|Interrupt): ")


def _starts_anew(cut: str, line: str) -> bool:
    """Whether ``line``, after a line exactly as wide as the terminal, is a line of its own rather than the rest of it:
    blank, indented (a writer's own continuation: rich's hanging indent, a traceback's frame), starting with the cut
    one's first word (the next of a run of records), stamped at its head as the cut one is, or carrying the same relay
    prefix as the cut one (mpirun --tag-output's "[1,25]<stderr>:" glued to the text: the launcher tags each line it
    relays, never the rest of one the terminal cut) - or the cut one is a banner drawn to the terminal's width (pytest's
    "===== ERRORS =====", a run alone), whole by its making."""
    return (not line.strip() or line.startswith("  ") or line.split(" ", 1)[0] == cut.split(" ", 1)[0]
            or _RECORD_HEAD.match(line) is not None
            or (cut[:3] in _SEPARATOR_STARTS and cut[-3:] == cut[:3])
            or (line_time(line[:_STAMP_HEAD]) is not None and line_time(cut[:_STAMP_HEAD]) is not None)
            or _same_relay_prefix(cut, line))


def _same_relay_prefix(cut: str, line: str) -> bool:
    """Whether both lines start with the same launcher or collector prefix (``vigil.knowledge.line_prefix``)."""
    if (mine := split_prefix(cut)) is None or (theirs := split_prefix(line)) is None:
        return False
    head = cut[:len(cut) - len(mine.payload)].rstrip()  # the space a prefix may take after it is no part of it
    return bool(head) and head == line[:len(line) - len(theirs.payload)].rstrip()


@dataclass
class _Removals:
    """The SCSI devices one kernel log records being removed, and what ties a disk or a USB port to a device.

    The kernel gives addresses, disk names and host numbers out again, so a disk name or a USB port is tied to the
    device that held it when its removal was written, and a removal counts for the device at an address (or behind
    a host number) only between that device's attach and the next one there."""

    removed: dict[str, list[int]] = field(default_factory=dict)  # H:C:T:L -> lines recording a removal there
    attached: dict[str, list[int]] = field(default_factory=dict)  # H:C:T:L -> lines sd attached a disk there
    disks: dict[str, str] = field(default_factory=dict)  # sdb -> the H:C:T:L that holds the name so far
    unnamed: dict[str, int] = field(default_factory=dict)  # sdb -> its capacity gone, no device named with it yet
    usb_hosts: dict[str, str] = field(default_factory=dict)  # SCSI host number -> its USB port (1-1.3) so far
    hosts_gone: dict[str, list[int]] = field(default_factory=dict)  # host number -> its USB device's disconnects
    hosts_added: dict[str, list[int]] = field(default_factory=dict)  # host number -> lines a usb-storage host took it

    def read(self, line: str, lineno: int) -> None:
        if found := _SCSI_DISK.search(line):
            addr, disk = found["addr"], found["disk"]
            if found["attached"]:
                self.attached.setdefault(addr, []).append(lineno)
                self.unnamed.pop(disk, None)  # a capacity gone before this disk was attached: another's of the name
            elif disk in self.unnamed:
                self._removal(addr, self.unnamed.pop(disk))
            self.disks[disk] = addr
            if found["what"]:
                self._removal(addr, lineno)
        elif found := _CAPACITY_GONE.search(line):
            holder = self.disks.get(found["disk"])
            if holder is None:
                self.unnamed.setdefault(found["disk"], lineno)
            else:
                self._removal(holder, lineno)
        elif found := _USB_GONE.search(line):
            gone = found["port"]
            for host, port in self.usb_hosts.items():
                if port == gone or port.startswith(gone + "."):
                    _record(self.hosts_gone.setdefault(host, []), self.hosts_added.get(host, []), lineno)
        elif found := _USB_HOST.search(line):
            self.usb_hosts[found["host"]] = found["port"]
            self.hosts_added.setdefault(found["host"], []).append(lineno)

    def removal_of(self, addr: str, at: int) -> int | None:
        """The first line that records the removal of the device at ``addr`` (host:channel:target:lun) as it was
        at line ``at``, or None."""
        host = addr.split(":", 1)[0]
        lines = [_first_of_device(self.removed.get(addr, []), self.attached.get(addr, []), at),
                 _first_of_device(self.hosts_gone.get(host, []), self.hosts_added.get(host, []), at)]
        return min((n for n in lines if n is not None), default=None)

    def _removal(self, addr: str, lineno: int) -> None:
        _record(self.removed.setdefault(addr, []), self.attached.get(addr, []), lineno)


def _record(lines: list[int], attaches: list[int], lineno: int) -> None:
    """Add a removal line to a device's sorted ``lines``, keeping the first since the latest attach: a flood of a
    removed disk's failed commands costs no memory and no time."""
    if lines and (attaches[-1] if attaches else 0) <= lines[-1] <= lineno:
        return  # the device there now has an earlier removal line already
    bisect.insort(lines, lineno)


def _first_of_device(lines: list[int], attaches: list[int], at: int) -> int | None:
    """The first of the sorted ``lines`` about the device that was there at line ``at`` (none before its attach or
    from the next attach there), or None."""
    after = bisect.bisect_right(attaches, at)
    start = attaches[after - 1] if after else 0
    end = attaches[after] if after < len(attaches) else math.inf
    first = bisect.bisect_left(lines, start)
    return lines[first] if first < len(lines) and lines[first] < end else None


def _removal_line(line: str) -> bool:
    """Whether a line may record a SCSI device's removal or name what it hangs off (cheap: most lines are not)."""
    return ": [" in line or "capacity change" in line or "USB disconnect" in line or "usb-storage" in line


def triage(
    directory: Path,
    job: str | None = None,
    tie_s: float = 1.0,
    progress: Callable[[str], None] | None = None,
    workers: int | None = None,
    matcher: SignatureMatcher | None = None,
    inflate_budget: int | None = INFLATE_BUDGET_BYTES,
    olddirs: Sequence[Path] = (),
) -> TriageResult:
    """Find the root error of a failed job from the logs under ``directory`` (or in that one log file).

    Files are scanned independently, so large jobs are read by ``workers`` processes (default: one per
    available core once the logs reach ``PARALLEL_BYTES``; 1 = in this process). The result does not depend
    on the number of workers: scans are put back in file order before the root is decided. ``matcher``: a signature
    matcher to reuse in this process (building one costs about 45 ms; many small triages can share one).
    ``inflate_budget``: the most bytes inflated across every compressed file read (``None``: no total; each file is
    capped at ``MAX_INFLATED_BYTES`` either way); past it the oldest generations are left out with one warning.
    ``olddirs``: directories holding rotated generations of the logs under ``directory`` (logrotate's ``olddir``)."""
    # a single log file names the job by its stem: slurm-4242.out is job slurm-4242
    default = directory.resolve().stem if directory.is_file() else directory.resolve().name
    job_name = entity_name(job or default, "job")
    return decide(scan_directory(directory, job_name, progress, workers, matcher, inflate_budget, olddirs),
                  job_name, directory, tie_s)


def scan_directory(directory: Path, job_name: str, progress: Callable[[str], None] | None = None,
                   workers: int | None = None, matcher: SignatureMatcher | None = None,
                   inflate_budget: int | None = INFLATE_BUDGET_BYTES, olddirs: Sequence[Path] = ()) -> list[_Scan]:
    """Every log file under ``directory`` scanned, in file order (what :func:`decide` reads).

    Where the inflation budget could be reached (:func:`vigil.logs.miner.inflation_plan`'s bound), the files are read
    once counting what they inflate across all reading processes; only a read that passes the budget stops and reads
    again under the plan (the compressed files counted, newest first), so what is left out never depends on the number
    of processes and a triage within the budget inflates each file once (before, counted and then read: twice)."""
    sources = discover(directory, olddirs)
    count = auto_workers(sources) if workers is None else max(1, workers)
    reported: set[str] = set()

    def report(name: str) -> None:
        if progress is not None and name not in reported:
            reported.add(name)
            progress(name)

    files = [list(source.files) for source in sources]
    if inflate_budget is not None and inflation_could_pass(files, inflate_budget):
        try:
            return _scan_all(sources, job_name, report, count, matcher, inflate_budget)
        except InflateBudgetPassed:
            pass
        limits, skipped = inflation_plan(files, inflate_budget, directory)
        if skipped:
            _log.warning("%s", skipped)
        if limits:
            sources = [replace(source, inflate_limits=tuple((path, limits[path]) for path in source.files
                                                             if path in limits)) for source in sources]
    return _scan_all(sources, job_name, report, count, matcher, None)


def _scan_all(sources: list[LogSource], job_name: str, progress: Callable[[str], None], count: int,
              matcher: SignatureMatcher | None, budget: int | None) -> list[_Scan]:
    """The sources scanned in file order; with a ``budget``, the bytes inflated across them counted, and
    :class:`InflateBudgetPassed` raised once they pass it."""
    total = multiprocessing.get_context("spawn").Value("q", 0) if budget is not None else None
    scans: list[_Scan] = []
    if count > 1 and len(sources) > 1:
        # spawn, not fork: the parent may hold threads (torch, the HTTP server) that a fork would copy mid-state.
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=min(count, len(sources)), mp_context=context,
                                 initializer=count_inflated, initargs=(total, budget or 0)) as pool:
            futures = [pool.submit(_scan_file, source, job_name) for source in sources]
            try:
                for source, future in zip(sources, futures, strict=True):
                    scans.append(future.result())
                    progress(source.name)
            except InflateBudgetPassed:
                for future in futures:
                    future.cancel()
                raise
        return scans
    matcher = matcher or SignatureMatcher()
    count_inflated(total, budget or 0)
    try:
        for source in sources:
            scans.append(_scan(source, job_name, matcher))
            progress(source.name)
    finally:
        count_inflated(None, 0)
    return scans


PARALLEL_BYTES = 64 << 20
_log = logging.getLogger(__name__)


def auto_workers(sources: list[LogSource]) -> int:
    """One process per available core for logs of ``PARALLEL_BYTES`` or more; below that, starting processes
    costs more than it saves."""
    total = 0
    for path in (path for source in sources for path in source.files):
        try:
            total += path.stat().st_size
        except OSError:
            continue
    if total < PARALLEL_BYTES:
        return 1
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


@lru_cache(maxsize=1)
def _worker_matcher() -> SignatureMatcher:
    return SignatureMatcher()


def _scan_file(source: LogSource, job: str) -> _Scan:
    """One file in a worker process (the matcher is built once per process)."""
    return _scan(source, job, _worker_matcher())


def _scan(source: LogSource, job: str, matcher: SignatureMatcher) -> _Scan:
    scan = _Scan(source)
    if source.rank is not None:
        scan.ranks.add(source.rank)
    last_ts: float | None = None
    frames: list[dict[str, Any]] = []
    untimed: list[LogEvent] = []
    in_traceback = False
    # Lines of several processes interleave under their relays' prefixes: each one's traceback is read apart.
    writer: _Writer = None
    tracebacks: dict[_Writer, tuple[list[dict[str, Any]], bool, int]] = {}
    after_last_error = False
    last_error_rank: int | None = None  # the rank whose report the "Last error:" header ends
    last_error_writer: _Writer = None
    # where the writer changed, lately: other processes' lines inside a wrapper's report stretch it (NCCL_REPORT_LINES)
    writer_runs: deque[tuple[int, _Writer]] = deque([(0, None)], maxlen=2 * NCCL_REPORT_LINES + 2)
    foreign_before = foreign_after = 0
    in_root_cause = False
    pytest_summary = False  # under pytest's FAILURES / ERRORS title
    pytest_indent: int | None = -1  # -1: not in a pytest failure's section; None: in one, no "E" line read yet
    destroyed: set[str] = set()  # "host:pid" of the processes whose communicator was torn down (NCCL_DESTROYED)
    live: dict[str, set[str]] = {}  # "host:pid" -> its communicators brought up and not torn down (NCCL_COMM)
    kernel_log = source.kind == "node"  # where a SCSI device's removal is recorded
    last_text = 0  # the last non-blank line, and the one before the current traceback's header
    traceback_after = 0
    lineno = 0
    year: int | None = None  # of the file's first dated line: a time without one (syslog, glog) is of that year
    blocks: Iterator[list[str]]
    record = (read_error_file(source.path) if source.path.name == ERROR_FILE_NAME and not source.generations
              else None)
    if record is not None:
        # torchelastic's record of the worker's exception: its lines all stamped with the time it was recorded
        recorded, last_ts = record
        blocks = iter([recorded])
    elif source.generations:
        blocks = _read_generations(source, scan.generations)
    else:
        blocks = read_lines(source.path, limit=dict(source.inflate_limits).get(source.path))
    first = next(blocks, [])
    margin = _margin(first)  # a log pasted into Markdown as a quote or an indented code block: the marker is no text
    if margin is not None:
        blocks = _dedent(chain([first], blocks), margin)
        first = next(blocks, [])
    year = _first_year(first)  # in the file's first block only: an undated file's lines are not searched twice
    unwrap = _Unwrap.of(first)  # a capture cut at a terminal's width: its lines read whole, numbered by their first cut
    blocks = chain([first], blocks)
    for block in blocks if unwrap is None else unwrap.join(blocks):
        for raw in block:
            lineno += 1
            while True:  # twice for text glued to a separator run, which is read with its own relay prefix
                rank = source.rank
                line = raw
                node = source.node
                relayed = _NOTHING_RELAYED
                named: _Writer = None
                agent: str | None = None
                # a kernel log's lines lead with the kernel's own names ("nvme0n1: ", "sd 6:0:0:1: "), not a relay's
                prefix = None if kernel_log else split_prefix(raw)
                if prefix is not None:
                    line = prefix.payload
                    agent = _agent_of(prefix)
                    if rank is None and prefix.rank is not None and prefix.rank_scope != "node":
                        rank = prefix.rank
                    if prefix.worker is None and prefix.host is None and prefix.repeated is None:
                        named = prefix.rank  # a rank's number alone (torchrun, srun, mpirun): the commonest
                    else:
                        named = (prefix.worker, prefix.host, prefix.rank)
                        if node is None and prefix.host is not None:
                            node = entity_name(prefix.host, "") or None
                        relayed = {key: value for key, value in ((WORKER_ATTR, prefix.worker),
                                                                 (REPEATED_ATTR, prefix.repeated)) if value is not None}
                if "\x1b[" in line:
                    line = _SGR.sub("", line)
                stripped = line.strip()
                separator = False
                if stripped[:3] in _SEPARATOR_STARTS:
                    mark = stripped[0]
                    rest = stripped.lstrip(mark)
                    if not rest or rest.rstrip().endswith(mark * 3):
                        separator = True  # only the run, or a banner: a title between runs
                        if mark == "=":
                            pytest_summary = rest.strip(" =") in PYTEST_SUMMARIES
                        pytest_indent = None if pytest_summary and mark == PYTEST_BANNER and rest else -1
                    elif mark != PYTEST_BANNER and len(stripped) - len(rest) >= GLUED_SEPARATOR_RUN \
                            and not rest[0].isspace():
                        # a separator with the next output glued to it: the run ends a section, the text is a line
                        in_root_cause = False
                        raw = rest
                        continue
                break
            if pytest_indent != -1 and not separator and pytest_indent is None \
                    and line.strip() == "Traceback (most recent call last):":
                pytest_indent = -1  # --tb=native: Python's own traceback and no "E" lines, read as it is
            if pytest_indent != -1 and not separator:
                marked = _PYTEST_EXC.match(line)
                if marked is None:
                    continue  # the test's code, pytest's notes: the "E" lines are the report
                text = marked["text"] or ""
                if pytest_indent is None:
                    pytest_indent = len(text) - len(text.lstrip())
                line = text[pytest_indent:] if text[:pytest_indent].isspace() else text.lstrip()
                stripped = line.strip()
            if named != writer:
                tracebacks[writer] = (frames, in_traceback, traceback_after)
                frames, in_traceback, traceback_after = tracebacks.pop(named, ([], False, 0))
                writer = named
                writer_runs.append((lineno, named))
            if rank is not None:
                scan.ranks.add(rank)
            stamp = line_time(line, year)
            if stamp is None and prefix is not None and prefix.timed:
                stamp = line_time(raw, year)
            ts = last_ts if stamp is None else stamp
            if stamp is not None:
                last_ts = stamp
                for event in untimed:  # it happened between the last stamp and this one: take the later
                    event.ts = stamp
                untimed = []
            if stripped == "Traceback (most recent call last):":
                frames, in_traceback = [], True
                traceback_after = last_text
                continue
            if stripped:
                last_text = lineno
            if in_traceback:
                frame = _FRAME.match(line)
                if frame:
                    frames.append({"path": frame["path"], "line": int(frame["line"]), "func": frame["func"]})
                    continue
                if line[:1].isspace() or not stripped:
                    continue
                in_traceback = False
            if stripped == NCCL_LAST_ERROR_HEADER:
                after_last_error, last_error_rank, last_error_writer = True, rank, named
                foreign_before = _foreign_lines(writer_runs, lineno, named, 2 * NCCL_REPORT_LINES)
                foreign_after = 0
                continue
            if separator or stripped == ROOT_CAUSE_HEADER:
                in_root_cause = stripped == ROOT_CAUSE_HEADER
                continue
            if after_last_error and named != last_error_writer:
                # another process's line between the header and its detail (a job-wide log): not the detail, and
                # the report goes on under it - for a few lines
                foreign_after += 1
                after_last_error = foreign_after <= NCCL_REPORT_LINES
                detail = False
            else:
                detail = (after_last_error and bool(stripped) and rank == last_error_rank
                          and not _NCCL_ERROR_CLASS.match(stripped))
                after_last_error = after_last_error and not stripped
            if stripped.find("frame #", 0, _CPP_FRAME_SCREEN) >= 0 and _CPP_FRAME.match(line):
                continue
            if "worker group" in line and WORKERS_START.search(line):
                scan.starts.append(lineno)
                if WORKERS_RESTART.search(line):
                    scan.restarts.append(lineno)
                if agent is not None:
                    scan.agents[lineno] = agent
            if kernel_log and _removal_line(line):
                if scan.removals is None:
                    scan.removals = _Removals()
                scan.removals.read(line, lineno)
            origin = _NCCL_ORIGIN.match(line)
            if origin and rank is not None:
                scan.hosts[rank] = origin["host"]
                scan.pids[(origin["host"], int(origin["pid"]))] = rank
            if prefix is not None and prefix.syslog:
                # a syslog header names the program, and signatures may read it ("slurmctld[42]: fatal: ...")
                hit = matcher.match(raw)
                if hit is None:
                    hit = matcher.match(line)
                else:
                    line = raw
            else:
                hit = matcher.match(line)
            if hit is not None and hit.signature.role == "root" and _NCCL_INFO.search(line):
                hit = None
            if hit is None:
                # strength() only while the file may keep another worded line: it is the scan's dearest call
                if len(scan.worded) < MAX_WORDED_PER_FILE and (grade := strength(line) or (SPECIFIC if detail else 0)):
                    scan.worded.append(LogEvent(
                        source=source.name, lineno=lineno, ts=ts, entity=_entity(source, job, rank), rank=rank,
                        node=node, signature=WORDED_SIGNATURE, fault_type=None,
                        level=FaultLevel.OBSERVE, role="root", line=line[:MAX_LINE_CHARS],
                        attrs={"strength": grade, **_detail_attrs(detail, foreign_before + foreign_after), **relayed}))
                    if agent is not None:
                        scan.agents[lineno] = agent
                    if stamp is None:
                        untimed.append(scan.worded[-1])
                elif ((arrow := line.rfind(" -> ")) > 0 and (code := line[arrow + 4:].rstrip())[:1].isdigit()
                      and (code.isdigit() or code.endswith("]")) and (trace := _NCCL_TRACE.search(line)) is not None):
                    # the cheap screen first: the code ends the line (or " [Async thread]" after it)
                    key = _origin_key(line)
                    if len(scan.traces) < MAX_TRACES:
                        scan.traces[lineno] = key
                    if scan.trace is None and key not in destroyed:
                        scan.trace = LogEvent(
                            source=source.name, lineno=lineno, ts=ts, entity=_entity(source, job, rank), rank=rank,
                            node=node, signature=NCCL_TRACE, fault_type=None, level=FaultLevel.OBSERVE,
                            role="root", line=line[:MAX_LINE_CHARS], attrs={"code": int(trace["code"]), **relayed})
                        if stamp is None:
                            untimed.append(scan.trace)
                elif line.endswith(NCCL_DESTROYED) and _NCCL_INFO.search(line):
                    key = _origin_key(line)
                    up = live.get(key)
                    if up:
                        up.discard(_comm(line))
                    if not up:  # the process's last communicator (or the only one the log saw) torn down
                        scan.trace = None  # torn down cleanly after it: an error ignored on the way
                        destroyed.add(key)
                elif line.endswith(NCCL_INITIALISED):
                    key = _origin_key(line)
                    live.setdefault(key, set()).add(_comm(line))
                    destroyed.discard(key)
                continue
            attrs = {**hit.attrs, **relayed}
            if detail:
                attrs[NCCL_LAST_ERROR] = True
                if foreign_before + foreign_after:
                    attrs[INTERLEAVED_ATTR] = foreign_before + foreign_after
            if in_root_cause and hit.signature.id == ROOT_CAUSE_SIGNATURE:
                attrs[FIRST_OBSERVED] = True
            if frames and hit.signature.role == "root":
                attrs.update(_traceback_attrs(frames))
                attrs[PRINTED_BEFORE_TRACEBACK] = traceback_after
                frames = []
            event = LogEvent(
                source=source.name, lineno=lineno, ts=ts, entity=_entity(source, job, rank), rank=rank, node=node,
                signature=hit.signature.id, fault_type=hit.fault, symptom=hit.signature.symptom, level=hit.level,
                role=hit.signature.role, line=line[:MAX_LINE_CHARS], attrs=attrs,
            )
            if stamp is None:
                untimed.append(event)
            scan.events.append(event)
            if agent is not None:
                scan.agents[lineno] = agent
    scan.lines = lineno if unwrap is None else unwrap.lines
    scan.unwrapped = unwrap
    return scan


def _read_generations(source: LogSource, generations: list[tuple[str, int]]) -> Iterator[list[str]]:
    """A rotated log's generations, oldest first, as one stream; ``generations`` gets each one's name and the lines
    read before it."""
    folder = Path(source.name).parent
    limits = dict(source.inflate_limits)
    read = 0
    names = source.generation_names or tuple((folder / path.name).as_posix() for path in source.generations)
    for path, name in zip(source.generations, names, strict=True):
        if limits.get(path) == 0:  # left out under the inflation budget
            continue
        generations.append((name, read))
        for block in read_lines(path, limit=limits.get(path)):
            read += len(block)
            yield block


_DATED = re.compile(r"(?<!\d)((?:19|20)\d\d)-\d\d-\d\d[T ]\d\d:\d\d|(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) \w{3} [ \d]\d "
                    r"\d\d:\d\d:\d\d ((?:19|20)\d\d)")
# How far into a file its year is sought (its first block): a later dated line does not date the lines above it.
YEAR_LOOKAHEAD_LINES = 4096


def _first_year(block: list[str]) -> int | None:
    """The year of the first line in ``block`` whose time names one (ISO or ctime, at the line's head). journald's
    and syslog's short format and glog's header leave the year out; a relay's yearless time before a line that names
    its own year (a journal of the job's output) is of that year, not necessarily the current one."""
    for line in block[:YEAR_LOOKAHEAD_LINES]:
        found = _DATED.search(line, 0, 120)
        if found is not None and line_time(line) is not None:
            return int(found[1] or found[2])
    return None


def _foreign_lines(runs: deque[tuple[int, _Writer]], lineno: int, named: _Writer, span: int) -> int:
    """How many of the ``span`` lines above ``lineno`` another writer than ``named`` wrote (``runs``: the line at which
    each recent writer took over, in order)."""
    count = 0
    for n in range(max(1, lineno - span), lineno):
        who: _Writer = None
        for start, took_over in runs:
            if start > n:
                break
            who = took_over
        count += who != named
    return count


def _detail_attrs(detail: bool, interleaved: int) -> dict[str, Any]:
    if not detail:
        return {}
    return {NCCL_LAST_ERROR: True, INTERLEAVED_ATTR: interleaved} if interleaved else {NCCL_LAST_ERROR: True}


def _entity(source: LogSource, job: str, rank: int | None) -> str:
    if source.kind == "node" and source.node:
        return node_id(source.node)
    return rank_id(job, rank) if rank is not None else f"job/{job}"


def _traceback_attrs(frames: list[dict[str, Any]]) -> dict[str, Any]:
    """The innermost frame of the user's own code (not the standard library, torch or site-packages)."""
    own = [f for f in frames if not _LIBRARY_PATH.search(f["path"])]
    attrs: dict[str, Any] = {"frames": frames[-8:]}
    if own:
        attrs["user_frame"] = f'{own[-1]["path"]}:{own[-1]["line"]} in {own[-1]["func"]}'
    return attrs


def decide(scans: list[_Scan], job: str, directory: Path, tie_s: float = 1.0) -> TriageResult:
    """Pick the root, the cascade and the linked machine faults from the scanned files."""
    priority = {s.id: i for i, s in enumerate(signature_library())}
    hosts: dict[int, str] = {}
    ranks: set[int] = set()
    for scan in scans:
        hosts.update(scan.hosts)
        ranks |= scan.ranks
    for scan in scans:  # a rank file in a node's directory runs on that node, unless NCCL says otherwise
        if scan.source.kind == "rank" and scan.source.rank is not None and scan.source.node:
            hosts.setdefault(scan.source.rank, scan.source.node)
    # Pids are per host: (host, rank) owners of each pid, from NCCL's prefixes and from pids a rank
    # names itself (its DataLoader worker, say).
    owners: dict[int, set[tuple[str | None, int]]] = defaultdict(set)
    for scan in scans:
        for (host, number), rank in scan.pids.items():
            owners[number].add((_short_host(host), rank))
    events = [e for scan in scans for e in scan.events]
    for event in events:
        pid = str(event.attrs.get("pid", "")).strip()
        if event.rank is not None and pid.isdigit():
            owners[int(pid)].add((_short_host(hosts.get(event.rank) or event.node), event.rank))
    single_node = len({s.source.node for s in scans if s.source.kind == "rank"}) <= 1
    for event in events:
        _link_node_event(event, owners, hosts)
        _link_launcher_event(event, job, single_node)
        if event.rank is not None and event.node is None and event.rank in hosts:
            event.node = entity_name(hosts[event.rank], "") or None
    _switched_off_ports(events)
    _removed_devices(scans)
    worded = [e for scan in scans for e in scan.worded]
    first_events, first_worded, cut_at_restart = _first_attempt(scans, events, worded)
    first_events, first_worded, later_attempts = _first_failed_attempt(scans, first_events, first_worded)
    root, basis = _pick_root(first_events, priority, tie_s)
    if root is None:
        root, basis = _fallback_root(first_worded, first_events, tie_s,
                                     {s.source.name: s.starts for s in scans if s.starts})
    if root is None and (traces := [s.trace for s in scans if s.trace is not None]):
        root, basis = _earliest(traces, tie_s), "symptom"
    root = _nccl_detail(root, events + worded)
    root = _nccl_warn_detail(root, basis, worded, events, {s.source.name: s.traces for s in scans})
    root = _child_last_words(root, worded)
    root = _errors_before_fatal(root, basis, worded)
    root = _plain_line_above(root, basis, worded)
    if root is not None:
        rooted = next(s for s in scans if s.source.name == root.source)
        restart = (cut_at_restart.get((root.source, rooted.agents.get(root.lineno)))
                   or cut_at_restart.get((root.source, None), 0))
        if root.lineno < restart:
            root.attrs[RESTART_LINE] = restart
        attempt = rooted.source.attempt
        if attempt is not None:
            root.attrs[ATTEMPT_ATTR] = attempt
            if later := later_attempts.get(root.source):
                root.attrs[LATER_ATTEMPTS_ATTR] = later
    if root is not None and root.rank is None and root.entity.startswith("node/"):
        _attribute_to_rank(root, events)
    rank_events = [e for e in events if not e.entity.startswith("node/")]
    node_events = [e for e in events if e.entity.startswith("node/") and e is not root]
    machine = _near(node_events, root)
    cascade = _collapse([e for e in rank_events if e is not root] +
                        [e for e in node_events if e not in machine])
    erring = {e.rank for e in events if e.rank is not None}
    silent = sorted(ranks - erring) if erring else []
    # a root named by its wording or as a symptom says nothing about the fault
    probable = root.fault_type if root is not None and basis == "signature" else None
    if root is not None and not root.entity.startswith("node/"):
        serious = [m for m in machine if m.fault_type is not None and m.level >= FaultLevel.DRAIN
                   and (root.node is None or m.node in (root.node, "unknown"))]
        if serious:
            probable = max(serious, key=lambda m: m.level).fault_type
    result = TriageResult(
        job=job, directory=str(directory), root=root, root_basis=basis, probable_cause=probable, cascade=cascade,
        machine_faults=machine, silent_ranks=silent, ranks=sorted(ranks),
        nodes=sorted({s.source.node for s in scans if s.source.kind == "node" and s.source.node}),
        files=len(scans), lines=sum(s.lines for s in scans), error_lines=len(events),
    )
    _physical_lines(result, scans)
    result.summary = _summary(result)
    return result


def _physical_lines(result: TriageResult, scans: list[_Scan]) -> None:
    """A file read with its cut lines joined (``_Unwrap``) was decided on by its whole lines: the lines named are
    numbered as in the file itself, each by its first cut."""
    cut = {scan.source.name: scan.unwrapped for scan in scans if scan.unwrapped is not None}
    rotated = {scan.source.name: scan.generations for scan in scans if scan.generations}
    if not cut and not rotated:
        return

    def physical(event: LogEvent) -> LogEvent:
        unwrap = cut.get(event.source)
        generations = rotated.get(event.source)
        if unwrap is None and generations is None:
            return event
        moved = event.model_copy(deep=True)  # the scans' own events keep the numbers decide() compared
        numbers = {"": event.lineno, **{key: moved.attrs[key]
                                       for key in (PRINTED_BEFORE_TRACEBACK, "removal_line", RESTART_LINE)
                                       if isinstance(moved.attrs.get(key), int) and moved.attrs[key] > 0}}
        if unwrap is not None:
            numbers = {key: unwrap.physical(n) for key, n in numbers.items()}
        if generations is not None:  # the generation a line was read from, numbered in it
            at = max(bisect.bisect_left([before for _, before in generations], numbers[""]) - 1, 0)
            moved.source = generations[at][0]
            numbers = {key: max(n - generations[at][1], 1) for key, n in numbers.items()}
        moved.lineno = numbers.pop("")
        moved.attrs.update(numbers)
        return moved

    result.root = None if result.root is None else physical(result.root)
    result.cascade = [physical(e) for e in result.cascade]
    result.machine_faults = [physical(e) for e in result.machine_faults]


def _short_host(name: str | None) -> str | None:
    return name.split(".")[0] if name else None


def _link_node_event(event: LogEvent, owners: dict[int, set[tuple[str | None, int]]],
                     hosts: dict[int, str]) -> None:
    """A kernel-log line names a pid (OOM killer, segfault, Xid): on that node, that pid may be a rank."""
    if not event.entity.startswith("node/"):
        return
    pid = str(event.attrs.get("pid", "")).strip()
    if pid.isdigit():
        candidates = owners.get(int(pid), set())
        here = {rank for host, rank in candidates if host == event.node}
        if not here and event.node in (None, "unknown"):
            here = {rank for _, rank in candidates}
        if not here:
            here = {rank for host, rank in candidates if host is None}
        if len(here) == 1:
            event.rank = here.pop()
            return
    on_node = sorted(r for r, host in hosts.items() if event.node and _short_host(host) == event.node)
    if on_node:
        event.attrs["ranks_on_node"] = on_node


def _link_launcher_event(event: LogEvent, job: str, single_node: bool) -> None:
    """A launcher line names the failed worker: its rank, or its local rank (= rank on one node)."""
    if event.rank is not None or event.entity.startswith("node/"):
        return
    named = event.attrs.get("rank")
    if named is None and single_node:
        named = event.attrs.get("local_rank")
    if named is not None and str(named).isdigit():
        event.rank = int(named)
        event.entity = rank_id(job, event.rank)


def _attribute_to_rank(root: LogEvent, events: list[LogEvent]) -> None:
    """A node fault with no pid belongs to the rank on that node that reports the same fault right after
    (a second of slack: many logs stamp whole seconds)."""
    if root.ts is None:
        return
    echoes = [e for e in events if e.rank is not None and e.node == root.node and _same_report(e, root)
              and e.ts is not None and root.ts - 1.0 <= e.ts <= root.ts + MACHINE_WINDOW_AFTER_S]
    if echoes:
        root.rank = min(echoes, key=_time_order).rank
        root.attrs["rank_from"] = "same fault reported by the rank"


def _switched_off_ports(events: list[LogEvent]) -> None:
    """A port state line right above its physical state "Disabled" is no root."""
    disabled = {(e.source, e.lineno - 1) for e in events if e.signature == PORT_DISABLED}
    if not disabled:
        return
    for event in events:
        if event.signature == PORT_DOWN and (event.source, event.lineno) in disabled:
            event.role = "cascade"


def _removed_devices(scans: list[_Scan]) -> None:
    """I/O rejected by a dead SCSI device whose removal the same kernel log records is no root: the removal's
    consequence (a disk pulled, deleted or unplugged on purpose is routine; a removal that a failing transport
    caused is named by that failure's own line, where a signature knows it)."""
    for scan in scans:
        if scan.removals is None:
            continue
        for event in scan.events:
            if event.signature != DEAD_DEVICE or event.role != "root":
                continue
            dead = _DEAD_DEVICE.search(event.line)
            removed = scan.removals.removal_of(dead["addr"], event.lineno) if dead is not None else None
            if removed is not None:
                event.role, event.level = "cascade", FaultLevel.OBSERVE
                event.attrs["removal_line"] = removed


def _agent_of(prefix: LinePrefix) -> str | None:
    """The node a relayed line came from, where its relay's prefix names one: pdsh's or syslog's host, srun --label's
    task (one torchrun agent a node), a pod. A rank's own prefix (``[rank3]:``) names a worker, not its node's agent."""
    if prefix.host is not None:
        return f"host {prefix.host}"
    if prefix.task is not None:
        return f"task {prefix.task}"
    if prefix.worker is not None and prefix.worker.startswith("pod/"):
        return prefix.worker
    return None


def _first_attempt(scans: list[_Scan], events: list[LogEvent], worded: list[LogEvent],
                   ) -> tuple[list[LogEvent], list[LogEvent], dict[tuple[str, str | None], int]]:
    """The lines that may be the root, where a launcher restarted its workers after a failure (``WORKERS_RESTART``):
    the lines below the first restart that ends an attempt with a failure in it are left out - a later attempt's errors
    are what that failure and the restart led to. A failure of the attempt is an error line or the agent's exit report
    between the attempt's start (the agent's last "Starting worker group" or restart above, else the file's first line)
    and the restart; a restart with none (an excerpt starting at it, an UNHEALTHY group with no report) cuts nothing.
    In a file whose lines name the node they came through (``_agent_of``), a node's restart bounds only that node's
    lines; where the restart names none, the whole file's. Also each (file, node) cut, with its restart line, so the
    verdict can say so."""
    cut: dict[tuple[str, str | None], int] = {}
    left_out: set[int] = set()
    restarted = {scan.source.name for scan in scans if scan.restarts}
    if not restarted:
        return events, worded, {}
    by_file: dict[str, list[LogEvent]] = defaultdict(list)
    for event in events + worded:
        if event.source in restarted:
            by_file[event.source].append(event)
    for scan in scans:
        if not scan.restarts:
            continue
        name, agents = scan.source.name, scan.agents
        lines = by_file[name]
        for agent in dict.fromkeys(agents.get(restart) for restart in scan.restarts):
            own = [e for e in lines if agent is None or agents.get(e.lineno) == agent]
            starts = [n for n in scan.starts if agent is None or agents.get(n) == agent]
            for restart in (n for n in scan.restarts if agents.get(n) == agent):
                begun = max((n for n in starts if n < restart), default=0)
                if any(begun < e.lineno < restart for e in own):
                    later = {id(e) for e in own if e.lineno > restart}
                    if later:
                        cut[(name, agent)] = restart
                        left_out |= later
                    break
    if not cut:
        return events, worded, {}
    return [e for e in events if id(e) not in left_out], [e for e in worded if id(e) not in left_out], cut


def _first_failed_attempt(scans: list[_Scan], events: list[LogEvent], worded: list[LogEvent],
                          ) -> tuple[list[LogEvent], list[LogEvent], dict[str, list[int]]]:
    """The lines that may be the root, where torchelastic's log directory holds several attempts of a run
    (``attempt_<N>``, numbered by the agent's restart count, so in the order they ran): only the first attempt whose
    files hold an error line - a later attempt fails on what that failure left (a checkpoint half written, a peer still
    gone). A line tagged a warning shows no failure: a handled warning ("[W socket.cpp:464] ... failed to connect"
    while the rendezvous retried) is no attempt's error, though the error wording in it reads so. Also, for each file
    of that attempt, the later attempts whose errors were left out."""
    attempts: dict[str, dict[int, list[str]]] = defaultdict(lambda: defaultdict(list))
    for scan in scans:
        if scan.source.attempt is not None and scan.source.run is not None:
            attempts[scan.source.run][scan.source.attempt].append(scan.source.name)
    erring = {e.source for e in events + worded if not warns(e.line)}
    left_out: set[str] = set()
    later: dict[str, list[int]] = {}
    for run in attempts.values():
        if len(run) < 2:
            continue
        failed = [n for n in sorted(run) if erring & set(run[n])]
        if len(failed) < 2:
            continue
        left_out |= {name for n in failed[1:] for name in run[n]}
        later.update({name: failed[1:] for name in run[failed[0]]})
    if not left_out:
        return events, worded, {}
    return [e for e in events if e.source not in left_out], [e for e in worded if e.source not in left_out], later


def _pick_root(events: list[LogEvent], priority: dict[str, int],
               tie_s: float) -> tuple[LogEvent | None, RootBasis | None]:
    # A process reports its own failure in order: within one file only the first root-like line counts
    # (an abort after an exception, a RuntimeError after a device-side assert are its consequences) -
    # unless a few lines below it the same fault is named more specifically (the kernel's assertion,
    # flushed after the host's "device-side assert triggered"), or by the same signature with more of its
    # fields filled in where the first filled none (NCCL's "Cuda failure 1 'invalid argument'" under PyTorch's
    # bare "unhandled cuda error"). Two handlers' reports of one fatal signal (``FATAL_SIGNAL_REPORTS``) are neither:
    # the first stands.
    last = len(priority)
    first_per_source: dict[str, LogEvent] = {}
    for event in events:
        if event.role != "root":
            continue
        first = first_per_source.get(event.source)
        if first is None or (_same_report(event, first)
                             and event.lineno - first.lineno <= SAME_REPORT_LINES
                             and not {event.signature, first.signature} <= FATAL_SIGNAL_REPORTS
                             and (priority.get(event.signature, last) < priority.get(first.signature, last)
                                  or (event.signature == first.signature
                                      and _detail(first) == 0 < _detail(event)))):
            first_per_source[event.source] = event
    for source, first in list(first_per_source.items()):
        if first.signature in BLOCKED_TASK_REPORTS:
            driver = [e for e in events if e.source == source and e.lineno < first.lineno
                      and e.signature.startswith(GPU_DRIVER_PREFIX)]
            if driver:
                earlier = min(driver, key=lambda e: e.lineno)
                earlier.role = "root"
                first_per_source[source] = earlier
    for source, first in list(first_per_source.items()):
        if first.signature in NVML_CLIENT_REPORTS:
            driver = [e for e in events if e.source == source and e.role == "root"
                      and e.signature.startswith(GPU_DRIVER_PREFIX) and _same_gpu(first, e)]
            if driver:
                first_per_source[source] = min(driver, key=lambda e: e.lineno)
    for source, first in list(first_per_source.items()):
        if first.fault_type is None and first.signature not in STEP_END_REPORTS:
            ended = [e for e in events if e.source == source and e.lineno > first.lineno
                     and e.role == "root" and e.signature in STEP_END_REPORTS]
            if ended:
                first_per_source[source] = min(ended, key=lambda e: e.lineno)
    roots = list(first_per_source.values())
    roots = [e for e in roots if e.signature not in PEER_FAILURE_REPORTS] or roots
    if not roots:
        return None, None
    timed = [e for e in roots if e.ts is not None]
    if timed:
        first_ts = min(e.ts for e in timed if e.ts is not None)
        # A kernel log with no wall-clock time (dmesg without -T stamps seconds since boot, an excerpt carries no boot
        # line to anchor them) cannot be placed before or after the stamped files: its report is not dropped for
        # having no time, it stands beside the earliest stamped one and what it names decides. So does a worker's
        # unstamped output where only torchelastic's error files carry a time (_recorded_only).
        unplaced = _recorded_only(timed)
        roots = [e for e in roots if (e.ts is None and (unplaced or e.entity.startswith("node/")))
                 or (e.ts is not None and e.ts <= first_ts + tie_s)]
    return min(roots, key=lambda e: (priority.get(e.signature, last), e.ts or 0.0, e.source, e.lineno)), "signature"


def _same_gpu(one: LogEvent, other: LogEvent) -> bool:
    """Whether two reports can be about one GPU: the same PCI bus and device (NVML writes 0000:A1:00.0 or
    00000000:A1:00.0, NVRM 0000:a1:00), or either names none."""
    found = [_PCI_BUS_DEVICE.search(str(e.attrs.get("pci") or "").lower()) for e in (one, other)]
    return any(m is None for m in found) or found[0].groups() == found[1].groups()  # type: ignore[union-attr]


def _nccl_detail(root: LogEvent | None, candidates: list[LogEvent]) -> LogEvent | None:
    """NCCL's "Last error:" detail under the root's report names what failed: it becomes the root, keeping the
    report's fault type when it has none of its own."""
    if root is None:
        return None
    details = [e for e in candidates if e.attrs.get(NCCL_LAST_ERROR) and e.source == root.source
               and 0 < e.lineno - root.lineno <= NCCL_REPORT_LINES + e.attrs.get(INTERLEAVED_ATTR, 0)]
    if not details:
        return root
    detail = min(details, key=lambda e: e.lineno)
    detail.role = "root"
    if detail.fault_type is None:
        detail.fault_type, detail.level = root.fault_type, max(root.level, detail.level)
    return detail


# Reports that name an NCCL error class and nothing else: PyTorch's "unhandled cuda error (run with NCCL_DEBUG=INFO
# for details)", "unhandled system error", "internal error". NCCL's own WARN line names what failed.
BARE_NCCL_REPORTS = frozenset({"cuda.other", "nccl.system_error", "nccl.internal_error"})


def _comm(line: str) -> str:
    """The communicator an NCCL Init / Destroy COMPLETE line names ("comm 0x55d1 ..."), "" when it names none."""
    named = _NCCL_COMM.search(line)
    return "" if named is None else named[1]


def _origin_key(line: str) -> str:
    """"host:pid" of an NCCL line ("node7:4410:4431 [0] ..."), "" when it names none."""
    origin = _NCCL_ORIGIN.match(line)
    return "" if origin is None else f"{origin['host']}:{origin['pid']}"


# nccl-tests name the host, and the pid, in their failure report: "node7: Test NCCL failure common.cu:892 '...' .. node7
# pid 4410: Test failure common.cu:844".
_NCCL_TEST_HOST = re.compile(r"^(?P<host>[\w.\-]+): Test NCCL failure\b")
_NCCL_TEST_PID = re.compile(r"\b(?P<host>[\w.\-]+) pid (?P<pid>\d+): Test failure\b")


def _other_stream(one: str, other: str) -> bool:
    """Whether two files are the two streams of one process (``job.out`` and ``job.err``, ``0/stdout.log`` and
    ``0/stderr.log``): unstamped lines in them have no order between them."""
    for first, second in _STREAM_SUFFIXES:
        for mine, theirs in ((first, second), (second, first)):
            if one.endswith(mine) and other.endswith(theirs) and one[:-len(mine)] == other[:-len(theirs)]:
                return True
    return False


def _unordered(one: LogEvent, other: LogEvent) -> bool:
    """Whether two events lie in the two streams of one process with no time to order them."""
    return (one.ts is None or other.ts is None) and _other_stream(one.source, other.source)


def _nccl_warn_detail(root: LogEvent | None, basis: RootBasis | None, worded: list[LogEvent],
                      events: list[LogEvent], traces: dict[str, dict[int, str]]) -> LogEvent | None:
    """A root that only names NCCL's error class gives way to NCCL's own WARN in the same file, which names what
    failed: above it within ``SAME_REPORT_LINES``, of the same process (NCCL warns as the call fails, traces the code
    up and returns it to the caller that reports it: "NCCL WARN Net : Connection closed by remote peer", "NCCL INFO
    transport/net_socket.cc:540 -> 2" over nccl-tests' "NCCL failure common.cu:921 'unhandled system error'"), the WARN
    heading the unbroken run of that process's WARN and trace lines right above the report, else the nearest; a WARN
    that reads only as generic error wording (RCCL's advisory 'Missing "iommu=pt"') is passed over. Else the first
    WARN a few lines below it (another process of the job printing the details its wrapper points to). With none in
    its file, the first such WARN in the file of its process's other stream, where no time orders it after the report
    (stdout and stderr written apart: NCCL warns on stderr, the caller may report on stdout)."""
    if root is None or basis != "signature" or root.signature not in BARE_NCCL_REPORTS or _detail(root) > 0:
        return root
    host = pid = None  # the process the report names, if it names one
    if (named := _NCCL_TEST_PID.search(root.line)) is not None:
        host, pid = named["host"], named["pid"]
    elif (named := _NCCL_TEST_HOST.match(root.line)) is not None:
        host = named["host"]
    elif (origin := _NCCL_ORIGIN.match(root.line)) is not None:
        host, pid = origin["host"], origin["pid"]
    warned = {e.lineno: e for e in events + worded if e.source == root.source and "NCCL WARN" in e.line
              and 0 < root.lineno - e.lineno <= SAME_REPORT_LINES}

    def same_process(e: LogEvent) -> bool:
        if e.rank is not None and root.rank is not None and e.rank != root.rank:
            return False
        if host is None:
            return True
        origin = _NCCL_ORIGIN.match(e.line)
        return origin is not None and origin["host"] == host and (pid is None or origin["pid"] == pid)

    above = {n: e for n, e in warned.items() if e.signature != WORDED_SIGNATURE and same_process(e)}
    if above:
        nearest = above[max(above)]
        key, trace_lines, head = _origin_key(nearest.line), traces.get(root.source, {}), None
        n = root.lineno - 1
        while n in warned and _origin_key(warned[n].line) == key or trace_lines.get(n) == key:
            head = n if n in above else head
            n -= 1
        return _hand_root(root, above[head] if head is not None else nearest)
    warns = [e for e in worded if e.source == root.source and "NCCL WARN" in e.line
             and 0 < e.lineno - root.lineno <= SAME_REPORT_LINES]
    if not warns:
        apart = [e for e in events + worded if "NCCL WARN" in e.line and _other_stream(root.source, e.source)
                 and (e.ts is None or root.ts is None or e.ts <= root.ts) and same_process(e)]
        if not apart:
            return root
        return _hand_root(root, min(apart, key=lambda e: (e.signature == WORDED_SIGNATURE, e.lineno)))
    return _hand_root(root, min(warns, key=lambda e: e.lineno))


def _child_last_words(root: LogEvent | None, worded: list[LogEvent]) -> LogEvent | None:
    """A root that reports a child process's death (a DataLoader worker) gives way to the specific error line printed
    right before the traceback that raised it: the child's own account of why it died."""
    if root is None or root.signature not in CHILD_DEATH_REPORTS or not root.attrs.get(PRINTED_BEFORE_TRACEBACK):
        return root
    before = root.attrs[PRINTED_BEFORE_TRACEBACK]
    words = [e for e in worded
             if e.source == root.source and e.lineno == before and e.attrs.get("strength") == SPECIFIC]
    if not words:
        return root
    return _hand_root(root, words[0])


def _errors_before_fatal(root: LogEvent | None, basis: RootBasis | None, worded: list[LogEvent]) -> LogEvent | None:
    """A daemon's fatal exit gives way to the first specific error line in the ``SAME_REPORT_LINES`` above it in the
    same file: the failure the daemon reported before it gave up, which the fatal line's own message often only
    relays."""
    if root is None or basis != "signature" or root.signature not in DAEMON_FATAL_SIGNATURES:
        return root
    before = [e for e in worded if e.source == root.source and e.attrs.get("strength") == SPECIFIC
              and 0 < root.lineno - e.lineno <= SAME_REPORT_LINES]
    if not before:
        return root
    return _hand_root(root, min(before, key=lambda e: e.lineno))


def _plain_line_above(root: LogEvent | None, basis: RootBasis | None, worded: list[LogEvent]) -> LogEvent | None:
    """A root named only by its specific wording gives way to the line right above it in the same file when that line
    reads as an error in generic words (no signature, no exception class, tag or failed call) and not as the echo of
    a failure elsewhere, nor as routine output a healthy job prints too (``severity.reports``: a line its logger tagged
    INFO, a metric such as "val error 0.12"): the plain first report of the failure, and the specific line under it a
    wrapper's or a relay's summary of it (Ray's "WARNING ... A worker died or was killed while executing a task by an
    unexpected system error" over the driver's "ERROR ... Unhandled error ...", squeue's "resolve_ctls_from_dns_srv:
    res_nsearch error: Unknown host" over "fetch_config: DNS SRV lookup failed")."""
    if root is None or basis != "error_wording" or root.attrs.get("strength") != SPECIFIC:
        return root
    above = [e for e in worded if e.source == root.source and e.lineno == root.lineno - 1
             and e.attrs.get("strength") == GENERIC and not echoes(e.line) and reports(e.line)]
    if not above:
        return root
    return _hand_root(root, above[0])


def _hand_root(root: LogEvent, line: LogEvent) -> LogEvent:
    """``line`` becomes the root in ``root``'s place: it names what failed, ``root`` only which fault it was."""
    line.role = "root"
    line.fault_type, line.level = root.fault_type, max(root.level, line.level)
    return line


def _detail(event: LogEvent) -> int:
    """How many of its signature's fields a line filled in (traceback context not counted)."""
    return sum(1 for key, value in event.attrs.items() if key not in _CONTEXT_ATTRS and value not in (None, ""))


def _same_report(one: LogEvent, other: LogEvent) -> bool:
    """Whether two lines report one failure: the same fault, the same RCA symptom or the same signature."""
    return (one.signature == other.signature or (one.fault_type is not None and one.fault_type == other.fault_type)
            or (one.symptom is not None and one.symptom == other.symptom))


def _fallback_root(worded: list[LogEvent], symptoms: list[LogEvent], tie_s: float = 1.0,
                   starts: dict[str, list[int]] | None = None) -> tuple[LogEvent | None, RootBasis | None]:
    """No signature names a root: the earliest specific error wording, else the earliest symptom that is not a
    timeout or watchdog report (the exit code a ChildFailedError report gives as its root cause counts as one), else
    the earliest echo of a failure elsewhere, else a process's take-down after one, else an abort, else the earliest
    generic error wording.

    Wording printed below a ChildFailedError report's root cause in the same file does not count: the launcher's
    report closes the job's own output, and an ERROR after it is its caller relaying the exit (SageMaker's "Reporting
    training FAILURE", a compile driver's "There was an error in the training script"). Nor does wording printed
    within ``SAME_REPORT_LINES`` below a process's report that the node is not ready (``CONDITION_REPORTS``)."""
    report_at: dict[str, int] = {}
    for event in symptoms:
        if event.attrs.get(FIRST_OBSERVED):
            report_at[event.source] = min(report_at.get(event.source, event.lineno), event.lineno)
    if report_at:
        worded = [e for e in worded if e.lineno < report_at.get(e.source, e.lineno + 1)]
        # nor wording in the process's other stream stamped after the report (its unstamped lines take the stamp below)
        reports = [e for e in symptoms if e.attrs.get(FIRST_OBSERVED) and e.ts is not None]
        worded = [e for e in worded if not any(e.ts is not None and e.ts >= r.ts  # type: ignore[operator]
                                               and _other_stream(r.source, e.source) for r in reports)]
    conditions = [e for e in symptoms if e.signature in CONDITION_REPORTS]
    worded = [e for e in worded if not any(c.source == e.source and 0 < e.lineno - c.lineno <= SAME_REPORT_LINES
                                           for c in conditions)]
    specific = [e for e in worded if e.attrs.get("strength") == SPECIFIC]
    if specific:
        return _earliest(specific, tie_s), "error_wording"
    symptoms = _closing_signals_yield(symptoms, starts or {})
    direct = [e for e in symptoms if e.attrs.get(FIRST_OBSERVED)
              or e.signature not in ECHO_SIGNATURES | ABORT_SIGNATURES]
    echoes = [e for e in symptoms if e.signature not in ABORT_SIGNATURES | FOLLOW_THROUGH_SIGNATURES]
    follow_through = [e for e in symptoms if e.signature in FOLLOW_THROUGH_SIGNATURES]
    if symptoms:
        root = _earliest(_launcher_yields(direct or echoes or follow_through or symptoms), tie_s)
        words = _child_words_above(root, worded, symptoms, starts or {})
        return (root, "symptom") if words is None else (words, "error_wording")
    if worded:
        return _earliest(worded, tie_s), "error_wording"
    return None, None


def _child_words_above(root: LogEvent, worded: list[LogEvent], symptoms: list[LogEvent],
                       starts: dict[str, list[int]]) -> LogEvent | None:
    """The child's own words above a launcher's report of its end (``WRAPPER_REPORTS``): the earliest line of error
    wording, generic words included, printed in the same file within ``SAME_REPORT_LINES`` above the launcher's first
    such report, below the launcher's last start of its workers before it (``WORKERS_START``: an earlier attempt's
    words are what it recovered from) and not stamped after it - else in the other stream of the process, where no
    time orders it against the report (the child's words on stdout, the launcher's on stderr) - that reads as a report
    of a failure (``severity.reports``) and not as the echo of one elsewhere. None when the root is no launcher's
    report or nothing of the child's reads as an error."""
    if root.signature not in WRAPPER_REPORTS:
        return None
    first = min(e.lineno for e in symptoms if e.source == root.source and e.signature in WRAPPER_REPORTS)
    floor = max([first - SAME_REPORT_LINES - 1] + [n for n in starts.get(root.source, ()) if n < first])
    before = [e for e in worded if e.source == root.source and floor < e.lineno < first
              and (e.ts is None or root.ts is None or e.ts <= root.ts)]
    words = [e for e in before + [e for e in worded if _unordered(root, e)] if reports(e.line) and not echoes(e.line)]
    if not words:
        return None
    return _hand_root(root, min(words, key=lambda e: (e.source != root.source, e.lineno)))


def _closing_signals_yield(symptoms: list[LogEvent], starts: dict[str, list[int]]) -> list[LogEvent]:
    """torchelastic's closing signals to the workers still running (``CLOSING_SIGNAL``) left out where the report of
    the failure that made the agent send them (``EXIT_REPORT``) follows in one file before the agent starts its workers
    again (``WORKERS_START``): one ``_close`` sends a signal to each running worker and waits for them, however many
    lines that takes, before ``_poll`` logs the report."""
    reports = [e for e in symptoms if EXIT_REPORT.search(e.line)]

    def reported_after(signal: LogEvent) -> bool:
        return any(r.source == signal.source and r.lineno > signal.lineno
                   and not any(signal.lineno < s < r.lineno for s in starts.get(signal.source, ()))
                   for r in reports)

    return [e for e in symptoms if not (CLOSING_SIGNAL.search(e.line) and reported_after(e))]


def _launcher_yields(events: list[LogEvent]) -> list[LogEvent]:
    """A launcher's report of its child's end left out where the child's own report lies in the other stream of the
    process, unordered against it (in one file, or stamped, time and line order say which came first)."""
    kept = [e for e in events if e.signature not in LAUNCHER_REPORTS
            or not any(o.signature not in LAUNCHER_REPORTS and _unordered(e, o) for o in events)]
    return kept or events


def _earliest(events: list[LogEvent], tie_s: float) -> LogEvent:
    """The earliest event; stamps within ``tie_s`` of the earliest count as one moment, decided by file order
    (ranks that stamp the same collective's timeout a fraction of a second apart did not fail in that order)."""
    stamped = [e for e in events if e.ts is not None]
    if not stamped:
        return min(events, key=_time_order)
    first = min(e.ts for e in stamped if e.ts is not None)
    unplaced = _recorded_only(stamped)
    return min((e for e in events if (e.ts is None and unplaced) or (e.ts is not None and e.ts <= first + tie_s)),
               key=lambda e: (e.source, e.lineno))


def _recorded_only(stamped: list[LogEvent]) -> bool:
    """Whether all the stamped events come from torchelastic's error files. Only a worker that ``@record`` caught
    writes one: a worker killed by a signal (a segfault, the abort after a CUDA error in C++) leaves only its unstamped
    output, and may have failed first - the error files' times place no unstamped line after them."""
    return all(PurePosixPath(e.source).name == ERROR_FILE_NAME for e in stamped)


def _near(node_events: list[LogEvent], root: LogEvent | None) -> list[LogEvent]:
    if root is None or root.ts is None:
        return _collapse(node_events)
    start, end = root.ts - MACHINE_WINDOW_BEFORE_S, root.ts + MACHINE_WINDOW_AFTER_S
    return _collapse([e for e in node_events if e.ts is None or start <= e.ts <= end])


def _collapse(events: list[LogEvent]) -> list[LogEvent]:
    """The first event per (entity, fault type), counting the repeats: 1,000 ranks, not 100,000 lines."""
    counts = Counter((e.entity, e.kind) for e in events)
    first: dict[tuple[str, str], LogEvent] = {}
    for event in sorted(events, key=_time_order):
        key = (event.entity, event.kind)
        if key not in first:
            first[key] = event.model_copy(update={"count": counts[key]})
    return list(first.values())


def _time_order(event: LogEvent) -> tuple[float, str, int]:
    return (event.ts if event.ts is not None else float("inf"), event.source, event.lineno)


def _summary(result: TriageResult) -> str:
    root = result.root
    if root is None:
        if result.cascade:
            where = f"; silent ranks {result.silent_ranks}" if result.silent_ranks else ""
            return f"no root error found, only symptoms ({len(result.cascade)} cascade events){where}"
        return "no error lines found"
    who = f"rank {root.rank}" if root.rank is not None else root.entity
    if result.root_basis == "signature":
        text = f"root error on {who}: {root.kind} ({root.signature}) at {root.source}:{root.lineno}"
    elif result.root_basis == "symptom":
        text = f"no root signature; earliest symptom on {who}: {root.kind} at {root.source}:{root.lineno}"
    else:
        text = f"no root signature; earliest error line on {who} at {root.source}:{root.lineno}"
    if isinstance(attempt := root.attrs.get(ATTEMPT_ATTR), int):
        text += f"; in torchelastic's attempt {attempt}"
        if later := root.attrs.get(LATER_ATTEMPTS_ATTR):
            text += (", the first failed one (later attempts' errors, in "
                     + ", ".join(f"attempt_{n}" for n in later) + ", not taken for the root)")
    if isinstance(restart := root.attrs.get(RESTART_LINE), int):
        text += (f"; the first failed attempt's, torchelastic restarting the worker group at {root.source}:{restart}"
                 " (later attempts' errors not taken for the root)")
    if result.probable_cause and result.probable_cause != root.fault_type:
        text += f"; linked machine fault: {result.probable_cause}"
    if result.cascade:
        affected = len({e.entity for e in result.cascade})
        text += f"; cascade on {affected} other entities"
    if result.root_basis != "signature" and result.silent_ranks:
        text += f"; silent ranks {result.silent_ranks}"
    return text
