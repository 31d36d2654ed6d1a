"""Training ranks' log files on this node -> ``rank_log`` events: the forwarder for jobs Vigil did not launch.

A job started by torchrun under Slurm, or a Kubernetes PyTorchJob, writes its ranks' output to files; which
job and which rank a file belongs to is in its path. A ``RankLogFiles`` entry says where the files are (a
glob) and how to read the path (a regular expression with a named group ``rank``, and a group ``job`` or a
fixed ``job``):

- ``srun --output=/scratch/logs/%j/rank-%t.log``: glob ``/scratch/logs/*/rank-*.log``, pattern
  ``/logs/(?P<job>\\d+)/rank-(?P<rank>\\d+)\\.log$``;
- torchrun ``--log-dir /var/log/train --redirects 3``: glob ``/var/log/train/*/attempt_*/*/stderr.log``,
  pattern ``/attempt_\\d+/(?P<rank>\\d+)/stderr\\.log$`` and the job's id in ``job`` (torchrun names the
  directory by local rank: on node k of n-GPU nodes, ``rank_offset`` k*n makes it the global rank).

The glob is read again at every look, so files of ranks that start later are followed from their first line;
files already there when the agent starts are followed from their end (a restarted agent does not send old
lines again). Each file is read by ``LogTail`` (bounded, rotation and truncation handled), at most
about ``MAX_LINES_PER_READ`` lines in all per look, the files taken in turn so one flooding rank cannot starve the
others (the rest is read at later looks). Each line goes to ``decode_rank_line``; only the lines the signature
library names become events. Nothing is judged here.
"""

from __future__ import annotations

import glob
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, Field, field_validator, model_validator

from vigil.model import VigilInputError, node_id, parse_entity, rank_id
from vigil.sources.collect.base import Collection, Source, default_node_name
from vigil.sources.collect.ranklog import decode_rank_line
from vigil.sources.collect.tail import LogTail

# Files followed at once; a node runs a few jobs of at most a few dozen ranks each.
MAX_FILES = 1024
# Lines read in one look over all files (each file's own look is bounded by LogTail's limits too).
MAX_LINES_PER_READ = 20_000
# A matched file not written for this long is a finished run's: not followed (and forgotten once followed).
IDLE_S = 6 * 3600.0
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-]*$")  # an entity id's name part (vigil.model)


class RankLogFiles(BaseModel):
    """Where one layout's rank log files are and how a file's path names its job and rank."""

    model_config = {"extra": "forbid"}

    glob: str = Field(min_length=1, description="the files, e.g. /var/log/train/job-*/rank-*.log")
    pattern: str = Field(min_length=1, description="regular expression searched in a file's path, with a named "
                         "group 'rank' and, unless 'job' is set, a named group 'job'")
    job: str = Field(default="", description="the job id of every file, when the path does not name it")
    rank_offset: int = Field(default=0, ge=0, description="added to the rank the path names (torchrun's local "
                             "rank on node k of n-GPU nodes: k*n)")

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str) -> str:
        try:
            compiled = re.compile(pattern)
        except re.error as err:
            raise ValueError(f"not a regular expression ({err})") from None
        if "rank" not in compiled.groupindex:
            raise ValueError("needs a named group 'rank', e.g. rank-(?P<rank>\\d+)\\.log$")
        return pattern

    @model_validator(mode="after")
    def _one_job(self) -> RankLogFiles:
        has_group = "job" in re.compile(self.pattern).groupindex
        if has_group == bool(self.job):
            raise ValueError("name the job either by a named group 'job' in the pattern or by 'job', not both "
                             "and not neither")
        if self.job and not _JOB_ID.match(self.job):
            raise ValueError(f"job {self.job!r} is not a job id: letters, digits and _ . : - (no spaces or "
                             "slashes), starting with a letter or digit")
        return self

    def rank_of(self, path: str) -> str | None:
        """The rank entity a file's path names, or None when the pattern does not match it."""
        found = re.search(self.pattern, path)
        if found is None or not found.group("rank") or not found.group("rank").isdigit():
            return None
        job = self.job or found.group("job")
        entity = rank_id(job, int(found.group("rank")) + self.rank_offset)
        try:
            parse_entity(entity)
        except VigilInputError:
            return None
        return entity


@dataclass
class _Followed:
    rank: str
    tail: LogTail


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
        self._turn = 0
        self.lines_read = 0
        self.files_refused = 0

    def collect(self, now: float) -> Collection:
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
            lines = followed.tail.read()
            if not followed.tail.present:
                del self._files[path]  # deleted or rotated away: found again by the glob if it comes back
                continue
            budget -= len(lines)
            self.lines_read += len(lines)
            for line in lines:
                event = decode_rank_line(followed.rank, line, now)
                if event is not None:
                    events.append(event)
        out = Collection(events=events, status=f"following {len(self._files)} rank log file(s)")
        node = node_id(self.node)
        out.add("vigil_agent_rank_log_files", node, len(self._files))
        out.add("vigil_agent_rank_log_lines_total", node, self.lines_read)
        out.add("vigil_agent_rank_log_files_refused_total", node, self.files_refused)
        return out

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
                rank = layout.rank_of(path)
                if rank is None:
                    # remembered, so a file the pattern does not read is reported once and not looked at again
                    if len(self._unmatched) < self.max_files:
                        self._unmatched.add(path)
                    self.problems.report("unmatched file", f"{path} matches the glob {layout.glob} but the "
                                         f"pattern {layout.pattern} names no job and rank in it")
                    continue
                if len(self._files) >= self.max_files:
                    self.files_refused += 1
                    self.problems.report("too many files", f"already following {self.max_files} rank log files; "
                                         f"{path} is not followed")
                    continue
                known = self._idle.pop(path, None)
                if known is not None and known.rank == rank:
                    self._files[path] = known
                    continue
                tail = LogTail(Path(path))
                if first:
                    tail.skip_written()
                self._files[path] = _Followed(rank, tail)
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
