"""Timestamps in log lines: ISO 8601 (Python logging, NCCL WARN, journald), ctime (dmesg -T), syslog and
glog (PyTorch C++) forms. Times without a zone are read as UTC; forms without a year take ``year``.
"""

from __future__ import annotations

import calendar
import re
from datetime import UTC, datetime

_MONTHS = {m: i for i, m in enumerate(calendar.month_abbr) if m}
_MON = r"(?P<mon>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"

_ISO = re.compile(
    r"(?P<y>\d{4})-(?P<m>\d{2})-(?P<d>\d{2})[T ](?P<H>\d{2}):(?P<M>\d{2}):(?P<S>\d{2})"
    r"(?:[.,](?P<frac>\d{1,9}))?(?P<tz>Z|[+-]\d{2}:?\d{2})?"
)
_CLOCK = r"(?P<H>\d{2}):(?P<M>\d{2}):(?P<S>\d{2})"
_CTIME = re.compile(rf"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) {_MON} +(?P<d>\d{{1,2}}) {_CLOCK} (?P<y>\d{{4}})")
_SYSLOG = re.compile(rf"^{_MON} +(?P<d>\d{{1,2}}) {_CLOCK}(?:\.(?P<frac>\d+))?")
# glog pads the month (E0626); PyTorch's c10 logger does not (E626).
_GLOG = re.compile(rf"^\[?[IWEF](?P<m>1[0-2]|0?[1-9])(?P<d>\d{{2}}) {_CLOCK}(?:\.(?P<frac>\d+))?")

# Only the head of a line is searched: timestamps lead their lines, and a value deep in a message
# (a date printed by the application) must not be taken for the line's time.
_HEAD = 80


def line_time(line: str, year: int | None = None) -> float | None:
    """Unix time of a log line's leading timestamp, or None when it has none."""
    head = line[:_HEAD]
    found = _ISO.search(head)
    if found:
        return _to_epoch(int(found["y"]), int(found["m"]), int(found["d"]), found, found["tz"])
    found = _CTIME.search(head)
    if found:
        return _to_epoch(int(found["y"]), _MONTHS[found["mon"]], int(found["d"]), found, None)
    this_year = year or datetime.now(tz=UTC).year
    found = _SYSLOG.search(head)
    if found:
        return _to_epoch(this_year, _MONTHS[found["mon"]], int(found["d"]), found, None)
    found = _GLOG.search(head)
    if found:
        return _to_epoch(this_year, int(found["m"]), int(found["d"]), found, None)
    return None


def _to_epoch(year: int, month: int, day: int, found: re.Match[str], tz: str | None) -> float | None:
    try:
        moment = datetime(year, month, day, int(found["H"]), int(found["M"]), int(found["S"]), tzinfo=UTC)
    except ValueError:
        return None
    seconds = moment.timestamp()
    frac = found.groupdict().get("frac")
    if frac:
        seconds += int(frac) / 10 ** len(frac)
    if tz and tz != "Z":
        sign = 1 if tz[0] == "+" else -1
        digits = tz[1:].replace(":", "")
        seconds -= sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
    return seconds
