"""How strongly a log line that no signature knows reads as an error: the generic fallback of triage.

When no signature names a root line, triage still names the earliest, most specific error line rather than
nothing. ``strength`` grades a line from its wording alone, with nothing specific to one library:

* 2, specific: the line names what failed - an exception class with its message (``DistNetworkError: ...``),
  an NCCL ``WARN``, a failed assertion, an ``ERROR`` / glog ``E``/``F`` severity tag (``[E429 13:55:49...]``,
  the month not zero-padded in PyTorch's c10 logs; also after a ``[rankN]:`` prefix inside the line, where the
  rank's stderr landed on the end of a progress bar that had not printed its newline; also the E/F tag of the
  TensorFlow / XLA (TSL) log prefix, ``2025-04-05 18:39:10.837611: E external/xla/...cc:962]``, which JAX, XLA and
  Horovod print through), "... failed:", "cannot", "could not", "couldn't", "unable to" (also capitalised, as they
  open a message: "Couldn't find any optimal provider"), "Fatal", a process reported ``Killed``, a fatal signal by
  name ("Segmentation fault", "Bus error", "core dumped", "Caught signal 11").
* 1, generic: only an error word ("error", "failure", "exception") - or a specific line that reads as the
  echo of a failure elsewhere (a timeout, a watchdog, a closing signal), which is what every healthy peer
  prints once one rank is gone, or as a process's follow-through on a failure it already reported ("preparing to
  dump debug info" before the heartbeat monitor terminates it; "Stack trace of the failed collective:", the header
  under which PyTorch's watchdog prints the flight recorder's stack of the collective it just timed out).
* 0: not an error line (NCCL ``INFO`` unwinding such as ``net.cc:1302 -> 6``, traceback frames, a problem its
  producer says it ignored: PMIx's "unable to open mca_<component>: ... (ignored)", the headings of NCCL's RAS
  report: its table's "Status  Errors" columns and its "Errors" / "Warnings" sections, printed even when empty; the
  GPU driver container's NVSwitch probe: "ls: cannot access '/proc/driver/nvidia-nvswitch/devices/*'" on a node
  without NVSwitches; the Kubeflow training operator's replica tally "PyTorchJob=NAME, ReplicaType=Worker expected=1,
  running=0, succeeded=0, failed=1, Replicas=1"); compute-sanitizer's "========= ERROR SUMMARY: N errors" tally).
"""

from __future__ import annotations

import re

SPECIFIC = 2
GENERIC = 1

_NOT_AN_ERROR = re.compile(
    r"NCCL INFO|^\s*File \"|^\s*frame #\d+|Traceback \(most recent call last\)"
    r"|\(ignored\)\s*$"  # a problem its producer says it skipped (PMIx / Open MPI: a component it could not open)
    # NCCL's RAS report (src/ras/client_support.cc): its communicator table's column header ("... Status  Errors") and
    # its section headings "Errors" / "Warnings" are printed whether or not anything is found under them
    r"|^Group +Comms +Nodes +Ranks\b.*\bErrors\s*$|^(?:Errors|Warnings)\s*$"
    # the GPU operator's driver container (nvidia-driver, _assert_nvswitch_system) lists the NVSwitch devices to
    # decide whether the node has any; on a node without them ls says so and the script carries on
    r"|ls: cannot access '/proc/driver/nvidia-nvswitch/devices/\*'"
    # the Kubeflow training operator's replica count at each reconcile (pytorchjob_controller.go UpdateJobStatus:
    # "PyTorchJob=NAME, ReplicaType=Master expected=1, running=0, succeeded=0, failed=1, Replicas=1"; TFJob, XGBoostJob,
    # ElasticJob alike): a tally, printed with failed=0 too; the pod's exit and the job's condition are the report
    r"|\b\w*Job=\S+, ReplicaType=\w+ expected=-?\d+, running=\d+,"
    # compute-sanitizer's / cuda-memcheck's tally at the end of its run ("========= ERROR SUMMARY: 0 errors"), printed
    # on a clean run too; the records above it are the report
    r"|^=+ ERROR SUMMARY: \d+ errors?\s*$"
)
_SPECIFIC = re.compile(
    r"NCCL WARN"
    r"|\b[A-Z][A-Za-z]*(?:Error|Exception|Failure)\b(?::|\s*$)"
    r"|\bAssertion\b.*\bfailed\b"
    r"|\bFatal\b|\bFATAL\b|\bpanic\b|\bAborted\b"
    r"|(?:^|[\s\]|])Killed\.?\s*$"
    r"|\b[Ss]egmentation fault\b|\b[Bb]us error\b|\bcore dumped\b|\bCaught signal \d+"
    r"|^\[?[EF]\d{3,4} |\[rank\d+\]:\[[EF]\d{3,4} |\[[EF] [\w.]+:\d+\]|\[ERROR\]|\bERROR\b"
    r"|:\d\d\.[ \d]{6}: [EF](?: +\d+)? \S+:\d+\] "  # TSL's prefix: time.micros: severity [tid] file:line]
    r"|\b(?:[Ff]ailed|[Cc]annot|[Cc]ould not|[Cc]ouldn't|[Uu]nable to)\b"
)
_GENERIC = re.compile(r"(?i)\b(?:error|errors|failure|exception)\b")
# What a healthy peer prints once the failing rank is gone, or what a process does after reporting its failure
# (dumping debug info before it is terminated): never more than generic.
_ECHO = re.compile(r"(?i)time(?:d)? ?out|watchdog|closing signal|SIGTERM|ChildFailedError|heartbeat"
                   r"|dump(?:ing)? debug info|Stack trace of the failed collective")


