"""The prefix a launcher or log collector puts before each line it relays, and what it says of the line's source.

A job-wide log holds many processes' lines, each under its relay's prefix: torchrun's ``[rank3]:`` / ``[default3]:``
(``--tee``, ``--local-ranks-filter``; accelerate launches through it), Ray's ``(RayTrainWorker pid=123, ip=10.0.0.1)``
(SkyPilot runs its tasks as Ray tasks named ``head, rank=0,``), ``srun --label``'s ``0: ``, Open MPI's
``--tag-output`` ``[1,0]<stderr>:`` (Horovod's too), pdsh's ``host: `` (DeepSpeed's multi-node runner),
``kubectl logs --prefix``'s ``[pod/NAME/CONTAINER] ``, docker compose's ``service-1  | ``, the CRI log format
``2024-...Z stderr F ``, ``docker logs -t`` / ``kubectl logs --timestamps``' ``2024-...Z ``, syslog / journald's
short format and moreutils' ``ts`` (``Dec 07 08:01:02 ``). :func:`split_prefix` peels them (a relay's prefix may
stand before another's) and yields the line as its process wrote it, with the rank, host and worker the prefixes name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# torch's prefix on a distributed rank's output ("[rank3]: ValueError: ..."; torchrun's --tee "[default3]:"): the
# rank wrote the line, the text after it is what it said. ``scope`` tells them apart: "rank" numbers the global
# rank, "default" torchrun's local rank on its node, which names no rank of the job on its own.
_TORCHRUN = r"\[(?P<scope>rank|default)(?P<rank>\d+)\]:\s?"
LINE_RANK_PREFIX = re.compile("^" + _TORCHRUN)
# The layers, each a pattern tried at the head of the line that names its fields, grouped by the character they can
# start with: most lines of a log carry no prefix, and a line is tried only against the layers its first character
# allows, behind a cheap test of the separator the layer needs (": ", "| ", a space at the fourth character, an ISO
# "T"). Colour codes around Ray's prefix are what its driver prints to a terminal (colorama's colour, RESET_ALL),
# kept when the output is captured.
_ANSI = r"(?:\x1b\[[\d;]*m)*"
_RAY = (rf"{_ANSI}\((?P<ray>(?P<ray_name>[^()]*?)pid=(?P<ray_pid>\d+)(?:, ip=(?P<ray_ip>[^)\s]+))?"
        rf"|(?P<ray_daemon>raylet|autoscaler \+\w+)(?:, ip=(?P<daemon_ip>[^)\s]+))?)\){_ANSI} ")
_MPI = (r"(?P<mpi_time>(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4})?"
        r"\[\d+,(?P<mpi_rank>\d+)\]<(?:stdout|stderr|stddiag)>: ?")
_KUBECTL = r"\[pod/(?P<pod>[^/\]\s]+)/(?P<container>[^\]\s]+)\] "
_ISO_TIME = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)"
_CRI = rf"(?P<cri>{_ISO_TIME}) (?:stdout|stderr) [FP] "
# `docker logs -t` (the json-file driver's time, RFC3339NanoFixed) and `kubectl logs --timestamps` (the CRI line's
# time, RFC3339Nano): the time and one space before the line as the process wrote it. Tried after the syslog header,
# whose ISO form starts the same way.
_RELAY_TIME = rf"(?P<relay_time>{_ISO_TIME}) "
# The host starts with a lower-case letter or a digit (host names are written in lower case): after a relay's ISO
# time, "Last error: " or "Process 42: " is the line itself, not a host and a program.
_SYSLOG = (rf"(?P<syslog>(?:\w{{3}} [ \d]\d \d\d:\d\d:\d\d|{_ISO_TIME}) "
           r"(?P<syslog_host>[a-z\d][\w.\-]*) [\w.\-/@]+(?:\[\d+\])?: )")
# moreutils' `ts` in a pipe (`python train.py 2>&1 | ts`): its default time, "%b %d %H:%M:%S", and a space before the
# line - syslog's short time without a host or a program after it. Tried after the syslog header.
_SHORT_TIME = r"(?P<short_time>(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)?) "
_SERVICE = r"(?P<service>[A-Za-z][\w.\-]*?[-_]\d+) *\| "
_TASK = r" *(?P<task>\d+): "
# pdsh's host: a host name or address (a word with a digit in it, or localhost - never an exception's class), and not
# one of the kernel's device names that lead its own lines ("nvme0n1: Read(0x2) @ LBA ...", "mlx5_0: ...", "eth0: ...").
_HOST = r"(?P<host>[a-z0-9][a-z0-9_.\-]*): "
_HOST_LIKE = re.compile(r"localhost$|(?!(?:nvme\d+n\d+|mlx\d+_\d+|eth\d+|ib\d+|md\d+|dm-\d+|loop\d+|nbd\d+|en[ops]\w+|"
                        r"hfi\d+_\d+|bnxt_re\d+|sd[a-z]+\d*)$).*\d")
_BRACKET = re.compile("|".join((_MPI, _KUBECTL)))
_PAREN = re.compile(_RAY)
_DIGIT = re.compile("|".join((_CRI, _SYSLOG, _RELAY_TIME, _TASK, _HOST)))
_SPACE = re.compile(_TASK)
_UPPER = re.compile("|".join((_SYSLOG, _SHORT_TIME, _MPI, _SERVICE)))
_LOWER = re.compile("|".join((_SERVICE, _HOST)))
_HOSTED = (_DIGIT, _LOWER)
# What every layer's head looks like, in one pattern: most lines fail it at their first few characters.
_MAYBE = re.compile(r"[\[(\x1b]| +\d|\d{4}-\d\d-\d\dT|[A-Z][a-z]{2} |[A-Za-z0-9][^ :|]{0,78}+(?:: | +\| )")
_HEAD = 80  # how far into a line a prefix's separator may stand

_SKYPILOT_RANK = re.compile(r"\brank=(?P<rank>\d+)\b")
# Ray's driver prints a line that several workers printed once, with how many did (ray_logging's deduplicator), and
# the first time a note on how to turn that off.
_RAY_REPEATED = re.compile(r" ?(?:\x1b\[[\d;]*m)*\[repeated (?P<times>\d+)x across cluster\](?:\x1b\[[\d;]*m)*"
                           r"(?: \(Ray deduplicates logs by default\..*\))?$")
_MAX_LAYERS = 4


@dataclass(slots=True)
class LinePrefix:
    """What the prefixes before a line said: the line as its process wrote it and the source they name."""

    payload: str
    rank: int | None = None
    rank_scope: str | None = None  # "rank" (the job's rank), "default" (a local rank), "task", "mpi", "node"
    host: str | None = None
    worker: str | None = None  # the relay's own name for the process (Ray's actor and pid, a pod, a service)
    timed: bool = False  # a prefix carried the line's time (syslog, CRI): read the time from the whole line
    syslog: bool = False  # a syslog header: signatures may name its program ("slurmctld[42]: fatal: ...")
    repeated: int | None = None  # Ray's "[repeated Nx across cluster]"
    task: int | None = None  # srun --label's task number, kept when an inner prefix names the rank


def split_prefix(line: str) -> LinePrefix | None:
    """The launcher and collector prefixes before ``line`` peeled off, or None when it carries none."""
    if line[:1] == "[":
        found = LINE_RANK_PREFIX.match(line)
        if found is not None:  # the commonest, alone before a line: read without the other layers'
            payload = line[found.end():]
            if _MAYBE.match(payload) is None and "across cluster]" not in payload:
                return LinePrefix(payload, int(found["rank"]), found["scope"])
    elif _MAYBE.match(line) is None:
        return None
    found = _layer(line)
    if found is None:
        return None
    prefix = LinePrefix(line)
    for _ in range(_MAX_LAYERS):
        if found.re is LINE_RANK_PREFIX:  # the commonest, read without the other layers' fields
            prefix.rank, prefix.rank_scope = int(found["rank"]), found["scope"]
        else:
            _read_layer(prefix, found)
        prefix.payload = prefix.payload[found.end():]
        found = _layer(prefix.payload) if _MAYBE.match(prefix.payload) else None
        if found is None:
            break
    if "across cluster]" in prefix.payload and (repeated := _RAY_REPEATED.search(prefix.payload)):
        prefix.payload = prefix.payload[:repeated.start()]
        prefix.repeated = int(repeated["times"])
    return prefix


def _layer(line: str) -> re.Match[str] | None:
    """The prefix layer at the head of ``line``, or None."""
    first = line[:1]
    if first == "[":
        return LINE_RANK_PREFIX.match(line) or _BRACKET.match(line)
    if first == "(" or first == "\x1b":
        return _PAREN.match(line)
    if first == " ":
        return _SPACE.match(line)
    if not first.isalnum():
        return None
    # a task number, a host or a service ends at the line's first space (its ":" right before it, or the "|" after
    # the padding); a time stands at the head with its fixed width
    space = line.find(" ", 0, _HEAD)
    named = space > 0 and (line[space - 1] == ":" or line.find("| ", space, space + 40) > 0)
    if first.isdigit():
        found = _DIGIT.match(line) if named or line[10:11] == "T" else None
    elif first.isupper():
        found = _UPPER.match(line) if named or space == 3 else None
    else:
        found = _LOWER.match(line) if named else None
    if found is not None and found.re in _HOSTED and (host := found["host"]) is not None \
            and not _HOST_LIKE.match(host):
        return None
    return found


def _read_layer(prefix: LinePrefix, found: re.Match[str]) -> None:
    """Record what one layer names; an inner layer (nearer the line) names the process more closely."""
    fields = found.groupdict()
    if fields.get("ray") is not None:
        name = fields.get("ray_name") or ""
        prefix.worker = f"{name}pid={fields['ray_pid']}" if fields.get("ray_pid") else fields.get("ray_daemon")
        prefix.host = fields.get("ray_ip") or fields.get("daemon_ip") or prefix.host
        if skypilot := _SKYPILOT_RANK.search(name):  # SkyPilot's node rank: "worker1, rank=1,"
            prefix.rank, prefix.rank_scope = int(skypilot["rank"]), "node"
            prefix.host = prefix.host or name.split(",", 1)[0]
    elif fields.get("mpi_rank") is not None:
        prefix.rank, prefix.rank_scope = int(fields["mpi_rank"]), "mpi"
        prefix.timed = prefix.timed or fields.get("mpi_time") is not None
    elif fields.get("pod") is not None:
        prefix.worker = f"pod/{fields['pod']}/{fields['container']}"
    elif fields.get("cri") is not None or fields.get("relay_time") is not None or fields.get("short_time") is not None:
        prefix.timed = True
    elif fields.get("syslog") is not None:
        prefix.timed, prefix.syslog, prefix.host = True, True, fields.get("syslog_host")
    elif fields.get("service") is not None:
        prefix.worker = fields.get("service")
    elif fields.get("task") is not None:
        prefix.rank, prefix.rank_scope = int(fields["task"]), "task"
        prefix.task = prefix.rank if prefix.task is None else prefix.task
    else:
        prefix.host = fields.get("host")
