"""Rank-log decoding: CPU time a line through `decode_rank_line`, the shipped signature matcher against the
one that tries every signature in turn, measured in the same run.

`vigil.sources.collect.ranklog.decode_rank_line` turns a training rank's log line into a `rank_log` event when a
signature of the library names it. Its `SignatureMatcher` screens every line with one combined RE2 regex; a line
the screen lets through is tried only against the signatures an RE2 set says it matches, the first of them in
priority order winning (the shipped path). The baseline is the same matcher with its set switched off
(`matcher._set = None`, as tests/logs/test_signatures.py builds its reference): the line that passes the screen is
tried against every signature one by one, in priority order (the path before the set). Both decode the same lines
in one process; every line must decode to the same event (or none) on both, else the bench stops.

Lines (fixed; nothing is drawn at random):

- cascade: the two lines the simulator writes on every rank of a crashed or hung job (vigil.sources.sim.generator:
  ProcessGroupNCCL's "remote process exited" watchdog line and the "Watchdog caught collective operation timeout"
  line), with each rank's number, time stamp and thread id, --cascade lines in all, half of each;
- real failure logs: every line of the corpus of real failure logs from public issue threads
  (tests/fixtures/logs/real, case files only);
- Loghub-2k: every line of the 10 Loghub-2k systems' raw logs (../shared/data/loghub2k_corrected), other systems'
  logs where the screen lets few lines through.

Each set is decoded --rounds times by each matcher, the two alternated (current first in odd rounds, baseline
first in even ones) so that the load of a shared machine hits both alike; CPU time of this process
(time.process_time) over the set, divided by its lines. Reported: the median and the range over the rounds, and the
ratio baseline / current of the medians (with the range of the rounds' own ratios).

Run: .venv/bin/python bench/rank_decode.py [--rounds 7] [--cascade 2000] -> bench/results/rank_decode.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vigil.knowledge.signatures import SignatureMatcher  # noqa: E402
from vigil.sources.collect import ranklog  # noqa: E402
from vigil.sources.collect.ranklog import decode_rank_line  # noqa: E402

REAL = REPO / "tests" / "fixtures" / "logs" / "real"
LOGHUB = REPO.parent / "shared" / "data" / "loghub2k_corrected"
RESULTS = REPO / "bench" / "results" / "rank_decode.json"
ENGINES = ("current", "baseline")
console = Console()


def cascade_lines(count: int) -> list[str]:
    """The simulator's cascade lines (vigil.sources.sim.generator, _crash_logs and _hang_logs), over ranks
    0-255 and a day of time stamps, alternating the two."""
    lines = []
    for i in range(count):
        rank = i // 2 % 256
        stamp = datetime.fromtimestamp(1_780_000_000 + 37 * i, UTC).strftime("%m%d %H:%M:%S.%f")
        if i % 2 == 0:
            lines.append(f"[rank{rank}]:[E{stamp} 4821{rank % 10} ProcessGroupNCCL.cpp:1895] "
                         f"[PG ID 0 PG GUID 0(default_pg) Rank {rank}] Process group watchdog thread terminated with "
                         "exception: NCCL error: remote process exited or there was a network error, "
                         "NCCL version 2.21.5")
        else:
            lines.append(f"[rank{rank}]:[E{stamp} 4821{rank % 10} ProcessGroupNCCL.cpp:616] [Rank {rank}] "
                         "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=18231, OpType=ALLREDUCE, "
                         "NumelIn=262144000, NumelOut=262144000, Timeout(ms)=600000) ran for 600043 milliseconds "
                         "before timing out.")
    return lines


def real_lines() -> list[str]:
    lines: list[str] = []
    for path in sorted(p for p in REAL.rglob("*") if p.is_file() and p.suffix != ".yaml"):
        lines += path.read_text(errors="replace").splitlines()
    return lines


def loghub_lines() -> list[str]:
    paths = sorted(LOGHUB.rglob("*_2k.log"))
    if not paths:
        raise SystemExit(f"bench/rank_decode.py: no Loghub-2k logs under {LOGHUB} (the shared data directory)")
    return [line for path in paths for line in path.read_text(errors="replace").splitlines()]


def decode_all(lines: list[str]) -> list[dict[str, object] | None]:
    out = []
    for i, line in enumerate(lines):
        event = decode_rank_line(f"job/bench/rank/{i % 64}", line, 0.0)
        out.append(None if event is None else event.model_dump(mode="json"))
    return out


def cpu_seconds(lines: list[str]) -> float:
    started = time.process_time()
    for i, line in enumerate(lines):
        decode_rank_line(f"job/bench/rank/{i % 64}", line, 0.0)
    return time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="alternated rounds of each matcher over each set")
    parser.add_argument("--cascade", type=int, default=2000, help="generated cascade lines")
    args = parser.parse_args()

    sets = {"cascade": cascade_lines(args.cascade), "real failures": real_lines(),
            "Loghub-2k": loghub_lines()}
    started_at = time.perf_counter()
    with console.status("building the two matchers"):
        current = SignatureMatcher()
        baseline = SignatureMatcher()
        baseline._set = None
    if current._set is None:
        raise SystemExit("bench/rank_decode.py: the shipped matcher has no RE2 set (google-re2 missing?)")
    matchers = {"current": current, "baseline": baseline}
    original = ranklog._matcher

    def use(engine: str) -> None:
        ranklog._matcher = lambda: matchers[engine]  # type: ignore[assignment]

    try:
        # one pass each: the events must be the same, and it warms both matchers' caches
        hits = {}
        for name, lines in sets.items():
            decoded = {}
            for engine in ENGINES:
                use(engine)
                decoded[engine] = decode_all(lines)
            differ = [lines[i] for i, (a, b) in enumerate(zip(decoded["current"], decoded["baseline"], strict=True))
                      if a != b]
            if differ:
                raise SystemExit(f"bench/rank_decode.py: {len(differ)} line(s) of {name} decode differently, "
                                 f"e.g. {differ[0]!r}")
            hits[name] = sum(event is not None for event in decoded["current"])
        cpu: dict[str, dict[str, list[float]]] = {name: {e: [] for e in ENGINES} for name in sets}
        with Progress(TextColumn("decoding"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, transient=True) as bar:
            task = bar.add_task("rounds", total=args.rounds * len(sets) * len(ENGINES))
            for round_ in range(args.rounds):
                order = ENGINES if round_ % 2 == 0 else ENGINES[::-1]
                for name, lines in sets.items():
                    for engine in order:
                        use(engine)
                        cpu[name][engine].append(cpu_seconds(lines))
                        bar.advance(task)
    finally:
        ranklog._matcher = original

    rows = []
    table = Table("lines", "count", "events", "current µs/line", "baseline µs/line", "ratio",
                  title=f"Rank-log decoding, CPU µs a line: median (range) of {args.rounds} alternated rounds "
                        f"({os.cpu_count()}-core machine, load {os.getloadavg()[0]:.1f})")
    for name, lines in sets.items():
        per_line = {e: [1000 * s / len(lines) for s in cpu[name][e]] for e in ENGINES}
        median = {e: statistics.median(per_line[e]) for e in ENGINES}
        ratios = [b / c for b, c in zip(per_line["baseline"], per_line["current"], strict=True)]
        row = {"set": name, "lines": len(lines), "events": hits[name],
               **{f"{e}_ms_per_line": per_line[e] for e in ENGINES},
               **{f"{e}_ms_per_line_median": median[e] for e in ENGINES},
               "ratio_of_medians": median["baseline"] / median["current"],
               "ratio_min": min(ratios), "ratio_max": max(ratios)}
        rows.append(row)
        table.add_row(name, f"{len(lines):,}", f"{hits[name]:,}",
                      *(f"{1000 * median[e]:.1f} ({1000 * min(per_line[e]):.1f}-{1000 * max(per_line[e]):.1f})"
                        for e in ENGINES),
                      f"{row['ratio_of_medians']:.1f}x ({row['ratio_min']:.1f}-{row['ratio_max']:.1f})")
    console.print(table)
    signatures = len(current.signatures)
    console.print(f"{signatures} signatures; every line decoded to the same event (or none) with both matchers; "
                  f"{time.perf_counter() - started_at:.0f} s in all")

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": platform.processor() or platform.machine(), "cores": os.cpu_count(),
        "load_average_at_end": os.getloadavg()[0], "rounds": args.rounds, "signatures": signatures,
        "current": "SignatureMatcher as shipped: RE2 screen, then the RE2 set's candidates in priority order",
        "baseline": "the same matcher with its set off (_set = None): every signature in turn after the screen",
        "same_events_on_every_line": True, "sets": rows,
    }, indent=2))
    console.print(f"wrote {RESULTS.relative_to(REPO)}")


if __name__ == "__main__":
    main()
