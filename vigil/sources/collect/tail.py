"""Follow a log file as it grows: the complete lines written since the last look, a bounded number a look.

The agent reads a kernel log file this way (``KernelLogSource.from_file``), and ``vigil launch --server`` its
ranks' output, forwarding the lines the signature library names (``vigil.sources.collect.ranklog``). A look
reads at most ``max_lines`` lines and ``max_bytes`` bytes, so a file that floods costs bounded memory and time
per look (the rest is read at later looks); a line still being written (no newline yet) is left for the next
look; a line longer than ``line_limit`` is cut there and the rest of it skipped; a file not there (yet) has no
lines and ``present`` says so. A file that shrank or was replaced (truncated, rotated, a new run writing the
same path) is read again from its start. ``skip_written`` starts a follower at the file's current end, for a file
that held history before the follower came (a node agent restarting must not send yesterday's lines again).
"""

from __future__ import annotations

import os
from pathlib import Path

from vigil.sources.collect.base import ProblemLog

# The decoder keeps a line's first 8192 characters as the event's message (Event.message's limit).
LINE_LIMIT = 8192
MAX_LINES = 256
MAX_BYTES = 256 * 1024


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

    def read(self) -> list[str]:
        """The complete lines written since the last look, at most ``max_lines`` of them, each without its
        line ending and cut at ``line_limit`` characters (``line_offsets``: where each starts in the file)."""
        self.line_offsets = []
        try:
            with open(self.path, "rb") as f:
                self.present = True
                stat = os.fstat(f.fileno())
                if stat.st_ino != self._inode or stat.st_size < self.offset:
                    # first look, or the file was replaced or truncated: its content is new
                    self._inode, self.offset, self._skipping = stat.st_ino, 0, False
                if stat.st_size <= self.offset:
                    return []
                f.seek(self.offset)
                chunk = f.read(min(self.max_bytes, stat.st_size - self.offset))
        except FileNotFoundError:
            self.present = False
            if self.problems is not None:
                self.problems.report("missing file", f"log file {self.path} does not exist")
            return []
        except OSError:
            return []
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
        self.offset += start
        return lines

    def _text(self, raw: bytes) -> str:
        return raw[: self.line_limit * 4].decode("utf-8", errors="replace").rstrip("\r")[: self.line_limit]
