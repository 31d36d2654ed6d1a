"""Training ranks' log files on this node -> ``rank_log`` events: the forwarder for jobs Vigil did not launch.

A job started by torchrun under Slurm, or a Kubernetes PyTorchJob, writes its ranks' output to files; which
job a file belongs to, and often which rank, is in its path. A ``RankLogFiles`` entry says where the files are
(a glob) and how to read the path (a regular expression with a named group ``job`` or a fixed ``job``, and a
named group ``rank``). A file that holds several ranks' output (a pod running torchrun, a Slurm task per node)
has no rank in its path: without a ``rank`` group, each line's rank is the one torch prefixed it with
(``[rank3]: ...``, the form distributed ranks' errors and ProcessGroupNCCL's lines take), and a line without
the prefix is counted and not sent. Kubernetes writes container logs in the CRI format (``<time> stderr F
<line>``): ``format: cri`` reads the line out of it and joins partial lines.

- ``srun --output=/scratch/logs/%j/rank-%t.log``: glob ``/scratch/logs/*/rank-*.log``, pattern
  ``/logs/(?P<job>\\d+)/rank-(?P<rank>\\d+)\\.log$``;
- torchrun ``--rdzv-id <job> --log-dir /var/log/train --redirects 3``: glob
  ``/var/log/train/*/attempt_*/*/stderr.log``, pattern ``/(?P<job>[^/_]+)_[^/]+/attempt_\\d+/\\d+/stderr\\.log$``
  and the ranks from the lines' prefixes (torchrun names the directory by local rank; on one node, a ``rank``
  group on it and a fixed ``job`` do, and ``rank_offset`` shifts a node's local ranks to global ones);
- a PyTorchJob's pods (``<namespace>_<pod>_<uid>/<container>/<n>.log``): glob
  ``/var/log/pods/*/pytorch/*.log``, pattern ``/[^/_]+_(?P<job>[^/_]+)-(?:master|worker)-\\d+_[^/]+/pytorch/``,
  ``format: cri`` and the ranks from the lines' prefixes.

The glob is read again at every look, so files of ranks that start later are followed from their first line;
files already there when the agent starts are followed from their end (a restarted agent does not send old
lines again). Each file is read by ``LogTail`` (bounded, rotation and truncation handled), at most
about ``MAX_LINES_PER_READ`` lines in all per look, the files taken in turn so one flooding rank cannot starve the
others (the rest is read at later looks). Each line goes to ``decode_rank_line``; only the lines the signature
library names become events. Nothing is judged here.

A file in torchelastic's layout (``<run>/attempt_<N>/<local rank>/``) says which attempt of the run wrote it and
which local rank: its events carry both (``attempt``, ``local_rank``), so a restarted job's first failed attempt can
be told from the attempts it caused. Beside a followed file, the worker's ``error.json`` (what ``@record`` wrote when
it died: written once) is read whole and bounded by :func:`vigil.knowledge.error_file.read_error_file`, as triage
reads it, its lines stamped with the time it records; one not whole yet is read at a later look, and one that stays
no record (its worker killed while writing it, or too large to be one) is followed as an ordinary log. Its rank is
the one the path names, else the one its worker's own prefixed lines named; without either its lines are counted
and not sent.
"""

from __future__ import annotations

import glob
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from vigil.knowledge.error_file import ATTEMPT_ATTR, ERROR_FILE_NAME, read_error_file
from vigil.knowledge.line_prefix import LINE_RANK_PREFIX
from vigil.model import Event, node_id, rank_id
from vigil.sources.collect.base import Collection, Source, default_node_name
from vigil.sources.collect.ranklog import decode_rank_line
from vigil.sources.collect.tail import LINE_LIMIT, LogTail

