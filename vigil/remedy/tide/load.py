"""Inference load from a request trace: a CSV with a TIMESTAMP column (Azure LLM inference trace form,
``2023-11-16 18:17:03.9799600``), binned into the planner's intervals."""

from __future__ import annotations

import csv
from datetime import datetime
from pathlib import Path

import numpy as np

from vigil.model import VigilInputError
from vigil.sources.promql import PromQLSource

# Capacity must carry the peak inside an interval, not its mean: the load of an interval is the busiest
# sub-window's request rate.
BURST_WINDOW_S = 10.0


def _timestamp(text: str) -> float:
    head, _, fraction = text.strip().partition(".")
    # Python parses at most six fraction digits; the Azure trace writes seven.
    stamp = datetime.fromisoformat(f"{head}.{fraction[:6]}" if fraction else head)
    return stamp.timestamp()


def read_request_times(path: str | Path) -> np.ndarray:
    """Request arrival times (epoch seconds, sorted) from a trace CSV with a TIMESTAMP column."""
    source = Path(path)
    try:
        with source.open(newline="") as handle:
            reader = csv.DictReader(handle)
            if reader.fieldnames is None or "TIMESTAMP" not in reader.fieldnames:
                raise VigilInputError(f"trace {source}: expected a CSV with a TIMESTAMP column")
            times = []
            for line, row in enumerate(reader, start=2):
                try:
                    times.append(_timestamp(row["TIMESTAMP"] or ""))
                except ValueError:
                    raise VigilInputError(
                        f"trace {source} line {line}: bad TIMESTAMP {row['TIMESTAMP']!r}, expected YYYY-MM-DD HH:MM:SS"
                    ) from None
    except FileNotFoundError:
        raise VigilInputError(f"trace {source} does not exist") from None
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise VigilInputError(f"trace {source} cannot be read: {err}") from None
    if not times:
        raise VigilInputError(f"trace {source} holds no requests")
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


def read_generation_lengths(path: str | Path) -> np.ndarray:
    """Generated tokens per request (in trace order) from a trace CSV with a GeneratedTokens column."""
    source = Path(path)
    try:
        with source.open(newline="") as handle:
            reader = csv.DictReader(handle)
            if reader.fieldnames is None or "GeneratedTokens" not in reader.fieldnames:
                raise VigilInputError(f"trace {source}: expected a CSV with a GeneratedTokens column")
            lengths = []
            for line, row in enumerate(reader, start=2):
                text = (row["GeneratedTokens"] or "").strip()
                if not text.isdigit():
                    raise VigilInputError(f"trace {source} line {line}: bad GeneratedTokens {text!r}, expected a count")
                lengths.append(int(text))
    except FileNotFoundError:
        raise VigilInputError(f"trace {source} does not exist") from None
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise VigilInputError(f"trace {source} cannot be read: {err}") from None
    positive = np.asarray([n for n in lengths if n > 0], dtype=float)
    if positive.size == 0:
        raise VigilInputError(f"trace {source} holds no request with generated tokens")
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
