"""Root-error triage: the root line named on real failure logs from public issue threads, and throughput.

1. Root line on the corpus of real failure logs (tests/fixtures/logs/real, vigil_eval.realcorpus): the development
   part (tuned on), the held-out part of collection rounds 1-5, the held-out half of round 6, and every held-out case
   together, each beside the first-error-line and last-error-line baselines in the same run.
2. Throughput: lines per second through `vigil.logs.triage`, with the signature screen on RE2 (the shipped path)
   against the same screen on Python's `re` (the previous path), and RE2 with one worker process per core; every
   engine must name the injected CUDA error as the root. Wall time and CPU time (this process and its finished
   worker processes) with the 1-minute load average of each run: on a shared machine the CPU time is the cost.
3. A learned ranker over the candidate root lines (vigil_eval.triage_ranker), tried against the rules: every
   configuration's leave-rounds-out cross-validation on the development cases, the rules' development score, the
   decision (the held-out cases are read once, only if the ranker wins in development CV), the chosen linear model as
   JSON (bench/results/triage_ranker_model.json), and the ranker's cost beside triage's on the throughput job.

4. Robustness (vigil_eval.robustness): the development cases re-rendered the way other collectors deliver the same
   lines (CRI, docker logs -t, kubectl logs --prefix, srun --label, journald, CRLF, colour codes, torch's rank prefix,
   a healthy rank's lines interleaved, mpirun --tag-output, pdsh, Ray's driver, docker compose, moreutils' ts, a UTF-8
   byte order mark, a terminal's 80-column cuts, a Markdown quote or indented code block), per transform the
   development cases whose root line triage still names. Only with --only-robustness (the held-out cases are never
   read).

Run: .venv/bin/python bench/triage.py [--ranks 4] [--lines 100000] [--only-real-logs | --only-throughput |
     --only-ranker | --only-robustness]
   -> bench/results/triage.json

Each rank's log is real-shaped training output: timestamped step lines, NCCL INFO lines with the `[rankN]:`
prefix, plain stdout, lines drawn from the real loghub corpora (../shared/data/loghub2k_corrected), and one
CUDA error near the end of one rank. The loghub lines that a root signature matches (12 of 20,000: BGL machine
checks stamped 2005, HPC power-supply failures) are left out of the filler: they are other systems' real failures,
dated before the injected one, and would be the job's root. Both engines must name the injected error.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vigil.knowledge import signatures  # noqa: E402
from vigil.knowledge.signatures import SignatureMatcher  # noqa: E402
from vigil.logs.triage import decide, scan_directory, triage  # noqa: E402
from vigil_eval import robustness, triage_ranker  # noqa: E402
from vigil_eval.realcorpus import TABLE_COLUMNS, load_cases, score_corpus, table_rows  # noqa: E402

LOGHUB = REPO.parent / "shared" / "data" / "loghub2k_corrected"
INJECTED_ROOT = "cuda.illegal_address"  # the signature of the one failure write_job injects
RESULTS = REPO / "bench" / "results" / "triage.json"
RANKER_MODEL = REPO / "bench" / "results" / "triage_ranker_model.json"
console = Console()
T = TypeVar("T")


def write_job(root: Path, ranks: int, lines: int, seed: int = 0) -> int:
    rng = random.Random(seed)
    matcher = SignatureMatcher()  # filler only: no other system's real failure, so the injected error is the root

    def filler(line: str) -> bool:
        hit = matcher.match(line)
        return hit is None or hit.signature.role != "root"

    corpus = [line for path in sorted(LOGHUB.rglob("*_2k.log"))
              for line in path.read_text(errors="replace").splitlines() if filler(line)]
    total = 0
    for rank in range(ranks):
        node = root / f"n{rank // 8:03d}"
        node.mkdir(parents=True, exist_ok=True)
        out = []
        for i in range(lines):
            kind = i % 4
            if kind == 0:
                out.append(f"2026-11-30 10:{(i // 3600) % 60:02d}:{(i // 60) % 60:02d},{i % 1000:03d} INFO step {i} "
                           f"loss {rng.random():.4f} lr 3e-4 tokens/s {rng.randint(100000, 200000)}")
            elif kind == 1:
                out.append(f"[rank{rank}]: n000:1234:5678 [{rank}] NCCL INFO Channel {i % 32:02d}/0 : "
                           f"{rank}[{rank}] -> {rank + 1}[{rank + 1}] via P2P/IPC")
            elif kind == 2:
                out.append(f"  plain output {i}: {rng.random():.6f} {rng.random():.6f}")
            else:
                out.append(rng.choice(corpus))
        if rank == ranks - 1:
            out.append("2026-11-30 11:00:00,000 ERROR RuntimeError: CUDA error: an illegal memory access was "
                       "encountered")
        (node / f"rank_{rank}.log").write_text("\n".join(out) + "\n")
        total += len(out)
    return total


def timed(root: Path, engine: str, workers: int = 1) -> dict[str, Any]:
    original = signatures._screen
    if engine == "re":
        signatures._screen = re.compile
    try:
        cpu_started = _cpu_now()
        started = time.perf_counter()
        result = triage(root, workers=workers)
        seconds = time.perf_counter() - started
        cpu_seconds = _cpu_now() - cpu_started
    finally:
        signatures._screen = original
    return {"seconds": seconds, "cpu_seconds": cpu_seconds, "root": result.root.signature if result.root else None,
            "workers": workers, "load_average": os.getloadavg()[0]}


def _cpu_now() -> float:
    """CPU seconds of this process and of its finished worker processes: what the work cost, whatever else the
    (shared) machine runs at the time, unlike wall time."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def real_logs() -> dict[str, Any]:
    scored = score_corpus()
    table = Table(*TABLE_COLUMNS, title="Root line named on real failure logs from public issue threads")
    for row in table_rows(scored):
        table.add_row(*row)
    console.print(table)
    misses = scored["development_misses"]
    console.print(f"development misses: {', '.join(misses) if misses else 'none'}")
    return scored


