"""Inference load from a request trace: a CSV with a TIMESTAMP column (Azure LLM inference trace form,
``2023-11-16 18:17:03.9799600``), binned into the planner's intervals."""

from __future__ import annotations

import csv
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TypeVar

import numpy as np

from vigil.model import VigilInputError
from vigil.sources.promql import PromQLSource

# Capacity must carry the peak inside an interval, not its mean: the load of an interval is the busiest
# sub-window's request rate.
BURST_WINDOW_S = 10.0
T = TypeVar("T")


def _timestamp(text: str) -> float:
    head, _, fraction = text.strip().partition(".")
    # Python parses at most six fraction digits; the Azure trace writes seven.
    stamp = datetime.fromisoformat(f"{head}.{fraction[:6]}" if fraction else head)
    return stamp.timestamp()


def _read_column(path: str | Path, column: str, parse: Callable[[str], T], expected: str) -> list[T]:
    """Every row's ``column`` of a trace CSV, through ``parse`` (a ValueError names the line, the value and
    ``expected``)."""
    source = Path(path)
    try:
        with source.open(newline="") as handle:
            reader = csv.DictReader(handle)
            if reader.fieldnames is None or column not in reader.fieldnames:
                raise VigilInputError(f"trace {source}: expected a CSV with a {column} column")
            values = []
            for line, row in enumerate(reader, start=2):
                text = row[column] or ""
                try:
                    values.append(parse(text))
                except ValueError:
                    raise VigilInputError(
                        f"trace {source} line {line}: bad {column} {text!r}, expected {expected}") from None
    except FileNotFoundError:
        raise VigilInputError(f"trace {source} does not exist") from None
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise VigilInputError(f"trace {source} cannot be read: {err}") from None
    return values


def read_request_times(path: str | Path) -> np.ndarray:
    """Request arrival times (epoch seconds, sorted) from a trace CSV with a TIMESTAMP column."""
    times = _read_column(path, "TIMESTAMP", _timestamp, "YYYY-MM-DD HH:MM:SS")
    if not times:
        raise VigilInputError(f"trace {path} holds no requests")
    return np.sort(np.asarray(times, dtype=float))


def peak_rates(times: np.ndarray, interval_s: float, burst_window_s: float = BURST_WINDOW_S) -> np.ndarray:
    """Per interval, the request rate (per second) of its busiest ``burst_window_s`` window."""
    if interval_s < burst_window_s or interval_s % burst_window_s:
        raise VigilInputError(f"interval {interval_s:g}s must be a multiple of {burst_window_s:g}s")
    start = times[0]
    per_interval = int(interval_s // burst_window_s)
    intervals = int((times[-1] - start) // interval_s) + 1
    windows = np.floor((times - start) / burst_window_s).astype(int)
    counts = np.bincount(windows, minlength=intervals * per_interval)[: intervals * per_interval]
    return counts.reshape(intervals, per_interval).max(axis=1) / burst_window_s


def _count(text: str) -> int:
    if not text.strip().isdigit():
        raise ValueError(text)
    return int(text)


def read_generation_lengths(path: str | Path) -> np.ndarray:
    """Generated tokens per request (in trace order) from a trace CSV with a GeneratedTokens column."""
    lengths = _read_column(path, "GeneratedTokens", _count, "a count")
    positive = np.asarray([n for n in lengths if n > 0], dtype=float)
    if positive.size == 0:
        raise VigilInputError(f"trace {path} holds no request with generated tokens")
    return positive


def peak_rates_from_prometheus(source: PromQLSource, rate_expr: str, end: float, intervals: int, interval_s: float,
                               burst_window_s: float = BURST_WINDOW_S) -> np.ndarray:
    """Per interval ending at ``end`` (``intervals`` of them), the busiest ``burst_window_s`` of ``rate_expr``
    (one series of requests per second, e.g. ``sum(rate(vllm:request_success_total[10s]))``), by the subquery
    ``max_over_time((rate_expr)[interval:burst_window])``; an interval with no sample has no load."""
    if intervals < 1:
        raise VigilInputError("the PromQL lookback must cover at least one interval")
    expr = f"max_over_time(({rate_expr})[{interval_s:g}s:{burst_window_s:g}s])"
    start = end - (intervals - 1) * interval_s
    found = source.query_range(expr, start, end, interval_s)
    if len(found) > 1:
        raise VigilInputError(f"query {rate_expr!r} gives {len(found)} series; aggregate it to one, e.g. sum(...)")
    rates = np.zeros(intervals)
    if found:
        index = np.rint((found[0].ts - start) / interval_s).astype(int)
        keep = (index >= 0) & (index < intervals) & np.isfinite(found[0].values)
        rates[index[keep]] = found[0].values[keep]
    return rates
