"""Following a rank's log: complete lines only, the offset kept between looks, a bounded look, long lines cut,
a truncated or replaced file read again from its start."""

from __future__ import annotations

import os
from pathlib import Path

from vigil.sources.collect.tail import LogTail


def _append(path: Path, data: bytes) -> None:
    with path.open("ab") as f:
        f.write(data)


def test_only_complete_lines_are_read_and_the_offset_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "rank0.log"
    tail = LogTail(path)
    assert tail.read() == []  # not written yet
    _append(path, b"step 1\r\nstep 2\nRuntimeError: Connection clo")
    assert tail.read() == ["step 1", "step 2"]
    assert tail.offset == len(b"step 1\r\nstep 2\n")
    assert tail.read() == []  # the line being written waits for its end
    _append(path, "sed by peer \u00e9\n".encode())
    assert tail.read() == ["RuntimeError: Connection closed by peer \u00e9"]
    assert tail.read() == []
    assert tail.offset == path.stat().st_size


def test_a_look_reads_a_bounded_number_of_lines_and_bytes(tmp_path: Path) -> None:
    path = tmp_path / "rank0.log"
    path.write_bytes(b"".join(b"line %d\n" % i for i in range(10)))
    tail = LogTail(path, max_lines=4)
    looks = [tail.read() for _ in range(4)]
    assert [len(look) for look in looks] == [4, 4, 2, 0]
    assert sum(looks, []) == [f"line {i}" for i in range(10)]

    path.write_bytes(b"".join(b"%04d\n" % i for i in range(100)))  # 5 bytes a line
    tail = LogTail(path, max_bytes=12)
    assert tail.read() == ["0000", "0001"]  # a third line would not fit in the look's 12 bytes
    assert tail.read() == ["0002", "0003"]
    assert tail.offset == 20


def test_long_lines_are_cut(tmp_path: Path) -> None:
    path = tmp_path / "rank0.log"
    # a line longer than the line limit but within a look is cut at the limit
    path.write_bytes(b"E" * 50 + b"\nnext\n")
    assert LogTail(path, line_limit=10).read() == ["E" * 10, "next"]
    # a line longer than a whole look: its head is kept, the rest skipped, the next line read whole
    path.write_bytes(b"x" * 100)
    tail = LogTail(path, max_bytes=32, line_limit=24)
    assert tail.read() == ["x" * 24]
    assert [tail.read() for _ in range(3)] == [[], [], []]
    assert tail.offset == 100
    _append(path, b"y" * 40 + b"\nValueError: bad batch\n")
    seen = [line for _ in range(8) for line in tail.read()]
    assert seen == ["ValueError: bad batch"]
    assert tail.offset == path.stat().st_size


def test_a_truncated_or_replaced_file_is_read_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "rank0.log"
    path.write_bytes(b"old 1\nold 2\nold 3\n")
    tail = LogTail(path)
    assert len(tail.read()) == 3
    path.write_bytes(b"new 1\n")  # truncated in place (shorter than what was read)
    assert tail.read() == ["new 1"]
    rotated = tmp_path / "rank0.log.1"
    os.replace(path, rotated)
    path.write_bytes(b"fresh 1\nfresh 2\nfresh 3\n")  # a new file at the path, longer than the old one
    assert tail.read() == ["fresh 1", "fresh 2", "fresh 3"]
    path.unlink()
    assert tail.read() == []


def test_a_missing_file_is_not_present_and_is_reported(tmp_path: Path) -> None:
    from vigil.sources.collect.base import ProblemLog

    path = tmp_path / "kern.log"
    tail = LogTail(path)
    tail.problems = ProblemLog("kernel")
    assert tail.read() == [] and not tail.present
    assert tail.read() == [] and tail.problems.snapshot() == {"missing file": 2}
    _append(path, b"NVRM: Xid (PCI:0000:9b:00): 79, GPU has fallen off the bus.\n")
    assert tail.read() == ["NVRM: Xid (PCI:0000:9b:00): 79, GPU has fallen off the bus."] and tail.present