def robust() -> dict[str, Any]:
    """Part 4: per transform, the development cases whose root triage still names (the held-out ones are not read)."""
    cases = [c for c in load_cases() if c.split == "development"]
    scored = robustness.score(cases)
    table = Table("transform", "right", "misses",
                  title="Development cases re-rendered as other collectors deliver them")
    for name, row in scored.items():
        misses: list[str] = row["misses"]  # type: ignore[assignment]
        table.add_row(name, f"{row['right']}/{row['cases']}", ", ".join(misses) or "none")
    Console(width=200).print(table)
    return scored


def _cpu(work: Callable[[], T]) -> tuple[float, T]:
    started = time.process_time()
    out = work()
    return time.process_time() - started, out


def ranker(job: Path, total: int) -> dict[str, Any]:
    """Part 3: the learned ranker against the rules, chosen by leave-rounds-out CV on development cases only."""
    cv = triage_ranker.development_cv()
    rules = cv["rules_development"]
    folds = list(cv["runs"][0]["folds"])
    table = Table(title=f"Learned ranker, leave-rounds-out CV on the {cv['cases']} development cases "
                        f"(rules, in-sample: {rules}/{cv['cases']})")
    for col in ("configuration", "right", *[f"round {f}" for f in folds]):
        table.add_column(col, justify="left" if col == "configuration" else "right")
    for i, run in enumerate(cv["runs"]):
        mark = " (chosen)" if i == cv["chosen_index"] else ""
        table.add_row(run["config"] + mark, f"{run['right']}/{run['cases']}",
                      *[f"{run['folds'][f]['right']}/{run['folds'][f]['cases']}" for f in folds])
    table.add_row("rules (in-sample)", f"{rules}/{cv['cases']}",
                  *[f"{cv['runs'][0]['folds'][f]['rules_right']}/{cv['runs'][0]['folds'][f]['cases']}" for f in folds])
    Console(width=160).print(table)
    chosen = triage_ranker.CONFIGS[cv["chosen_index"]]
    best = cv["runs"][cv["chosen_index"]]["right"]
    decision: dict[str, Any] = {"wins_development_cv": best > rules}
    model = triage_ranker.train_final(chosen, RANKER_MODEL)  # on every development case
    if best > rules:  # the one look at the held-out cases
        held = triage_ranker.held_out_once(model)
        decision.update(held_out=held, adopted=held["ranker"] >= held["rules"])
        console.print(f"held out, once: ranker {held['ranker']}/{held['cases']}, rules {held['rules']}/{held['cases']}")
    else:
        decision.update(held_out=None, adopted=False)
        console.print(f"the ranker does not win in development CV ({best} vs the rules' {rules}): the rules stay, "
                      "the held-out cases are not read")
    # The ranker reads the scan triage already made: its cost is the candidates' features and scores on top of the
    # scan and the rules' decision. CPU time of this process (the machine may be shared), best of three.
    job_name = "job/bench"
    scans = scan_directory(job, job_name, workers=1)
    scan_s = min(_cpu(lambda: scan_directory(job, job_name, workers=1))[0] for _ in range(3))
    decide_s, result = min((_cpu(lambda: decide(scans, job_name, job)) for _ in range(3)), key=lambda t: t[0])
    rank_s, picked = min((_cpu(lambda: model.pick_full(triage_ranker.candidates(scans, result))) for _ in range(3)),
                         key=lambda t: t[0])
    rules_s = scan_s + decide_s
    speed = {"scan_cpu_s": scan_s, "decide_cpu_s": decide_s, "ranker_cpu_s": rank_s,
             "candidates": len(triage_ranker.candidates(scans, result)),
             "rules_lines_per_s": total / rules_s, "ranker_lines_per_s": total / (rules_s + rank_s),
             "rules_root": result.root.signature if result.root else None,
             "ranker_root": picked.event.signature if picked else None}
    console.print(f"cost on {total:,} lines, one process (CPU time): scan {scan_s:.2f} s + rules {decide_s:.3f} s = "
                  f"{speed['rules_lines_per_s']:,.0f} lines/s; the ranker adds {rank_s:.3f} s over "
                  f"{speed['candidates']} candidates ({speed['ranker_lines_per_s']:,.0f} lines/s, "
                  f"{100 * rank_s / rules_s:+.1f} %); roots: rules {speed['rules_root']}, "
                  f"ranker {speed['ranker_root']}")
    return {**cv, "decision": decision, "speed": speed, "model": str(RANKER_MODEL.relative_to(REPO))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--lines", type=int, default=100_000, help="lines per rank")
    parser.add_argument("--only-real-logs", action="store_true",
                        help="run only part 1 (real failure logs) and update its entry in the results file")
    parser.add_argument("--only-throughput", action="store_true",
                        help="run only part 2 (throughput) and update its entries in the results file")
    parser.add_argument("--only-ranker", action="store_true",
                        help="run only part 3 (the learned ranker) and update its entry in the results file")
    parser.add_argument("--only-robustness", action="store_true",
                        help="run only part 4 (development cases as other collectors deliver them) and update its "
                             "entry in the results file")
    args = parser.parse_args()
    if args.ranks < 1 or args.lines < 1:
        print("bench/triage.py: --ranks and --lines must be positive", file=sys.stderr)
        raise SystemExit(2)
    previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if args.only_robustness:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps({**previous, "robustness": robust(), "robustness_generated_at": stamp}, indent=1))
        console.print(f"updated robustness in {RESULTS.relative_to(REPO)}")
        return
    if args.only_ranker:
        with tempfile.TemporaryDirectory(prefix="vigil-bench-triage-") as tmp:
            root = Path(tmp) / "job"
            learned = ranker(root, write_job(root, args.ranks, args.lines))
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps({**previous, "ranker": learned, "ranker_generated_at": stamp}, indent=1))
        console.print(f"updated ranker in {RESULTS.relative_to(REPO)}")
        return
    if args.only_throughput:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps({**previous, **throughput(args.ranks, args.lines, with_ranker=False)[0],
                                       "throughput_generated_at": stamp}, indent=1))
        console.print(f"updated the throughput entries in {RESULTS.relative_to(REPO)}")
        return
    real = real_logs()
    if args.only_real_logs:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps({**previous, "real_logs": real, "real_logs_generated_at": stamp}, indent=1))
        console.print(f"updated real_logs in {RESULTS.relative_to(REPO)}")
        return
    measured, learned = throughput(args.ranks, args.lines, with_ranker=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({**previous, **measured, "throughput_generated_at": stamp,
                                   "real_logs": real, "real_logs_generated_at": stamp,
                                   "ranker": learned, "ranker_generated_at": stamp}, indent=1))
    console.print(f"wrote {RESULTS.relative_to(REPO)}")


