"""Terminal-safe output: text that comes from data (log lines, exporter pages, names in a store, file names)
is shown with its control characters escaped, so a hostile line cannot clear the screen, move the cursor,
retitle the terminal or hide text behind a bidirectional override; and it is never read as Rich markup, so
a name like ``[bold]`` or ``[/]`` is printed as written instead of restyling (or breaking) the table.

The rule for the CLI: tables are ``DataTable`` (every str cell, the title and the caption are plain text;
a styled cell is a ``Text`` with a style); a ``console.print`` f-string passes data through ``escape``."""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress, ProgressColumn
from rich.segment import Segment
from rich.style import StyleType
from rich.table import Table
from rich.text import Text

from vigil.model import VigilInputError

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


class ProgressBar(Progress):
    """A Rich progress bar shown only on a terminal: on a pipe or a file Rich still writes a newline when the
    bar stops, a stray blank line in the stderr (or stdout) a script reads."""

    def __init__(self, *columns: str | ProgressColumn, console: Console, disable: bool = False,
                 **options: Any) -> None:
        super().__init__(*columns, console=console, disable=disable or not console.is_terminal, **options)


class SafeFormatter(logging.Formatter):
    """Log records carry text from the sources a collector reads; escape it before it reaches a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        return terminal_safe(super().format(record))


def echo(text: str, *, err: bool = False) -> None:
    """Plain text from data on stdout (or stderr), escaped."""
    import typer

    typer.echo(terminal_safe(text), err=err)


def json_text(data: object, *, indent: int | None = None, default: Callable[[object], object] | None = None) -> str:
    """``data`` as strict JSON (RFC 8259) for ``--json``: a NaN or infinite number, which ``json.dumps`` writes
    as the bare tokens ``NaN`` / ``Infinity`` that JSON parsers other than Python's refuse, is null, as the
    REST API and every pydantic record the CLI prints write it."""
    return json.dumps(_finite(data), indent=indent, default=default, allow_nan=False)


def write_out(path: Path, text: str, option: str = "--out") -> None:
    """Write a report the user asked for; a path that cannot be written (a directory, a missing parent, no
    permission) is one line naming the option, not a traceback."""
    try:
        path.write_text(text)
    except OSError as err:
        raise VigilInputError(f"{option} {path}: cannot write there ({err.strerror or err})") from None


def _finite(data: object) -> object:
    if isinstance(data, float) and not math.isfinite(data):
        return None
    if isinstance(data, dict):
        return {key: _finite(value) for key, value in data.items()}
    if isinstance(data, list | tuple):
        return [_finite(value) for value in data]
    return data


def styled(text: object, style: StyleType = "") -> Text:
    """A table cell or message part from data: shown as written, in ``style``."""
    return Text(str(text), style=style)


class DataTable(Table):
    """A Rich table for data: str cells, the title and the caption are plain text, never markup."""

    def __init__(self, *headers: str, title: str | Text | None = None, caption: str | Text | None = None,
                 **options: object) -> None:
        super().__init__(*headers, title=_plain(title), caption=_plain(caption), **options)  # type: ignore[arg-type]

    def add_row(self, *cells: object, **options: object) -> None:
        super().add_row(*(Text(c) if isinstance(c, str) else c for c in cells), **options)  # type: ignore[arg-type]

    def set_caption(self, caption: str) -> None:
        self.caption = Text(caption)


def _plain(text: str | Text | None) -> Text | None:
    return Text(text) if isinstance(text, str) else text
