"""Terminal-safe output: text that comes from data (log lines, exporter pages, names in a store) is shown
with its control characters escaped, so a hostile line cannot clear the screen, move the cursor, retitle
the terminal or hide text behind a bidirectional override."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

from rich.console import Console
from rich.segment import Segment

# C0 controls except tab and newline, DEL, C1 controls, and the Unicode bidirectional overrides.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def terminal_safe(text: str) -> str:
    """``text`` with every control character written as a visible escape (``ESC`` becomes ``\\x1b``)."""
    return _UNSAFE.sub(_escaped, text)


class SafeConsole(Console):
    """A Rich console that escapes control characters in everything it prints; the styling Rich adds
    itself (colours, and the cursor moves of progress bars, which travel as control segments) is kept."""

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        return super()._render_buffer(
            segment if segment.control else Segment(terminal_safe(segment.text), segment.style, None)
            for segment in buffer
        )


class SafeFormatter(logging.Formatter):
    """Log records carry text from the sources a collector reads; escape it before it reaches a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        return terminal_safe(super().format(record))


def echo(text: str, *, err: bool = False) -> None:
    """Plain text from data on stdout (or stderr), escaped."""
    import typer

    typer.echo(terminal_safe(text), err=err)
