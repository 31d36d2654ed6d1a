"""Read a rank's stacks from outside with `py-spy dump`: works while the rank holds the GIL."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class StackDumps:
    """py-spy output per rank, plus why a rank could not be read (no py-spy, no ptrace, exited)."""

    dumps: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)


def find_pyspy() -> str | None:
    beside_python = Path(sys.executable).parent / "py-spy"
    if beside_python.exists():
        return str(beside_python)
    return shutil.which("py-spy")


def dump_one(pyspy: str, pid: int, timeout_s: float, native: bool = False) -> list[dict[str, Any]]:
    """One process; raises RuntimeError with py-spy's own first line when it cannot attach.
    ``native``: C / C++ frames too (``--native``), for a rank stuck inside an extension."""
    try:
        proc = subprocess.run(
            [pyspy, "dump", "--pid", str(pid), "--json", *(["--native"] if native else [])],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"py-spy dump of pid {pid} took longer than {timeout_s:.0f} s") from None
    if proc.returncode != 0:
        first = (proc.stderr.strip().splitlines() or ["no output"])[0]
        if "ermission" in proc.stderr:
            first += " (py-spy needs ptrace: run as root or grant CAP_SYS_PTRACE)"
        raise RuntimeError(f"py-spy could not read pid {pid}: {first}")
    data = json.loads(proc.stdout)
    if not isinstance(data, list):
        raise RuntimeError(f"py-spy dump of pid {pid}: unexpected output")
    return data


def dump_all(pids: dict[int, int], timeout_s: float = 10.0, native: bool = False) -> StackDumps:
    """Dump every rank in parallel; failures are recorded per rank, never raised."""
    result = StackDumps()
    pyspy = find_pyspy()
    if pyspy is None:
        result.errors = {rank: "py-spy is not installed" for rank in pids}
        return result

    def one(item: tuple[int, int]) -> tuple[int, list[dict[str, Any]] | str]:
        rank, pid = item
        try:
            return rank, dump_one(pyspy, pid, timeout_s, native)
        except (RuntimeError, json.JSONDecodeError, OSError) as err:
            return rank, str(err)

    with ThreadPoolExecutor(max_workers=min(16, max(1, len(pids)))) as pool:
        for rank, outcome in pool.map(one, pids.items()):
            if isinstance(outcome, str):
                result.errors[rank] = outcome
            else:
                result.dumps[rank] = outcome
    return result


def native_frames(dump: list[dict[str, Any]], limit: int = 8) -> list[str]:
    """The main thread's innermost frames outside Python source, from a ``--native`` dump:
    ``"name (library)"``, innermost first."""
    main = next((t for t in dump if t.get("os_thread_id") == t.get("pid")), dump[0] if dump else None)
    frames = []
    for frame in (main or {}).get("frames", []):
        filename = str(frame.get("filename", ""))
        if filename.endswith(".py"):
            break
        frames.append(f"{frame.get('name', '?')} ({frame.get('short_filename') or Path(filename).name})")
    return frames[:limit]