# glog's own severity tag I (information): what such a line names is something the process noted and went on from
# (JAX probing for a backend it does not have: "I0223 ... Unable to initialize backend 'rocm': NOT_FOUND: ..."), generic
# at most.
_GLOG_INFO = re.compile(r"\[?I\d{4} \d\d:\d\d:\d\d")


# A line its producer tagged a warning: glog's W severity ("W0213 12:07:19", c10's "[W213 12:07:19" and
# "[W socket.cpp:464]"), Python's warnings ("UserWarning: "), a logger's WARNING level. NCCL's "NCCL WARN" is no such
# tag: NCCL reports its errors at WARN.
_WARNING_TAG = re.compile(r"^\[?W\d{3,4} |\[rank\d+\]:\[W\d{3,4} |\[W [\w.]+:\d+\]|\b[A-Z]\w*Warning: |\bWARNING\b")


def warns(line: str) -> bool:
    """Whether the line is tagged a warning: its producer noted something and went on."""
    return _WARNING_TAG.search(line) is not None


def strength(line: str) -> int:
    """0 (not an error), GENERIC or SPECIFIC, from the wording of one line."""
    if _NOT_AN_ERROR.search(line):
        return 0
    if _SPECIFIC.search(line):
        return GENERIC if _ECHO.search(line) or _GLOG_INFO.match(line) else SPECIFIC
    return GENERIC if _GENERIC.search(line) else 0


# A line its own logger tagged as information (``INFO``, ``DEBUG``, ``TRACE``, glog's ``I``), or whose error word is a
# measured value ("val error 0.12", "errors=0", "failure rate: 0.0"): what a healthy job prints every step.
_NOT_A_REPORT = re.compile(
    r"\b(?:INFO|DEBUG|TRACE)\b|^\[?I\d{4} "
    # key=value, a fraction ("error 0.12", "error: 3.5%"), or a count or rate ("errors: 0", "failure rate 1"); not
    # an error code ("CUDA error 700", "error: 404")
    r"|(?i:\b(?:error|failure|exception)s?(?:[ _-]?(?:rate|count|ratio))?\s*(?:=\s*[-+]?\.?\d|:?\s*[-+]?\d*\.\d)"
    r"|\b(?:errors|failures|exceptions|(?:error|failure|exception)[ _-]?(?:rate|count|ratio))\s*:?\s*\d"
    # none counted: "finished with 0 errors", "no failures"
    r"|\b(?:0|no|zero) (?:errors|failures|exceptions)\b)"
)


def reports(line: str) -> bool:
    """Whether a line of generic error wording reads as a report of a failure, not as routine output a healthy job
    prints too: not tagged information by its own logger, and its error word not a measured value."""
    return _NOT_A_REPORT.search(line) is None


def echoes(line: str) -> bool:
    """Whether the line's wording reads as the echo of a failure elsewhere or a process's follow-through on one
    (a timeout, a watchdog, a closing signal, dumping debug info): generic at most, whatever else it says."""
    return _ECHO.search(line) is not None
