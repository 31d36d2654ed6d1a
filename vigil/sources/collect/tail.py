"""Follow a log file as it grows: the complete lines written since the last look, a bounded number a look.

The agent reads a kernel log file this way (``KernelLogSource.from_file``), and ``vigil launch --server`` its
ranks' output, forwarding the lines the signature library names (``vigil.sources.collect.ranklog``). A look
reads at most ``max_lines`` lines and ``max_bytes`` bytes, so a file that floods costs bounded memory and time
per look (the rest is read at later looks); a line still being written (no newline yet) is left for the next
look; a line longer than ``line_limit`` is cut there and the rest of it skipped; a file not there (yet) has no
lines and ``present`` says so. A file that shrank or was replaced (truncated, rotated, a new run writing the
same path) is read again from its start, after the lines it had left unread where the old file went: a rotation
moving it aside (logrotate's create, kubelet's 0.log -> 0.log.<time>: the file under the old inode, named after it,
in its directory) or copying it aside before truncating it (logrotate's copytruncate: the copy holds the bytes the last
look ended on). A file truncated and written past where the last look ended is told by those bytes too (the file's own
no longer hold them). ``skip_written`` starts a follower at the file's current end, for a file
that held history before the follower came (a node agent restarting must not send yesterday's lines again).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

from vigil.sources.collect.base import ProblemLog

# The decoder keeps a line's first 8192 characters as the event's message (Event.message's limit).
LINE_LIMIT = 8192
MAX_LINES = 256
MAX_BYTES = 256 * 1024
# the bytes a look ended on, kept to tell the file's own continuation from another content at the same offset
MARK_BYTES = 64


class LogTail:
    """The lines appended to ``path`` since the last :meth:`read` (a file not there yet has none)."""

    def __init__(self, path: Path, *, max_lines: int = MAX_LINES, max_bytes: int = MAX_BYTES,
                 line_limit: int = LINE_LIMIT) -> None:
        if max_bytes < 1 or max_lines < 1 or line_limit < 1:
            raise ValueError("max_lines, max_bytes and line_limit must be positive")
        self.path = path
        self.max_lines = max_lines
        self.max_bytes = max_bytes
        self.line_limit = line_limit
        self.offset = 0
        # where each line the last read returned starts in the file (byte offsets, in the order of the lines)
        self.line_offsets: list[int] = []
        self.present = True
        # where a missing file is reported (the agent's problem log); None: only ``present`` says it
        self.problems: ProblemLog | None = None
        self._inode: int | None = None
        self._skipping = False  # inside a line already cut: drop up to its end
        self._mark = b""  # the bytes before ``offset`` (MARK_BYTES at most)
        # the file's previous content moved or copied aside with lines still unread at ``offset``: read first
        self._aside: Path | None = None

    def skip_written(self) -> None:
        """Start after what the file holds now: only lines written from here on are read."""
        try:
            with open(self.path, "rb") as f:
                stat = os.fstat(f.fileno())
                f.seek(max(0, stat.st_size - 1))
                last = f.read(1)
        except OSError:
            return
        # a line still being written is the old history's: its rest is skipped too
        self._inode, self.offset, self._skipping = stat.st_ino, stat.st_size, last not in (b"", b"\n")
        self._mark = b""

    def read(self) -> list[str]:
        """The complete lines written since the last look, at most ``max_lines`` of them, each without its
        line ending and cut at ``line_limit`` characters (``line_offsets``: where each starts in the file)."""
        self.line_offsets = []
        if self._aside is not None:
            lines = self._read_aside()
            if lines or self._aside is not None:
                return lines
        try:
            with open(self.path, "rb") as f:
                self.present = True
                stat = os.fstat(f.fileno())
                if stat.st_ino != self._inode or stat.st_size < self.offset or not self._continues(f):
                    # first look, or the file was replaced or truncated: its content is new, after what the old
                    # content had left unread
                    aside = None if self._inode is None else self._moved_aside(stat.st_ino)
                    if aside is not None:
                        self._aside = aside
                        lines = self._read_aside()
                        if lines or self._aside is not None:
                            return lines
                    self._inode, self.offset, self._skipping, self._mark = stat.st_ino, 0, False, b""
                if stat.st_size <= self.offset:
                    return []
                return self._lines(f, stat.st_size)
        except FileNotFoundError:
            aside = None if self._inode is None else self._moved_aside(None)
            if aside is not None:  # moved, the new file not made yet: what the old one had left unread
                self._aside, self._inode = aside, None
                return self._read_aside()
            self.present = False
            if self.problems is not None:
                self.problems.report("missing file", f"log file {self.path} does not exist")
            return []
        except OSError:
            return []

    def _continues(self, f: BinaryIO) -> bool:
        """Whether the file still holds the bytes the last look ended on (not truncated and written again past
        them)."""
        if not self._mark:
            return True
        f.seek(self.offset - len(self._mark))
        return f.read(len(self._mark)) == self._mark

    def _moved_aside(self, inode: int | None) -> Path | None:
        """The file's previous content with lines left unread, in the directory under a name after the file's
        (rank-0.log.1, 0.log.20261206-101500): the old inode where it was moved, else a copy that holds the bytes the
        last look ended on; None when none is found (the lines are lost, as before)."""
        try:
            with os.scandir(self.path.parent) as entries:
                names = sorted(entry.name for entry in entries
                               if entry.name.startswith(self.path.name) and entry.name != self.path.name)
        except OSError:
            return None
        copies = []
        for name in names:
            candidate = self.path.parent / name
            try:
                stat = candidate.stat()
            except OSError:
                continue
            if stat.st_size <= self.offset:
                continue
            if stat.st_ino == self._inode and stat.st_ino != inode:
                return candidate
            copies.append(candidate)
        for candidate in copies if self._mark else ():
            try:
                with candidate.open("rb") as f:
                    if self._continues(f):
                        return candidate
            except OSError:
                continue
        return None

    def _read_aside(self) -> list[str]:
        """The next lines of the content moved or copied aside; once it is read to its end, ``_aside`` is None and
        the file itself is read from its start."""
        assert self._aside is not None
        self.present = True
        try:
            with self._aside.open("rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size > self.offset:
                    lines = self._lines(f, size)
                    if lines:
                        return lines
        except OSError:
            pass
        self._aside, self._inode, self.offset, self._skipping, self._mark = None, None, 0, False, b""
        return []

    def _lines(self, f: BinaryIO, size: int) -> list[str]:
        """The complete lines from ``offset`` of the open file ``f`` of ``size`` bytes, bounded by a look's limits."""
        f.seek(self.offset)
        chunk = f.read(min(self.max_bytes, size - self.offset))
        lines: list[str] = []
        start = 0
        while len(lines) < self.max_lines:
            end = chunk.find(b"\n", start)
            if end < 0:
                break
            if self._skipping:
                self._skipping = False
            else:
                lines.append(self._text(chunk[start:end]))
                self.line_offsets.append(self.offset + start)
            start = end + 1
        if len(lines) < self.max_lines and start == 0 and len(chunk) >= self.max_bytes and not self._skipping:
            # no line end in a whole look's bytes: a line longer than the look; keep its head, skip the rest
            lines.append(self._text(chunk))
            self.line_offsets.append(self.offset)
            self._skipping = True
            start = len(chunk)
        elif self._skipping and start == 0:
            start = len(chunk)  # still inside the cut line
        if start:
            self._mark = (self._mark + chunk[:start])[-MARK_BYTES:]
        self.offset += start
        return lines

    def _text(self, raw: bytes) -> str:
        return raw[: self.line_limit * 4].decode("utf-8", errors="replace").rstrip("\r")[: self.line_limit]
