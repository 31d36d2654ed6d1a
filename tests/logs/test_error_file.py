"""torchelastic's error file read at the edge: every torch version's shape, and bad input without a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vigil.knowledge import error_file
from vigil.knowledge.error_file import read_error_file

CALLSTACK = 'Traceback (most recent call last):\n  File "/w/train.py", line 3, in <module>\nValueError: bad shard\n'


def _read(tmp_path: Path, text: str) -> tuple[list[str], float | None] | None:
    path = tmp_path / "error.json"
    path.write_text(text)
    return read_error_file(path)


@pytest.mark.parametrize("stamp, expected", [("1770984500", 1770984500.0), (1770984500, 1770984500.0),
                                             (1770984500.5, 1770984500.5), (True, None), ("NaN", None),
                                             ("inf", None), (1770984500000, None), ("soon", None), (None, None),
                                             ([1770984500], None), (0, None)])
def test_timestamps_of_every_shape(tmp_path: Path, stamp: object, expected: float | None) -> None:
    """record_exception writes str(int(time.time())); a handler may write a number. A boolean, a non-finite number,
    milliseconds or a list is no time in seconds."""
    record = {"message": {"message": "ValueError: bad shard", "extraInfo": {"py_callstack": CALLSTACK,
                                                                           "timestamp": stamp}}}
    assert _read(tmp_path, json.dumps(record)) == (CALLSTACK.splitlines(), expected)


def test_a_callstack_that_is_not_text_leaves_the_message(tmp_path: Path) -> None:
    """Before: a number in py_callstack raised TypeError out of triage."""
    record = {"message": {"message": "RuntimeError: boom", "extraInfo": {"py_callstack": 5, "timestamp": "17"}}}
    assert _read(tmp_path, json.dumps(record)) == (["RuntimeError: boom"], 17.0)


def test_the_message_is_added_when_the_traceback_lacks_it(tmp_path: Path) -> None:
    record = {"message": {"message": "RuntimeError: boom", "errorCode": 1,
                          "extraInfo": {"py_callstack": "Traceback (most recent call last):\n"}}}
    assert _read(tmp_path, json.dumps(record)) == (["Traceback (most recent call last):", "RuntimeError: boom"], None)


@pytest.mark.parametrize("text", ['{"status": "failed", "detail": "Could not reach the metrics server"}',
                                  '[{"loss": 2.3}]', '{"message": 42}', '"RuntimeError: boom"'])
def test_json_that_is_no_record_gives_no_lines(tmp_path: Path, text: str) -> None:
    """Another program's error.json: its keys are no error lines. Before: read as text, "failed" and "Could not" in
    its lines named a root."""
    assert _read(tmp_path, text) == ([], None)


def test_a_file_cut_short_or_too_large_is_left_to_the_log_reader(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker killed while writing its record left no JSON; a file past the cap is no record and is not read whole
    into memory. Before: the whole file was read, whatever its size."""
    assert _read(tmp_path, '{"message": {"message": "RuntimeError: CUDA error') is None
    monkeypatch.setattr(error_file, "MAX_RECORD_BYTES", 64)
    assert _read(tmp_path, json.dumps({"message": "RuntimeError: " + "x" * 100})) is None