# Files followed at once; a node runs a few jobs of at most a few dozen ranks each.
MAX_FILES = 1024
# Lines read in one look over all files (each file's own look is bounded by LogTail's limits too).
MAX_LINES_PER_READ = 20_000
# A matched file not written for this long is a finished run's: not followed (and forgotten once followed).
IDLE_S = 6 * 3600.0
# a CRI container log line: time, stream, F (full) or P (partial: the line goes on in the next record)
_CRI_LINE = re.compile(r"^\S+ (?:stdout|stderr) (?P<tag>[FP])(?:\S*) ?(?P<line>.*)$")
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-]*$")  # an entity id's name part (vigil.model)
# The attributes of a rank_log event that say where its line was read: the file and the byte offset it starts at.
LOG_FILE_ATTR = "log_file"
LOG_OFFSET_ATTR = "log_offset"
# The attributes of a rank_log event read in torchelastic's layout: the attempt (ATTEMPT_ATTR, as triage's root names
# it) and the local rank (the directory below it).
LOCAL_RANK_ATTR = "local_rank"
# torchelastic's directory of one worker of one attempt: <run>/attempt_<N>/<local rank>/<file>
_WORKER_DIR = re.compile(r"/attempt_(?P<attempt>\d+)/(?P<local_rank>\d+)/[^/]+$")
# A rotated generation's name: the log's own, then logrotate's number or date (dateext: -%Y%m%d, -%Y%m%d%H,
# -%Y-%m-%d), or kubelet's .%Y%m%d-%H%M%S, then a compressor's extension. A generation is the history of the file it was
# rotated from (LogTail reads what it had left unread), not a file to follow from its first line.
_GENERATION = re.compile(r"^(?P<base>.+?)(?:\.\d{1,4}|-\d{8}(?:\d{2})?|-\d{4}-\d\d-\d\d|\.\d{8}-\d{6})?"
                         r"(?:\.(?:gz|bz2|xz|lzma|zst))?$")


class RankLogFiles(BaseModel):
    """Where one layout's rank log files are and how a file's path names its job and rank."""

    model_config = {"extra": "forbid"}

    glob: str = Field(min_length=1, description="the files, e.g. /var/log/train/job-*/rank-*.log")
    pattern: str = Field(min_length=1, description="regular expression searched in a file's path, with a named "
                         "group 'job' (unless 'job' is set) and 'rank' (else each line's [rankN]: prefix names it)")
    job: str = Field(default="", description="the job id of every file, when the path does not name it")
    rank_offset: int = Field(default=0, ge=0, description="added to the rank the path names (torchrun's local "
                             "rank on node k of n-GPU nodes: k*n)")
    format: Literal["plain", "cri"] = Field(default="plain", description="plain lines, or the CRI container log "
                                            "format Kubernetes writes under /var/log/pods")

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str) -> str:
        try:
            compiled = re.compile(pattern)
        except re.error as err:
            raise ValueError(f"not a regular expression ({err})") from None
        if not {"rank", "job"} & set(compiled.groupindex):
            raise ValueError("names nothing: needs a named group 'rank' (rank-(?P<rank>\\d+)\\.log$) or 'job', "
                             "or both")
        return pattern

    @model_validator(mode="after")
    def _one_job(self) -> RankLogFiles:
        has_group = "job" in re.compile(self.pattern).groupindex
        if has_group == bool(self.job):
            raise ValueError("name the job either by a named group 'job' in the pattern or by 'job', not both "
                             "and not neither")
        if self.rank_offset and "rank" not in re.compile(self.pattern).groupindex:
            raise ValueError("rank_offset applies to the rank the path names: the pattern has no group 'rank'")
        if self.job and not _JOB_ID.match(self.job):
            raise ValueError(f"job {self.job!r} is not a job id: letters, digits and _ . : - (no spaces or "
                             "slashes), starting with a letter or digit")
        return self

    def owner_of(self, path: str) -> tuple[str, int | None] | None:
        """The job a file's path names and its rank (None: each line names its own), or None when the pattern
        does not match it or names no job id."""
        found = re.search(self.pattern, path)
        if found is None:
            return None
        job = self.job or found.group("job") or ""
        if not _JOB_ID.match(job):
            return None
        if "rank" not in found.re.groupindex:
            return job, None
        rank = found.group("rank") or ""
        return (job, int(rank) + self.rank_offset) if rank.isdigit() else None

    def rank_of(self, path: str) -> str | None:
        """The rank entity a file's path names, or None when it names none."""
        owner = self.owner_of(path)
        return None if owner is None or owner[1] is None else rank_id(owner[0], owner[1])


