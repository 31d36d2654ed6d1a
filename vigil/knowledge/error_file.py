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
import math
from pathlib import Path
from typing import Any

ERROR_FILE_NAME = "error.json"
# The attribute naming torchelastic's attempt a line was written in (its attempt_<N> directory, numbered by the agent's
# restart count): on the live collector's events and on triage's root.
ATTEMPT_ATTR = "attempt"
# what the agent writes in place of a message when a worker left no error file (errors/__init__.py _EMPTY_ERROR_DATA)
NO_MESSAGE = "<NONE>"
# A record holds one traceback (Python folds a recursion's repeats into "[Previous line repeated N more times]"): a
# larger file is no record, and is read as an ordinary log, line by bounded line.
MAX_RECORD_BYTES = 1 << 20
# epoch seconds after 1 January 3000: no time torchelastic wrote (a handler's milliseconds, a counter)
_LATEST_EPOCH_S = 32503680000.0


def read_error_file(path: Path) -> tuple[list[str], float | None] | None:
    """The lines of the error ``path`` records and its timestamp (None when it names none); no lines for JSON that is
    no such record (another program's report, whose keys are not error lines). None for a file to read as an ordinary
    log instead: one cut short as its worker was killed while writing it, or one too large to be a record."""
    with path.open("rb") as handle:
        data = handle.read(MAX_RECORD_BYTES + 1)
    if len(data) > MAX_RECORD_BYTES:
        return None
    try:
        record = json.loads(data.decode("utf-8", errors="replace"))
    except ValueError:
        return None
    message = record.get("message") if isinstance(record, dict) else None
    if isinstance(message, dict):
        extra = message.get("extraInfo")
        if not isinstance(extra, dict):
            extra = {}
        return _lines(message.get("message"), extra.get("py_callstack")), _epoch(extra.get("timestamp"))
    if isinstance(message, str):
        return _lines(message, None), _epoch(record.get("timestamp"))
    return [], None


def _lines(message: Any, callstack: Any) -> list[str]:
    trace = callstack if isinstance(callstack, str) else ""
    lines = trace.splitlines()
    if isinstance(message, str) and message and message != NO_MESSAGE and message not in trace:
        lines += message.splitlines()
    return lines


def _epoch(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        stamp = float(value)
    except ValueError:
        return None
    return stamp if math.isfinite(stamp) and 0 < stamp < _LATEST_EPOCH_S else None
