"""Directory usage: `vigil du`'s scanner against GNU du on a generated tree of 1,000,000 files.

Run: .venv/bin/python bench/du.py [--top 100 --mid 100 --files 100] [--dir /tmp/vigil-du-bench]
     -> bench/results/du.json

The tree is top x mid leaf directories with `files` files each (most empty, one in ten with a few bytes, one
in a hundred with 64 KiB), made once and kept under --dir. Rows, each the median of --repeat runs, page cache
warm for both tools, GNU du and the scanner alternating in the same run:
- first scan: GNU `du -s -B1` against the scanner with no cache, in one process and in --workers forked
  processes (`vigil du`'s default: one per CPU, at most 8);
- re-scan: after a new file is written into 1% of the leaf directories, GNU du again against the scanner
  with its cache (`vigil du`'s default; a re-scan stays in one process). Both must report the same bytes
  (checked on every run). A directory changed less than the scanner's racy window (2 s) before a scan is
  listed again by the next one too; periodic scans are minutes apart, so each round's changes are made at
  least that long before its scan (the round waits out what GNU du's own run did not cover). Without the
  wait every round after the first would also list the previous round's directories again.
Beside wall time, the CPU seconds (user + system) each tool used: on a shared machine they say more.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from vigil.sources.fscount import RACY_NS, ScanCache, default_workers, scan

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "du.json"
console = Console()


def make_tree(root: Path, top: int, mid: int, files: int) -> int:
    marker = root / ".complete"
    if marker.is_file() and marker.read_text() == f"{top} {mid} {files}":
        return top * mid * files
    if root.exists():
        shutil.rmtree(root)
    rng = random.Random(0)
    small, big = b"x" * 100, b"y" * 65536
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("making the tree", total=top * mid)
        for i in range(top):
            for j in range(mid):
                leaf = root / f"t{i:03d}" / f"m{j:03d}"
                leaf.mkdir(parents=True)
                for k in range(files):
                    draw = rng.random()
                    (leaf / f"f{k:04d}").write_bytes(big if draw < 0.01 else small if draw < 0.1 else b"")
                bar.advance(task)
    past = time.time() - 3600
    for path in root.rglob("*"):
        if path.is_dir():
            os.utime(path, (past, past))
    marker.write_text(f"{top} {mid} {files}")
    return top * mid * files


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def gnu_du(root: Path) -> tuple[float, float, int]:
    start, cpu = time.perf_counter(), _cpu(resource.RUSAGE_CHILDREN)
    out = subprocess.run(["du", "-s", "-B1", str(root)], capture_output=True, text=True, check=True).stdout
    return time.perf_counter() - start, _cpu(resource.RUSAGE_CHILDREN) - cpu, int(out.split("\t", 1)[0])


def timed_scan(root: Path, cache: ScanCache | None, workers: int) -> tuple[float, float, int, int]:
    # The walking processes are reaped before scan() returns, so their CPU is in RUSAGE_CHILDREN.
    start, cpu = time.perf_counter(), _cpu(resource.RUSAGE_SELF) + _cpu(resource.RUSAGE_CHILDREN)
    result = scan(root, cache, workers=workers, history_depth=1)
    used = _cpu(resource.RUSAGE_SELF) + _cpu(resource.RUSAGE_CHILDREN) - cpu
    return time.perf_counter() - start, used, result.totals[result.root].bytes, result.listed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=100)
    parser.add_argument("--mid", type=int, default=100)
    parser.add_argument("--files", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--workers", type=int, default=default_workers())
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "vigil-du-bench")
    args = parser.parse_args()

    root = args.dir / "tree"
    n_files = make_tree(root, args.top, args.mid, args.files)
    leaves = sorted(root.glob("t*/m*"))
    rng = random.Random(1)
    workers = args.workers
    with tempfile.TemporaryDirectory() as tmp:
        cache = ScanCache(Path(tmp) / "du.sqlite")
        gnu_du(root)  # warm the page cache for both tools
        names = ("du_first", "scan_first_1", "scan_first_n", "du_rescan", "scan_rescan")
        wall: dict[str, list[float]] = {k: [] for k in names}
        cpu: dict[str, list[float]] = {k: [] for k in names}

        def record(name: str, seconds: float, cpu_seconds: float) -> None:
            wall[name].append(seconds)
            cpu[name].append(cpu_seconds)

        for _ in range(args.repeat):
            t, c, expect = gnu_du(root)
            record("du_first", t, c)
            for n, name in ((1, "scan_first_1"), (workers, "scan_first_n")):
                t, c, got, _ = timed_scan(root, None, n)
                assert got == expect, f"scanner {got} bytes, du {expect}"
                record(name, t, c)
        timed_scan(root, cache, workers)  # fill the cache
        listed: list[int] = []
        for round_ in range(args.repeat):
            for leaf in rng.sample(leaves, max(1, len(leaves) // 100)):
                (leaf / f"new-{round_}").write_bytes(b"z" * 5000)
            changed_at = time.monotonic()
            t, c, expect = gnu_du(root)
            record("du_rescan", t, c)
            # The time between periodic scans, not a synchronisation: see the module docstring.
            time.sleep(max(0.0, RACY_NS / 1e9 + 0.1 - (time.monotonic() - changed_at)))
            t, c, got, n_listed = timed_scan(root, cache, workers)
            assert got == expect, f"scanner {got} bytes after the change, du {expect}"
            record("scan_rescan", t, c)
            listed.append(n_listed)
    for round_ in range(args.repeat):
        for leaf in leaves:
            (leaf / f"new-{round_}").unlink(missing_ok=True)

    med = {k: statistics.median(v) for k, v in wall.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    table = Table(title=f"Directory usage, {n_files:,} files in {len(leaves):,} leaf directories")
    for column in ("what", "GNU du s", "vigil s", "du / vigil", "GNU du CPU s", "vigil CPU s"):
        table.add_column(column, justify="right")
    for label, du_key, key in (
        ("first scan, 1 process", "du_first", "scan_first_1"),
        (f"first scan, {workers} processes", "du_first", "scan_first_n"),
        ("re-scan after 1% of dirs changed", "du_rescan", "scan_rescan"),
    ):
        table.add_row(label, f"{med[du_key]:.3f}", f"{med[key]:.3f}", f"{med[du_key] / med[key]:.2f}x",
                      f"{med_cpu[du_key]:.3f}", f"{med_cpu[key]:.3f}")
    console.print(table)
    console.print(f"directories listed again per re-scan: {listed}; load average {os.getloadavg()}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "machine": platform.processor() or platform.machine(), "cores": os.cpu_count(), "files": n_files,
        "leaf_dirs": len(leaves), "repeat": args.repeat, "workers": workers, "median_seconds": med,
        "median_cpu_seconds": med_cpu, "load_average_after": os.getloadavg(),
        "first_scan_ratio_1_process": med["du_first"] / med["scan_first_1"],
        "first_scan_ratio_workers": med["du_first"] / med["scan_first_n"],
        "rescan_ratio": med["du_rescan"] / med["scan_rescan"], "rescan_listed_dirs": listed,
    }, indent=2) + "\n")


if __name__ == "__main__":
    main()
