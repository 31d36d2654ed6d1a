"""What each file of a failed job's log directory is: the log of one rank, a node's kernel log, or a
job-wide log whose lines carry rank prefixes (``[rank3]:`` from torchrun, ``[default3]:`` from older
elastic launchers).

Conventions understood (any mix): ``rank_3.log``, ``worker-3.err``, ``rank3.stderr``; torchrun's
``<log_dir>/<run>/attempt_0/3/stderr.log``; kernel logs named ``dmesg``, ``kern``, ``syslog``,
``messages``, ``journal`` or ``kmsg`` (``n012.dmesg.log``, ``dmesg-n012.txt``, ``n012/kern.log``).
A rank or node directory (``n012/rank_3.log``) names the node.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from vigil.model import VigilInputError

SourceKind = Literal["rank", "node", "job"]

_NODE_WORDS = re.compile(r"(?i)(dmesg|kern(?:el)?|syslog|messages|journal(?:ctl)?|kmsg)")
_RANK_IN_NAME = re.compile(r"(?i)(?:^|[^a-z])(?:rank|worker|proc|process)[_\-.]?(\d+)")
_TORCHRUN_STREAM = re.compile(r"(?i)^(?:stdout|stderr|error)\.(?:log|txt|json)$")
_NAME_CHARS = re.compile(r"[^A-Za-z0-9_.:\-]+")
_LOG_SUFFIXES = {".log", ".txt", ".err", ".out", ".stderr", ".stdout", ""}


@dataclass(frozen=True)
class LogSource:
    path: Path
    name: str  # path relative to the job directory
    kind: SourceKind
    rank: int | None
    node: str | None


def entity_name(text: str, fallback: str) -> str:
    """A string made safe for an entity id (node/<name>, job/<name>)."""
    cleaned = _NAME_CHARS.sub("-", text).strip("-._:")
    return cleaned or fallback


def discover(directory: Path) -> list[LogSource]:
    """Every log file under ``directory``, classified; raises a one-line error if there is none. A single
    file (a Slurm job's ``slurm-<id>.out``, one launcher's combined log) is a job of that one file."""
    if directory.is_file():
        return [classify(directory, directory.parent)]
    if not directory.exists():
        raise VigilInputError(f"log directory {directory} does not exist")
    if not directory.is_dir():
        raise VigilInputError(f"log path {directory} is neither a directory nor a regular file")
    sources = []
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        suffixes = "".join(path.suffixes[-1:]).lower()
        if suffixes not in _LOG_SUFFIXES and not _NODE_WORDS.search(path.name):
            continue
        sources.append(classify(path, directory))
    if not sources:
        raise VigilInputError(f"log directory {directory} holds no log files (*.log, *.txt, *.err, *.out)")
    return sources


def classify(path: Path, root: Path) -> LogSource:
    name = path.relative_to(root).as_posix()
    parent = path.parent.name if path.parent != root else ""
    stem = path.name.split(".")[0] if not path.name.startswith(".") else path.name
    if _NODE_WORDS.search(path.name):
        leftover = _NODE_WORDS.sub("", path.name)
        leftover = re.sub(r"(?i)\.(log|txt|out)$", "", leftover).strip("-_.")
        return LogSource(path, name, "node", None, entity_name(leftover or parent, "unknown"))
    node = entity_name(parent, "") or None
    found = _RANK_IN_NAME.search(path.name) or _RANK_IN_NAME.search(stem)
    if found:
        return LogSource(path, name, "rank", int(found.group(1)), _node_of_rank_dir(path, root))
    if _TORCHRUN_STREAM.match(path.name) and parent.isdigit():
        return LogSource(path, name, "rank", int(parent), None)
    return LogSource(path, name, "job", None, node)


def _node_of_rank_dir(path: Path, root: Path) -> str | None:
    parent = path.parent
    if parent == root or _RANK_IN_NAME.search(parent.name) or parent.name.isdigit():
        return None
    return entity_name(parent.name, "") or None