@dataclass
class _Followed:
    job: str
    rank: int | None  # None: each line's [rankN]: prefix names it
    tail: LogTail
    cri: bool
    partial: list[str] = field(default_factory=list)  # a CRI line's parts so far

    partial_at: int = 0  # where the first of those parts starts in the file
    attempt: int | None = None  # torchelastic's attempt and local rank the file's directory names
    local_rank: int | None = None

    def lines(self) -> list[tuple[int, str]]:
        """The file's new lines, out of their CRI records where it has them, each with the byte offset in the file
        where it starts (a CRI line joined from partial records: where its first record starts)."""
        raw = self.tail.read()
        if not self.cri:
            return list(zip(self.tail.line_offsets, raw, strict=True))
        lines = []
        for offset, record in zip(self.tail.line_offsets, raw, strict=True):
            found = _CRI_LINE.match(record)
            if found is None:
                lines.append((offset, record))
                continue
            if not self.partial:
                self.partial_at = offset
            self.partial.append(found.group("line"))
            if found.group("tag") == "F" or sum(map(len, self.partial)) >= LINE_LIMIT:
                lines.append((self.partial_at, "".join(self.partial)[:LINE_LIMIT]))
                self.partial = []
        return lines


class RankLogSource(Source):
    """Follows the rank log files of the configured layouts and decodes their new lines on every ``collect``."""

    name = "rank_log"
    kind = "rank_log"

    def __init__(self, layouts: list[RankLogFiles], node: str | None = None, *,
                 max_lines_per_read: int = MAX_LINES_PER_READ, max_files: int = MAX_FILES,
                 idle_s: float = IDLE_S) -> None:
        super().__init__()
        self.layouts = layouts
        self.node = node or default_node_name()
        self.max_lines_per_read = max_lines_per_read
        self.max_files = max_files
        self.idle_s = idle_s
        self._files: dict[str, _Followed] = {}
        self._unmatched: set[str] = set()
        self._idle: dict[str, _Followed] = {}
        self._first_scan = True
        # torchelastic's error files: those read (or there when the agent started), those found holding no record
        # yet (with their size and time then), and the rank each worker directory's prefixed lines named
        self._error_files_done: dict[str, None] = {}
        self._error_files_unread: dict[str, tuple[int, float]] = {}
        self._worker_ranks: dict[str, int] = {}
        self._turn = 0
        self.lines_read = 0
        self.lines_without_rank = 0
        self.files_refused = 0

    def collect(self, now: float) -> Collection:
        first = self._first_scan
        self._discover()
        events = []
        budget = self.max_lines_per_read
        paths = list(self._files)
        start = self._turn % len(paths) if paths else 0
        self._turn += 1
        for path in paths[start:] + paths[:start]:
            if budget <= 0:
                break
            followed = self._files[path]
            lines = followed.lines()
            if not followed.tail.present:
                del self._files[path]  # deleted or rotated away: found again by the glob if it comes back
                continue
            budget -= len(lines)
            self.lines_read += len(lines)
            for offset, line in lines:
                rank = followed.rank
                if rank is None:
                    prefixed = LINE_RANK_PREFIX.match(line)
                    # torchrun's "[default3]:" numbers a local rank: it does not say which rank of the job wrote
                    if prefixed is None or prefixed.group("scope") != "rank":
                        self.lines_without_rank += 1
                        continue
                    rank = int(prefixed.group("rank"))
                    if followed.attempt is not None:
                        self._remember(self._worker_ranks, os.path.dirname(path), rank)
                # where the line is: with the look's time, what a push sent again repeats and no two lines share
                # (two equal lines of one look stand at two offsets; a truncated file read again from its start is
                # read at a later look), so the server stores a retried push once
                event = self._event(followed, rank, line, now, path, offset)
                if event is not None:
                    events.append(event)
        events += self._error_file_events(now, first)
        out = Collection(events=events, status=f"following {len(self._files)} rank log file(s)")
        node = node_id(self.node)
        out.add("vigil_agent_rank_log_files", node, len(self._files))
        out.add("vigil_agent_rank_log_lines_total", node, self.lines_read)
        out.add("vigil_agent_rank_log_lines_without_rank_total", node, self.lines_without_rank)
        out.add("vigil_agent_rank_log_files_refused_total", node, self.files_refused)
        return out

    def _event(self, followed: _Followed, rank: int, line: str, ts: float, path: str, offset: int) -> Event | None:
        event = decode_rank_line(rank_id(followed.job, rank), line, ts)
        if event is None:
            return None
        event.attrs[LOG_FILE_ATTR], event.attrs[LOG_OFFSET_ATTR] = path, offset
        if followed.attempt is not None and followed.local_rank is not None:
            event.attrs[ATTEMPT_ATTR], event.attrs[LOCAL_RANK_ATTR] = followed.attempt, followed.local_rank
        return event

    def _error_file_events(self, now: float, first: bool) -> list[Event]:
        """The events of the error files beside the followed torchelastic files that hold a record now."""
        workers = {os.path.dirname(path): followed for path, followed in self._files.items()
                   if followed.attempt is not None}
        events = []
        for directory, worker in workers.items():
            path = os.path.join(directory, ERROR_FILE_NAME)
            if path in self._error_files_done or path in self._files:
                continue
            try:
                stat = os.stat(path)
                record = None if first else read_error_file(Path(path))
            except OSError:
                continue  # not written: the worker has not died (or did not run under @record)
            if first:
                self._remember(self._error_files_done, path, None)  # an earlier run's, as the other files' lines
                continue
            if record is None:
                written = (stat.st_size, stat.st_mtime)
                if self._error_files_unread.get(path) != written:
                    self._remember(self._error_files_unread, path, written)  # its worker may still be writing it
                    continue
                # unchanged since the last look and no record: read as an ordinary log, as triage reads it
                del self._error_files_unread[path]
                self._files[path] = _Followed(worker.job, worker.rank, LogTail(Path(path)), cri=False,
                                              attempt=worker.attempt, local_rank=worker.local_rank)
                continue
            self._error_files_unread.pop(path, None)
            self._remember(self._error_files_done, path, None)
            lines, recorded_at = record
            self.lines_read += len(lines)
            rank = worker.rank if worker.rank is not None else self._worker_ranks.get(directory)
            if rank is None:
                self.lines_without_rank += len(lines)
                continue
            # one record, read whole: its lines share its start, and equal lines of one traceback are one
            stamp = now if recorded_at is None else recorded_at
            events += [event for line in lines
                       if (event := self._event(worker, rank, line, stamp, path, 0)) is not None]
        return events

    def _remember(self, table: dict[str, Any], key: str, value: Any) -> None:
        """Put ``key`` in a table of at most ``max_files`` entries, forgetting the oldest."""
        table.pop(key, None)
        table[key] = value
        while len(table) > self.max_files:
            del table[next(iter(table))]

    def _discover(self) -> None:
        """Follow the files the globs match now that are not followed yet."""
        first, self._first_scan = self._first_scan, False
        cutoff = time.time() - self.idle_s
        for layout in self.layouts:
            for path in sorted(glob.glob(layout.glob, recursive=True)):
                if path in self._files or path in self._unmatched:
                    continue
                try:
                    if os.stat(path).st_mtime < cutoff:
                        continue
                except OSError:
                    continue
                owner = layout.owner_of(path)
                if owner is not None and _generation_of(layout, path, owner):
                    continue
                worker = _WORKER_DIR.search(path)
                if worker is not None and os.path.basename(path) == ERROR_FILE_NAME:
                    continue  # a record, read whole beside its worker's log files (_error_file_events)
                if owner is None:
                    # remembered, so a file the pattern does not read is reported once and not looked at again
                    if len(self._unmatched) < self.max_files:
                        self._unmatched.add(path)
                    self.problems.report("unmatched file", f"the pattern {layout.pattern} names no job id or rank "
                                         f"in {path}")
                    continue
                if len(self._files) >= self.max_files:
                    self.files_refused += 1
                    self.problems.report("too many files", f"already following {self.max_files} rank log files; "
                                         f"{path} is not followed")
                    continue
                known = self._idle.pop(path, None)
                if known is not None and (known.job, known.rank) == owner:
                    self._files[path] = known
                    continue
                tail = LogTail(Path(path))
                if first:
                    tail.skip_written()
                self._files[path] = _Followed(*owner, tail, cri=layout.format == "cri",
                                              attempt=int(worker["attempt"]) if worker else None,
                                              local_rank=int(worker["local_rank"]) if worker else None)
        for path in list(self._files):
            try:
                idle = os.stat(path).st_mtime < cutoff
            except OSError:
                idle = False  # the next read says it is gone
            if idle:
                # kept aside with its position: written again, the file is read on from there
                self._idle[path] = self._files.pop(path)
                while len(self._idle) > self.max_files:
                    del self._idle[next(iter(self._idle))]


def _generation_of(layout: RankLogFiles, path: str, owner: tuple[str, int | None]) -> bool:
    """Whether ``path`` is a rotated generation (rank-3.log.1, rank-3.log-20261206.gz) of a file the layout follows for
    the same job and rank."""
    found = _GENERATION.match(os.path.basename(path))
    if found is None or found["base"] == os.path.basename(path):
        return False
    return layout.owner_of(os.path.join(os.path.dirname(path), found["base"])) == owner