def throughput(ranks: int, lines: int, with_ranker: bool) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Part 2 on one generated job (and part 3's cost on the same job when ``with_ranker``)."""
    learned = None
    with tempfile.TemporaryDirectory(prefix="vigil-bench-triage-") as tmp:
        root = Path(tmp) / "job"
        total = write_job(root, ranks, lines)
        timed(root, "re2")  # warm the page cache and the signature library once
        cores = len(os.sched_getaffinity(0))
        runs = {"re2": timed(root, "re2"), "re": timed(root, "re"),
                f"re2, {cores} worker processes": timed(root, "re2", workers=cores)}
        if with_ranker:
            learned = ranker(root, total)
    if {r["root"] for r in runs.values()} != {INJECTED_ROOT}:
        raise SystemExit(f"an engine did not name the injected {INJECTED_ROOT} as the root: {runs}")
    rows = {engine: {**r, "lines_per_s": total / r["seconds"], "lines_per_cpu_s": total / r["cpu_seconds"]}
            for engine, r in runs.items()}
    ratio = rows["re2"]["lines_per_s"] / rows["re"]["lines_per_s"]
    cpu_ratio = rows["re2"]["lines_per_cpu_s"] / rows["re"]["lines_per_cpu_s"]
    table = Table(title=f"triage of {ranks} ranks x {lines:,} lines ({total:,} lines)")
    parallel = next(k for k in rows if "worker" in k)
    for col in ("screen", "seconds", "lines/s", "CPU seconds", "lines per CPU s", "load", "root error"):
        table.add_column(col, justify="left" if col in ("screen", "root error") else "right")
    for engine, r in rows.items():
        table.add_row(engine, f"{r['seconds']:.2f}", f"{r['lines_per_s']:,.0f}", f"{r['cpu_seconds']:.2f}",
                      f"{r['lines_per_cpu_s']:,.0f}", f"{r['load_average']:.1f}", str(r["root"]))
    console.print(table)
    console.print(f"RE2 screen / Python re screen: {ratio:.1f}x wall, {cpu_ratio:.1f}x CPU; worker processes / one "
                  f"process: {rows[parallel]['lines_per_s'] / rows['re2']['lines_per_s']:.1f}x wall")
    measured = {"machine": platform.processor() or platform.machine(), "cores": os.cpu_count(), "ranks": ranks,
                "lines_per_rank": lines, "total_lines": total, "runs": rows, "ratio": ratio, "cpu_ratio": cpu_ratio}
    return measured, learned


if __name__ == "__main__":
    main()
