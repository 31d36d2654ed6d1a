"""torchelastic's error file: what ``@record`` wrote of a worker's uncaught exception, read as log lines.

``ErrorHandler.record_exception`` (torch/distributed/elastic/multiprocessing/errors/error_handler.py) writes
``{"message": {"message": "<Class>: <text>", "extraInfo": {"py_callstack": <traceback.format_exc()>, "timestamp":
"<epoch seconds>"}}}`` to ``TORCHELASTIC_ERROR_FILE`` - ``<run>/attempt_<N>/<local_rank>/error.json`` under torchrun's
``--log-dir`` - and the agent may add ``errorCode``; ``ProcessFailure`` (errors/__init__.py) also reads a message given
as a string with a top-level ``timestamp``. The traceback's lines (else the message) are the file's lines, all stamped
with the timestamp: the time the exception was recorded, which is how torchelastic itself picks the first failure.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ERROR_FILE_NAME = "error.json"
# what the agent writes in place of a message when a worker left no error file (errors/__init__.py _EMPTY_ERROR_DATA)
NO_MESSAGE = "<NONE>"


def read_error_file(path: Path) -> tuple[list[str], float | None]:
    """The lines of the error ``path`` records and its timestamp (None when it names none). A file that is not such
    a record (cut short as its worker was killed while writing it, another program's JSON) is read as plain text."""
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        record = json.loads(text)
    except ValueError:
        return text.splitlines(), None
    message = record.get("message") if isinstance(record, dict) else None
    if isinstance(message, dict):
        extra = message.get("extraInfo")
        if not isinstance(extra, dict):
            extra = {}
        return _lines(message.get("message"), extra.get("py_callstack")), _epoch(extra.get("timestamp"))
    if isinstance(message, str):
        return _lines(message, None), _epoch(record.get("timestamp"))
    return text.splitlines(), None


def _lines(message: Any, callstack: Any) -> list[str]:
    lines = callstack.splitlines() if isinstance(callstack, str) else []
    if isinstance(message, str) and message and message != NO_MESSAGE and message not in (callstack or ""):
        lines += message.splitlines()
    return lines


def _epoch(value: Any) -> float | None:
    try:
        stamp = float(value)
    except (TypeError, ValueError):
        return None
    return stamp if stamp > 0 else None
