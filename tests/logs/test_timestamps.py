"""Leading timestamps: glog pads the month, PyTorch's c10 logger does not; both must read as the same moment."""

from __future__ import annotations

from datetime import UTC, datetime

from vigil.logs.timestamps import line_time


def _at(month: int, day: int, clock: str) -> float:
    hour, minute, second = clock.split(":")
    whole, _, frac = second.partition(".")
    moment = datetime(2025, month, day, int(hour), int(minute), int(whole), tzinfo=UTC).timestamp()
    return moment + (int(frac) / 10 ** len(frac) if frac else 0.0)


def test_c10_stamp_without_a_padded_month() -> None:
    line = "[E626 05:06:30.929096625 ProcessGroupNCCL.cpp:632] [Rank 2] Watchdog caught collective operation timeout"
    assert line_time(line, year=2025) == _at(6, 26, "05:06:30.929096625")


def test_padded_and_two_digit_months() -> None:
    assert line_time("I0626 05:06:30.5 main.cc:1] up", year=2025) == _at(6, 26, "05:06:30.5")
    assert line_time("[E1206 18:44:12.715 ProcessGroupNCCL.cpp:607] x", year=2025) == _at(12, 6, "18:44:12.715")


def test_stamps_order_lines_printed_out_of_order() -> None:
    later = line_time("[E626 05:14:36.393067540 ProcessGroupNCCL.cpp:1743] stuck", year=2025)
    earlier = line_time("[E626 05:06:30.929096625 ProcessGroupNCCL.cpp:632] timeout", year=2025)
    assert later is not None and earlier is not None and earlier < later


def test_not_a_stamp() -> None:
    assert line_time("E6 05:06:30 too short", year=2025) is None
    assert line_time("Error 1326 05:06:30", year=2025) is None
