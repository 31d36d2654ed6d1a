"""What each file of a failed job's log directory is: the log of one rank, a node's kernel log, or a
job-wide log whose lines carry rank prefixes (``[rank3]:`` from torchrun, ``[default3]:`` from older
elastic launchers).

Conventions understood (any mix): ``rank_3.log``, ``worker-3.err``, ``rank3.stderr``; torchrun's
``<log_dir>/<run_id>_<random>/attempt_<N>/<local_rank>/{stdout.log,stderr.log,error.json}``
(torch/distributed/elastic/multiprocessing/api.py ``DefaultLogsSpecs.reify``: one directory per attempt, numbered by
the agent's restart count; ``error.json`` is what ``@record`` wrote, read by :mod:`vigil.knowledge.error_file`); kernel
logs named ``dmesg``, ``kern``, ``syslog``, ``messages``, ``journal`` or ``kmsg`` (``n012.dmesg.log``,
``dmesg-n012.txt``, ``n012/kern.log``).
A rank or node directory (``n012/rank_3.log``) names the node.

Rotated generations are one stream: ``train.log.2.gz``, ``train.log.1`` and ``train.log`` (logrotate's numbered
generations, the highest the oldest; Python's RotatingFileHandler names them the same way) or ``train.log-20261206.gz``
and ``train.log`` (logrotate's dateext, default dateformat ``-%Y%m%d``, also ``-%Y%m%d%H`` and ``-%Y-%m-%d``) are
read oldest first as the one source ``train.log`` (files numbered from 0, ``train.log.0``, ``train.log.1``, are one a
process - srun ``--output=train.log.%t`` - each read on its own, its number its rank), a compressed one (gzip, bzip2,
xz: :data:`vigil.logs.miner.COMPRESSED`) inflated on the way. zstd's ``.zst`` is not read (no codec in Python's
standard library before 3.14), nor logrotate's ``extension`` naming (``train-20261206.log``, read as a file of its
own). Generations logrotate's ``olddir`` moved into a directory of their own are read with their log: a directory
named in :data:`OLDDIR_NAMES` beside the log or beside its directory, or one named to :func:`discover`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from vigil.knowledge.error_file import ERROR_FILE_NAME
from vigil.model import VigilInputError

SourceKind = Literal["rank", "node", "job"]

_NODE_WORDS = re.compile(r"(?i)(dmesg|kern(?:el)?|syslog|messages|journal(?:ctl)?|kmsg)")
_RANK_IN_NAME = re.compile(r"(?i)(?:^|[^a-z])(?:rank|worker|proc|process)[_\-.]?(\d+)")
_TORCHRUN_STREAM = re.compile(r"(?i)^(?:stdout|stderr|error)\.(?:log|txt|json)$")
# torchelastic's directory of one attempt: attempt_<restart count> in the run's directory
_ATTEMPT_DIR = re.compile(r"^attempt_(\d+)$")
_NAME_CHARS = re.compile(r"[^A-Za-z0-9_.:\-]+")
_LOG_SUFFIXES = {".log", ".txt", ".err", ".out", ".stderr", ".stdout", ""}
# A generation's suffixes after the log's own name: a number (logrotate, RotatingFileHandler) or a date (dateext), then
# a compressor's extension.
_ROTATED = re.compile(r"(?i)^(?P<base>.+?)(?:\.(?P<number>\d{1,4})|-(?P<date>\d{8}(?:\d{2})?|\d{4}-\d\d-\d\d))?"
                      r"(?P<compressed>\.(?:gz|bz2|xz|lzma))?$")


@dataclass(frozen=True)
class LogSource:
    path: Path
    name: str  # path relative to the job directory
    kind: SourceKind
    rank: int | None
    node: str | None
    # a rotated log's generations, oldest first, the current file last (``path`` is the newest); () for one file
    generations: tuple[Path, ...] = ()
    # compressed files read short under a triage's total inflation budget: (file, most bytes inflated; 0: not read)
    inflate_limits: tuple[tuple[Path, int], ...] = ()
    # each generation's name in a result where some lie in an olddir (relative to the job directory, or as given
    # outside it); () when all are beside the log
    generation_names: tuple[str, ...] = ()
    # torchelastic's attempt the file was written in (its attempt_<N> directory) and that run's directory; None outside
    attempt: int | None = None
    run: str | None = None

    @property
    def files(self) -> tuple[Path, ...]:
        return self.generations or (self.path,)


def entity_name(text: str, fallback: str) -> str:
    """A string made safe for an entity id (node/<name>, job/<name>)."""
    cleaned = _NAME_CHARS.sub("-", text).strip("-._:")
    return cleaned or fallback


# logrotate's olddir: rotated generations moved to a directory of their own, beside the log (``olddir old``) or beside
# its directory (``olddir ../archive``). A directory of one of these names holding generations is read as one; any
# other is named explicitly (discover's ``olddirs``, vigil logs triage --olddir).
OLDDIR_NAMES = frozenset({"old", "olddir", "oldlogs", "old_logs", "old-logs", "archive", "archives", "archived",
                          "rotated"})


def discover(directory: Path, olddirs: Sequence[Path] = ()) -> list[LogSource]:
    """Every log file under ``directory``, classified; raises a one-line error if there is none. A single
    file (a Slurm job's ``slurm-<id>.out``, one launcher's combined log) is a job of that one file. ``olddirs``:
    directories holding rotated generations of these logs (logrotate's ``olddir``), inside ``directory`` or not."""
    if directory.is_file():
        return [classify(directory, directory.parent)]
    if not directory.exists():
        raise VigilInputError(f"log directory {directory} does not exist")
    if not directory.is_dir():
        raise VigilInputError(f"log path {directory} is neither a directory nor a regular file")
    for olddir in olddirs:
        if not olddir.is_dir():
            raise VigilInputError(f"olddir {olddir} is not a directory")
    explicit = {olddir.resolve() for olddir in olddirs}
    found = {path.resolve(): path for path in sorted(p for p in directory.rglob("*") if p.is_file())}
    for olddir in olddirs:
        found.update({path.resolve(): path for path in sorted(olddir.iterdir())
                      if path.is_file() and path.resolve() not in found})
    streams: dict[Path, list[tuple[tuple[int, str], Path]]] = {}
    moved: list[tuple[Path, str, tuple[int, str], bool]] = []  # generations in an olddir, placed once all are seen
    for path in found.values():
        base, order = rotation(path)
        suffixes = "".join(Path(base).suffixes[-1:]).lower()
        if suffixes not in _LOG_SUFFIXES and not _NODE_WORDS.search(base) and path.name != ERROR_FILE_NAME:
            continue
        named = path.parent.resolve() in explicit
        if order[0] < 2 and order != _FIRST_TASK and (named or path.parent.name.lower() in OLDDIR_NAMES):
            moved.append((path, base, order, named))
            continue
        streams.setdefault(path.parent / base, []).append((order, path))
    # files numbered from 0 in such a directory are one file a process (srun --output=train.log.%t of an earlier
    # run), not generations: each read on its own, as beside its log
    tasks = {stream for stream, generations in streams.items() if any(order == _FIRST_TASK for order, _ in generations)}
    for path, base, order, named in moved:
        if path.parent / base in tasks:
            streams[path.parent / base].append((order, path))
            continue
        streams.setdefault(_olddir_stream(path.parent, base, streams, directory, named), []).append((order, path))
    sources = []
    for stream, generations in sorted(streams.items()):
        files = tuple(path for _, path in sorted(generations))
        if any(order == _FIRST_TASK for order, _ in generations):
            # numbered from 0: one file a process (srun --output=train.log.%t), not generations (logrotate and
            # RotatingFileHandler start at 1); each read on its own, its number its rank
            for order, path in sorted(generations, key=lambda generation: generation[1]):
                source = classify(path, directory)
                if order[0] == 0 and source.kind == "job":
                    source = replace(source, kind="rank", rank=9999 - int(order[1]))
                sources.append(source)
            continue
        if len(files) == 1 and files[0] == stream:
            sources.append(classify(stream, directory))
        else:  # named, and classified, by the log's own name
            source = replace(classify(stream, directory), path=files[-1], generations=files)
            if any(path.parent != stream.parent for path in files):  # some in an olddir: named from the job directory
                source = replace(source, generation_names=tuple(_shown(path, directory) for path in files))
            sources.append(source)
    if not sources:
        raise VigilInputError(f"log directory {directory} holds no log files (*.log, *.txt, *.err, *.out)")
    return sources


_FIRST_TASK = (0, "9999")  # rotation()'s place of a ".0": never a generation's number


def rotation(path: Path) -> tuple[str, tuple[int, str]]:
    """The log's own name of a file that may be a rotated generation of it, and the generation's place (sorting
    oldest first): ``train.log.2.gz`` -> ``("train.log", (0, "9997"))``, ``train.log`` -> ``("train.log", (2, ""))``.
    A numbered suffix counts only after a log's own suffix or a kernel log's name (``rank.3`` is rank 3's log)."""
    found = _ROTATED.match(path.name)
    if found is None:
        return path.name, (2, "")
    base = found["base"]
    own = Path(base).suffix.lower()
    if not (own in _LOG_SUFFIXES - {""} or _NODE_WORDS.search(base)) or not (found["number"] or found["date"]
                                                                              or found["compressed"]):
        return path.name, (2, "")
    if found["number"]:
        return base, (0, f"{9999 - int(found['number']):04d}")  # the highest number the oldest
    if found["date"]:
        return base, (1, found["date"].replace("-", ""))
    return base, (2, "")  # the current file, compressed


def _olddir_stream(olddir: Path, base: str, streams: dict[Path, list[tuple[tuple[int, str], Path]]],
                   directory: Path, named: bool) -> Path:
    """The log a generation found in an olddir belongs to: the one of its name in the olddir's parent directory
    (``olddir old``), else the one of its name in a sibling directory (``olddir ../old``), else - for a directory named
    explicitly - the only one of its name anywhere; with none, a log of that name in the olddir's parent (or, outside
    the job directory, at its top)."""
    parent = olddir.parent
    if parent / base in streams:
        return parent / base
    siblings = [stream for stream in streams if stream.name == base and stream.parent.parent == parent]
    if len(siblings) == 1:
        return siblings[0]
    anywhere = [stream for stream in streams if stream.name == base]
    if named and len(anywhere) == 1:
        return anywhere[0]
    inside = parent.resolve() == directory.resolve() or directory.resolve() in parent.resolve().parents
    return parent / base if inside else directory / base


def _shown(path: Path, directory: Path) -> str:
    """A file's name in a result: relative to the job directory when inside it, else the path as given."""
    try:
        return path.relative_to(directory).as_posix()
    except ValueError:
        return path.as_posix()


def classify(path: Path, root: Path) -> LogSource:
    source = _classify(path, root)
    relative = path.relative_to(root).parts[:-1]
    for depth in range(len(relative) - 1, -1, -1):
        if found := _ATTEMPT_DIR.match(relative[depth]):
            return replace(source, attempt=int(found[1]), run=Path(*relative[:depth]).as_posix())
    return source


def _classify(path: Path, root: Path) -> LogSource:
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
