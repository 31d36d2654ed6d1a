"""Log intelligence: template mining against Drain3, bounded memory on 1 GB, root-error triage accuracy.

Run: .venv/bin/python bench/logs.py [--size-gb 1.0] [--per-kind 20] [--real-jobs 8] [--only-real-logs]
     [--unseen DIR] [--only-mining] -> bench/results/logs.json (--only-real-logs: part 4 alone, --only-mining:
     parts 1-3 alone, their entries updated in place); --only-loghub2 [--loghub2 DIR] [--loghub2-max-lines N]:
     part 6 alone -> bench/results/logs_loghub2.json; --only-stability [--stability-label NAME]: part 7 alone ->
     bench/results/logs_stability.json

1. Accuracy: grouping accuracy (GA) and parsing accuracy (PA) on the 10 Loghub-2k systems with the
   corrected ground truth (../shared/data/loghub2k_corrected), plus any systems of the same layout in
   --unseen DIR (or $VIGIL_LOGHUB_UNSEEN: the other 6 Loghub-2k systems, kept outside the repository; their
   first measurement, before any change made after looking at them, is bench/results/logs_unseen_first_touch.json),
   for Vigil's miner and the drain3 package
   (0.9.11) twice - default settings (no masking, the README's baseline) and with drain3's own example
   masking (IDs, IPs, hex, numbers) - all fed the raw message contents in file order. GA groups
   lines by their ground-truth template text (Loghub-2.0 convention: the corrected sets give some equal
   templates different event ids). PA: a line's template equals the truth after whitespace
   normalisation, and after also collapsing runs of adjacent wildcards (both are reported).
2. Throughput, same run, same lines, best of 3 alternating rounds: (a) a 150k-line stream made from the
   10 systems' lines with every number redrawn (new values, lengths +-1 digit), the shape of a long
   production log; (b) one pass over each 2k sample with a fresh parser (cold caches, small files).
3. Memory: a generated log of --size-gb (a pool of 200k production-like lines, each written line
   numbered; a temporary file, deleted after) is streamed through the miner in a child process; its
   resident memory is reported after imports, half-way and at the end, with the peak (VmHWM: the peak of
   this process image; ru_maxrss would carry over the forking parent's).
4. Root-error accuracy on real logs: the corpus of real failure logs from public issue threads
   (tests/fixtures/logs/real, vigil_eval.realcorpus), development and held-out parts apart (the split is a hash
   of the case id, fixed before any result; triage is tuned on the development part only). Beside triage: the
   same triage counting only roots named by a signature (what it did before the fallback), and two naive
   baselines - the first line, and the last line, whose wording reads as an error (vigil.logs.severity > 0).
5. Root-error accuracy: the simulated multi-rank failure corpus (vigil_eval.logcorpus, --per-kind jobs for
   each of 14 kinds) and real crashed torch.distributed gloo jobs launched with torchrun
   (vigil_eval.realjobs: Python exception, NaN loss raised, SIGSEGV, SIGKILL; 2-4 ranks). A job counts as
   right when triage's root is the labelled line (or a line reporting the same fault at the same moment)
   on the labelled rank.
6. Loghub-2.0 (Jiang et al., ISSTA'24: the 14 systems at full size, 21k-16M lines, with their corrected
   annotations), run only with --only-loghub2: every system found under --loghub2 DIR (default
   $VIGIL_LOGHUB2, else ../cache/loghub2; <System>/<System>_full.log_structured.csv, kept outside the
   repository) is scored once with the shipped miner settings (no tuning: a first-touch measurement) beside
   drain3 masked and default, each parser alone in a fresh child process on the same lines: GA, PA, FGA, FTA
   (as in part 1), lines/s of the parse alone and the child's peak resident memory (VmHWM; the lines loaded
   before parsing included, that base also reported). A system longer than --loghub2-max-lines (default
   1,000,000) is cut to its first N lines in file order (LineId order), with their labels, for every parser
   alike, and the cut is recorded. Systems not found are listed as absent; with none found it says so and
   exits 2. Vigil is scored by the grouping once the stream is read (a template split off on a word and joined
   later counts as joined, TemplateMiner.canonical); GA of the ids as printed is reported beside it.
7. Size and block dependence, a development criterion on the Loghub-2k systems alone, run only with
   --only-stability: GA of the shipped settings with blocks of 4,096, 1,024 and 256 lines, and on 32,768 lines
   resampled from each sample (seeded, labels carried) shuffled, in bursts, and from at most 6 forms per event;
   by the ids as printed and by the grouping once read. Recorded under --stability-label, so the miner before a
   change and after it sit side by side.
"""

from __future__ import annotations

import argparse
import csv
import importlib
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vigil.logs.miner import Template, TemplateMiner  # noqa: E402
from vigil.logs.triage import triage  # noqa: E402
from vigil_eval.logaccuracy import (  # noqa: E402
    f1_grouping_accuracy,
    f1_template_accuracy,
    grouping_accuracy,
    parsing_accuracy,
)
from vigil_eval.logcorpus import simulate_corpus  # noqa: E402
from vigil_eval.realcorpus import TABLE_COLUMNS, score_corpus, table_rows  # noqa: E402
from vigil_eval.realjobs import MODES, root_label, run_failed_job  # noqa: E402

DATA = REPO.parent / "shared" / "data" / "loghub2k_corrected"
SYSTEMS = ["Android", "Apache", "BGL", "HDFS", "HPC", "Hadoop", "Linux", "OpenStack", "Windows", "Zookeeper"]
# Leave-systems-out folds: two systems held out at a time, the knob tuned on all the others (8, or 14 with the
# unseen systems).
FOLDS = [("Android", "Apache"), ("BGL", "HDFS"), ("HPC", "Hadoop"), ("Linux", "OpenStack"), ("Windows", "Zookeeper")]
SPLIT_VALUES_GRID = [1, 2, 3, 4, 5, 6, 8, 10, 12, 16]
UNIT_LETTERS_GRID = [-1, 2, 3, 4, 5, 6, 8]  # -1: values of different word counts never join (the rule off)
FIELD_VALUES_GRID = [False, True]  # whether words the stream writes as key=value values are values
# how many words wrapped whole in brackets or quotes open a position (10: no fewer than any other words)
SLOT_VALUES_GRID = [1, 2, 3, 4, 10]
RESULTS = REPO / "bench" / "results" / "logs.json"
LOGHUB2_RESULTS = REPO / "bench" / "results" / "logs_loghub2.json"
STABILITY_RESULTS = REPO / "bench" / "results" / "logs_stability.json"
LOGHUB2_DEFAULT = REPO.parent / "cache" / "loghub2"
LOGHUB2_MAX_LINES = 1_000_000
# Loghub-2.0's 14 systems with their annotated line counts (logpai/loghub-2.0 README).
LOGHUB2_LINES = {"Apache": 51_977, "BGL": 4_631_261, "HDFS": 11_167_740, "HPC": 429_987, "Hadoop": 179_993,
                 "HealthApp": 212_394, "Linux": 23_921, "Mac": 100_314, "OpenSSH": 638_946, "OpenStack": 207_632,
                 "Proxifier": 21_320, "Spark": 16_075_117, "Thunderbird": 16_601_745, "Zookeeper": 74_273}
LOGHUB2_PARSERS = ("vigil", "drain3_masked", "drain3")
HELD_OUT_LABEL = "held-out (outside ../shared/data)"
console = Console()


def load(system: str, root: Path = DATA) -> tuple[list[str], list[str]]:
    path = root / system / f"{system}_2k.log_structured_corrected.csv"
    rows = list(csv.DictReader(path.open(newline="", encoding="utf-8")))
    return [r["Content"] for r in rows], [r["EventTemplate"] for r in rows]


# drain3's own example masking (examples/drain3.ini: ID, IP, SEQ, HEX, NUM), for a second, masked baseline.
DRAIN3_MASKING = [
    (r"((?<=[^A-Za-z0-9])|^)(([0-9a-f]{2,}:){3,}([0-9a-f]{2,}))((?=[^A-Za-z0-9])|$)", "ID"),
    (r"((?<=[^A-Za-z0-9])|^)(\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3})((?=[^A-Za-z0-9])|$)", "IP"),
    (r"((?<=[^A-Za-z0-9])|^)([0-9a-f]{6,} ?){3,}((?=[^A-Za-z0-9])|$)", "SEQ"),
    (r"((?<=[^A-Za-z0-9])|^)([0-9A-F]{4} ?){4,}((?=[^A-Za-z0-9])|$)", "SEQ"),
    (r"((?<=[^A-Za-z0-9])|^)(0x[a-f0-9A-F]+)((?=[^A-Za-z0-9])|$)", "HEX"),
    (r"((?<=[^A-Za-z0-9])|^)([\-\+]?\d+)((?=[^A-Za-z0-9])|$)", "NUM"),
]


class Drain3Parser:
    def __init__(self, masked: bool = False) -> None:
        from drain3 import TemplateMiner as Drain3Miner
        from drain3.masking import MaskingInstruction
        from drain3.template_miner_config import TemplateMinerConfig

        config = TemplateMinerConfig()
        config.profiling_enabled = False
        if masked:
            config.masking_instructions = [MaskingInstruction(p, name) for p, name in DRAIN3_MASKING]
        self.miner = Drain3Miner(config=config)

    def parse(self, lines: list[str]) -> list[int]:
        add = self.miner.add_log_message
        return [add(line)["cluster_id"] for line in lines]

    def templates(self, ids: list[int]) -> list[str]:
        by_id = {c.cluster_id: c.get_template() for c in self.miner.drain.clusters}
        return [by_id[i] for i in ids]


def vigil_parse(lines: list[str], block: int = 4096) -> list[str]:
    miner = TemplateMiner()
    out: list[str] = []
    for i in range(0, len(lines), block):
        out.extend(t.id for t in miner.add_templates(lines[i:i + block]))
    return out


def scores(predicted: list[str], templates: list[str], truth: list[str]) -> dict[str, float]:
    return {"ga": grouping_accuracy(predicted, truth), "pa": parsing_accuracy(templates, truth, False),
            "fga": f1_grouping_accuracy(predicted, truth), "fta": f1_template_accuracy(predicted, templates, truth)}


def vigil_scores(contents: list[str], truth: list[str], split_values: int,
                 unit_letters: int = TemplateMiner.max_unit_letters,
                 field_values: bool = TemplateMiner.field_values,
                 slot_values: int = TemplateMiner.max_slot_values) -> dict[str, float]:
    miner = TemplateMiner(max_split_values=split_values, max_unit_letters=unit_letters, field_values=field_values,
                          max_slot_values=slot_values)
    found = [t for i in range(0, len(contents), 4096) for t in miner.add_templates(contents[i:i + 4096])]
    return scores(*grouping(miner, found), truth)


def grouping(miner: TemplateMiner, found: list[Template]) -> tuple[list[str], list[str]]:
    """Each line's template id and text once the whole stream is read (a template split off on a word and joined
    later counts as joined; the ids printed as the stream went are scored apart, in part 7)."""
    final = [miner.canonical(t) for t in found]
    return [t.id for t in final], [t.text for t in final]


def unseen_systems(root: Path | None) -> dict[str, Path]:
    """Systems of the Loghub-2k layout under ``root`` that are not among the ten of ../shared/data."""
    if root is None:
        return {}
    if not root.is_dir():
        raise ValueError(f"--unseen {root}: not a directory")
    found = {path.parent.name: root for path in sorted(root.glob("*/*_2k.log_structured_corrected.csv"))
             if path.parent.name not in SYSTEMS and path.name.startswith(path.parent.name + "_")}
    if not found:
        raise ValueError(f"--unseen {root}: no <System>/<System>_2k.log_structured_corrected.csv inside")
    return found


def folds_for(extra: list[str]) -> list[tuple[str, ...]]:
    """The five folds of the ten systems, then the extra systems two at a time (in name order)."""
    ordered = sorted(extra)
    return FOLDS + [tuple(ordered[i:i + 2]) for i in range(0, len(ordered), 2)]


def accuracy(unseen: dict[str, Path] | None = None) -> dict[str, object]:
    """Leave-systems-out: for each fold, the one knob (max_split_values) is chosen on all the other systems by
    mean GA, and the fold's systems are scored with it. Drain3 (default, and masked) in the same run."""
    unseen = unseen or {}
    roots = {system: DATA for system in SYSTEMS} | unseen
    systems = list(roots)
    data = {system: load(system, root) for system, root in roots.items()}
    settings = [(k, u, f, v) for k in SPLIT_VALUES_GRID for u in UNIT_LETTERS_GRID for f in FIELD_VALUES_GRID
                for v in SLOT_VALUES_GRID]
    grid = {(system, *ku): vigil_scores(*data[system], *ku) for system in systems for ku in settings}
    default_units, default_fields = TemplateMiner.max_unit_letters, TemplateMiner.field_values
    default_slots = TemplateMiner.max_slot_values
    rows = []
    folds = []
    for held_out in folds_for(list(unseen)):
        training = [s for s in systems if s not in held_out]
        # ties go to the shipped max_unit_letters and field_values, then to the smaller max_split_values (fewer
        # words kept as constants), then to the smaller max_slot_values (likewise)
        chosen_k, chosen_u, chosen_f, chosen_v = max(settings, key=lambda ku: (
            round(statistics.fmean(grid[s, *ku]["ga"] for s in training), 6), ku[1] == default_units,
            ku[2] == default_fields, -ku[0], -ku[3]))
        folds.append({"held_out": list(held_out), "chosen_split_values": chosen_k, "chosen_unit_letters": chosen_u,
                      "chosen_field_values": chosen_f, "chosen_slot_values": chosen_v,
                      "ga_mean": statistics.fmean(grid[s, chosen_k, chosen_u, chosen_f, chosen_v]["ga"]
                                                  for s in held_out)})
        for system in held_out:
            contents, truth = data[system]
            drain = Drain3Parser()
            drain_ids = drain.parse(contents)
            masked = Drain3Parser(masked=True)
            masked_ids = masked.parse(contents)
            row: dict[str, object] = {"system": system, "fold_split_values": chosen_k,
                                      "fold_unit_letters": chosen_u, "fold_field_values": chosen_f,
                                      "fold_slot_values": chosen_v,
                                      "set": HELD_OUT_LABEL if system in unseen else "development",
                                      "templates_truth": len(set(truth))}
            row.update({f"{k}_vigil": v for k, v in grid[system, chosen_k, chosen_u, chosen_f, chosen_v].items()})
            row.update({f"{k}_drain3": v for k, v in scores([str(i) for i in drain_ids], drain.templates(drain_ids),
                                                            truth).items()})
            row.update({f"{k}_drain3_masked": v for k, v in scores(
                [str(i) for i in masked_ids], masked.templates(masked_ids), truth).items()})
            rows.append(row)
    default_k = TemplateMiner.max_split_values
    by_value = {k: statistics.fmean(grid[s, k, default_units, default_fields, default_slots]["ga"] for s in systems)
                for k in SPLIT_VALUES_GRID}
    by_units = {u: statistics.fmean(grid[s, default_k, u, default_fields, default_slots]["ga"] for s in systems)
                for u in UNIT_LETTERS_GRID}
    by_fields = {str(f): statistics.fmean(grid[s, default_k, default_units, f, default_slots]["ga"]
                                          for s in systems) for f in FIELD_VALUES_GRID}
    by_slots = {v: statistics.fmean(grid[s, default_k, default_units, default_fields, v]["ga"] for s in systems)
                for v in SLOT_VALUES_GRID}
    return {"rows": rows, "folds": folds, "ga_mean_by_split_values_all_systems": by_value,
            "ga_mean_by_unit_letters_all_systems": by_units, "ga_mean_by_field_values_all_systems": by_fields,
            "ga_mean_by_slot_values_all_systems": by_slots,
            "systems": systems, "held_out_systems": sorted(unseen),
            "default_split_values": default_k, "default_unit_letters": default_units,
            "default_field_values": default_fields, "default_slot_values": default_slots,
            "ga_by_system_and_setting": {f"{s}/{k}/{u}/{int(f)}/{v}": g["ga"] for (s, k, u, f, v), g in grid.items()}}


_DIGITS = re.compile(r"\d+")


def production_stream(seed: int) -> Iterator[str]:
    """Endless log lines: the Loghub lines in random order with every number redrawn."""
    rng = random.Random(seed)
    pool = [line for system in SYSTEMS for line in load(system)[0]]

    def redraw(found: re.Match[str]) -> str:
        width = max(1, len(found.group()) + rng.choice((-1, 0, 0, 1)))
        return str(rng.randrange(10 ** (width - 1) if width > 1 else 0, 10 ** width))

    while True:
        yield _DIGITS.sub(redraw, rng.choice(pool))


def take(stream: Iterator[str], count: int) -> list[str]:
    return [next(stream) for _ in range(count)]


def best_rate(run: Callable[[], object], lines: int, rounds: int = 3) -> list[float]:
    rates = []
    for _ in range(rounds):
        start = time.perf_counter()
        run()
        rates.append(lines / (time.perf_counter() - start))
    return rates


def throughput(stream_lines: int) -> dict[str, object]:
    stream = take(production_stream(7), stream_lines)
    samples = [load(s)[0] for s in SYSTEMS]
    total_sample = sum(len(s) for s in samples)
    rates: dict[str, list[float]] = defaultdict(list)
    for _ in range(3):  # alternate the parsers so machine load hits them alike
        rates["stream_vigil"] += best_rate(lambda: vigil_parse(stream), len(stream), 1)
        rates["stream_drain3"] += best_rate(lambda: Drain3Parser().parse(stream), len(stream), 1)
        rates["stream_drain3_masked"] += best_rate(lambda: Drain3Parser(True).parse(stream), len(stream), 1)
        rates["cold_vigil"] += best_rate(lambda: [vigil_parse(s) for s in samples], total_sample, 1)
        rates["cold_drain3"] += best_rate(lambda: [Drain3Parser().parse(s) for s in samples], total_sample, 1)
        rates["cold_drain3_masked"] += best_rate(lambda: [Drain3Parser(True).parse(s) for s in samples],
                                                 total_sample, 1)
    best = {name: max(values) for name, values in rates.items()}
    return {
        "stream_lines": len(stream), "cold_lines": total_sample, "best_lines_per_s": best, "rounds": dict(rates),
        # against the faster drain3 configuration
        "ratio": best["stream_vigil"] / max(best["stream_drain3"], best["stream_drain3_masked"]),
        "cold_2k_ratio": best["cold_vigil"] / max(best["cold_drain3"], best["cold_drain3_masked"]),
    }


_CHILD = """
import re, resource, sys, time
from pathlib import Path
sys.path.insert(0, {repo!r})
from vigil.logs.miner import TemplateMiner, read_lines
rss = lambda: int(re.search(r"VmHWM:\\s+(\\d+)", Path("/proc/self/status").read_text()).group(1)) / 1024
now = lambda: int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize() / 2**20
size = Path(sys.argv[1]).stat().st_size
base = now(); miner = TemplateMiner(); lines = 0; seen = 0; half = None; start = time.perf_counter()
for block in read_lines(Path(sys.argv[1])):
    miner.add_templates(block); lines += len(block); seen += sum(len(l) + 1 for l in block)
    if half is None and seen >= size // 2:
        half = (lines, now())
took = time.perf_counter() - start
print(lines, took, base, half[0], half[1], now(), rss(), len(miner.templates))
"""


def big_log(path: Path, target: int) -> int:
    """Write a log of ``target`` bytes: a pool of production-like lines, each line numbered."""
    pool = take(production_stream(11), 200_000)
    rng = random.Random(3)
    written = 0
    sequence = 0
    with path.open("w", encoding="utf-8") as out:
        while written < target:
            start = rng.randrange(len(pool) - 20_000)
            chunk = "".join(f"{sequence + i} {line}\n" for i, line in enumerate(pool[start:start + 20_000]))
            sequence += 20_000
            out.write(chunk)
            written += len(chunk.encode("utf-8"))
    return written


def memory(size_gb: float) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="vigil-bench-logs-") as tmp:
        path = Path(tmp) / "big.log"
        with console.status(f"writing a {size_gb:g} GB log"):
            written = big_log(path, int(size_gb * (1 << 30)))
        with console.status("parsing it"):
            done = subprocess.run([sys.executable, "-c", _CHILD.format(repo=str(REPO)), str(path)],
                                  capture_output=True, text=True, check=True)
        lines, took, base, half_lines, half_rss, end_rss, peak, templates = done.stdout.split()
        return {"bytes": written, "lines": int(lines), "seconds": float(took),
                "rss_after_imports_mb": float(base), "lines_at_half": int(half_lines),
                "rss_at_half_mb": float(half_rss), "rss_at_end_mb": float(end_rss), "peak_rss_mb": float(peak),
                "templates": int(templates), "lines_per_s": int(lines) / float(took)}


def root_accuracy(per_kind: int, real_jobs: int) -> dict[str, object]:
    per_kind_right: dict[str, list[int]] = defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="vigil-bench-triage-") as tmp:
        for case, label in simulate_corpus(Path(tmp), per_kind, seed=2026):
            result = triage(case)
            right = (result.root is not None and label.accepts(result.root.source, result.root.lineno)
                     and result.root.rank == label.rank)
            per_kind_right[label.kind].append(int(right))
        real: list[dict[str, object]] = []
        rng = random.Random(5)
        for i in range(real_jobs):
            mode = MODES[i % len(MODES)]
            world = rng.choice([2, 3, 4])
            culprit = rng.randrange(world)
            with console.status(f"real gloo job {i + 1}/{real_jobs}: {world} ranks, rank {culprit} {mode}"):
                job = run_failed_job(Path(tmp) / f"real-{i}", world, mode, culprit)
            label = root_label(job)
            result = triage(job.directory)
            right = (result.root is not None and label.accepts(result.root.source, result.root.lineno)
                     and result.root.rank == culprit)
            real.append({"mode": mode, "world": world, "culprit": culprit, "right": right,
                         "found": result.summary})
    simulated = [x for values in per_kind_right.values() for x in values]
    return {
        "simulated_jobs": len(simulated), "simulated_accuracy": statistics.fmean(simulated),
        "simulated_per_kind": {k: statistics.fmean(v) for k, v in sorted(per_kind_right.items())},
        "real_jobs": len(real), "real_accuracy": statistics.fmean(r["right"] for r in real) if real else None,
        "real": real,
        "overall_accuracy": (sum(simulated) + sum(bool(r["right"]) for r in real)) / (len(simulated) + len(real)),
    }


def mining(args: argparse.Namespace, unseen: dict[str, Path]) -> tuple[
        dict[str, object], dict[str, dict[str, float]], list[float], dict[str, object], dict[str, object]]:
    """Parts 1-3: accuracy (leave-systems-out), throughput, memory; each printed as a table."""
    with console.status("accuracy on Loghub-2k (corrected), leave-systems-out"):
        acc = accuracy(unseen)
    means, fold_means = mining_table(acc)

    with console.status("throughput"):
        speed = throughput(args.stream_lines)
    best = speed["best_lines_per_s"]
    table = Table("workload", "vigil lines/s", "drain3 lines/s", "drain3+mask lines/s", "ratio",
                  title="Throughput (same run, best of 3; ratio vs the faster drain3)")
    for name, label, ratio in (("stream", f"{speed['stream_lines']:,}-line production-like stream", "ratio"),
                               ("cold", "10 x 2k samples, cold", "cold_2k_ratio")):
        table.add_row(label, *(f"{best[f'{name}_{p}']:,.0f}" for p in ("vigil", "drain3", "drain3_masked")),
                      f"{speed[ratio]:.1f}x")
    console.print(table)

    mem = memory(args.size_gb) if args.size_gb > 0 else {}
    if mem:
        table = Table("lines", "RSS after imports MB", "RSS half-way MB", "RSS at end MB", "peak RSS MB",
                      "templates", "lines/s", title=f"Streaming a generated {mem['bytes'] / (1 << 30):.2f} GB log")
        table.add_row(f"{mem['lines']:,}", f"{mem['rss_after_imports_mb']:.0f}", f"{mem['rss_at_half_mb']:.0f}",
                      f"{mem['rss_at_end_mb']:.0f}", f"{mem['peak_rss_mb']:.0f}", str(mem["templates"]),
                      f"{mem['lines_per_s']:,.0f}")
        console.print(table)
    return acc, means, fold_means, speed, mem


def mining_table(acc: dict[str, object]) -> tuple[dict[str, dict[str, float]], list[float]]:
    """Print the accuracy table; the means by set (development, held-out, all) and the fold means."""
    rows: list[dict[str, object]] = acc["rows"]  # type: ignore[assignment]
    columns = ("ga_vigil", "ga_drain3", "ga_drain3_masked", "pa_vigil", "pa_drain3_masked", "fga_vigil",
               "fga_drain3_masked", "fta_vigil", "fta_drain3_masked")
    table = Table("system", "set", "knobs (fold)", "GA vigil", "GA drain3", "GA drain3+mask", "PA vigil",
                  "PA drain3+mask", "FGA vigil", "FGA drain3+mask", "FTA vigil", "FTA drain3+mask",
                  title="Template mining on Loghub-2k (corrected truth), each system scored in the fold that held it "
                        "out (knob tuned on all the other systems)")
    for r in rows:
        table.add_row(str(r["system"]), str(r["set"]),
                      f"{r['fold_split_values']}/{r['fold_unit_letters']}/{'on' if r['fold_field_values'] else 'off'}"
                      f"/{r['fold_slot_values']}",
                      *(f"{float(r[k]):.3f}" for k in columns))  # type: ignore[arg-type]
    means: dict[str, dict[str, float]] = {}
    for name in ("development", HELD_OUT_LABEL, "all"):
        part = [r for r in rows if name in ("all", r["set"])]
        if part and (name != "all" or len(part) > len([r for r in rows if r["set"] == "development"])):
            means[name] = {k: statistics.fmean(float(r[k]) for r in part) for k in columns}  # type: ignore[arg-type]
            table.add_row(f"mean ({len(part)})", name, "", *(f"{means[name][k]:.3f}" for k in columns), style="bold")
    console.print(table)
    folds: list[dict[str, object]] = acc["folds"]  # type: ignore[assignment]
    fold_means = [float(f["ga_mean"]) for f in folds]  # type: ignore[arg-type]
    by_value: dict[int, float] = acc["ga_mean_by_split_values_all_systems"]  # type: ignore[assignment]
    systems: list[str] = acc["systems"]  # type: ignore[assignment]
    by_units: dict[int, float] = acc["ga_mean_by_unit_letters_all_systems"]  # type: ignore[assignment]
    by_fields: dict[str, float] = acc["ga_mean_by_field_values_all_systems"]  # type: ignore[assignment]
    by_slots: dict[int, float] = acc["ga_mean_by_slot_values_all_systems"]  # type: ignore[assignment]
    console.print(f"GA across the {len(folds)} folds: min {min(fold_means):.3f}, max {max(fold_means):.3f}; knobs "
                  "(max_split_values/max_unit_letters/field_values/max_slot_values) chosen per fold: "
                  + ", ".join(f"{f['chosen_split_values']}/{f['chosen_unit_letters']}/"
                              f"{'on' if f['chosen_field_values'] else 'off'}/{f['chosen_slot_values']}" for f in folds)
                  + f"; mean GA on all "
                  f"{len(systems)} by max_split_values: " + ", ".join(f"{k}: {v:.3f}" for k, v in by_value.items())
                  + "; by max_unit_letters: " + ", ".join(f"{u}: {v:.3f}" for u, v in by_units.items())
                  + "; by field_values: " + ", ".join(f"{f}: {v:.3f}" for f, v in by_fields.items())
                  + "; by max_slot_values: " + ", ".join(f"{v}: {g:.3f}" for v, g in by_slots.items()))
    below = [str(r["system"]) for r in rows
             if float(r["ga_vigil"]) < max(float(r["ga_drain3"]), float(r["ga_drain3_masked"]))]  # type: ignore[arg-type]
    console.print(f"GA below drain3 (either configuration) on: {', '.join(below) or 'no system'}")
    return means, fold_means


def mining_targets(rows: list[dict[str, object]], means: dict[str, dict[str, float]]) -> dict[str, bool]:
    targets = {
        "ga_mean_ge_0_95": means["development"]["ga_vigil"] >= 0.95,
        "ga_never_below_drain3_held_out": all(
            float(r["ga_vigil"]) >= max(float(r["ga_drain3"]), float(r["ga_drain3_masked"]))  # type: ignore[arg-type]
            for r in rows),
    }
    if HELD_OUT_LABEL in means:
        targets["ga_mean_ge_0_95_unseen_systems"] = means[HELD_OUT_LABEL]["ga_vigil"] >= 0.95
    return targets


def loghub2_path(root: Path, system: str) -> Path:
    return root / system / f"{system}_full.log_structured.csv"


def load_loghub2(path: Path, max_lines: int) -> tuple[list[str], list[str], bool]:
    """The first ``max_lines`` rows of a Loghub-2.0 structured file (file order): contents, true templates, and
    whether the file had more rows (then it was cut)."""
    contents: list[str] = []
    truth: list[str] = []
    with path.open(newline="", encoding="utf-8") as handle:
        rows = csv.DictReader(handle)
        for row in rows:
            if len(contents) == max_lines:
                return contents, truth, True
            contents.append(row["Content"])
            truth.append(row["EventTemplate"])
    return contents, truth, False


def _rss_mb(field: str) -> float:
    found = re.search(rf"{field}:\s+(\d+)", Path("/proc/self/status").read_text())
    return int(found.group(1)) / 1024 if found else float("nan")


def loghub2_one(root: Path, system: str, parser: str, max_lines: int) -> dict[str, object]:
    """One parser on one system, in this (fresh) process: scores, parse time and peak memory."""
    contents, truth, cut = load_loghub2(loghub2_path(root, system), max_lines)
    if parser != "vigil":
        importlib.import_module("drain3.template_miner")  # imported before the base, as the miner is
    base = _rss_mb("VmRSS")
    start = time.perf_counter()
    if parser == "vigil":
        miner = TemplateMiner()
        found = [t for i in range(0, len(contents), 4096) for t in miner.add_templates(contents[i:i + 4096])]
        took = time.perf_counter() - start
        peak = _rss_mb("VmHWM")
        predicted, templates = grouping(miner, found)
        printed: dict[str, float] = {"ga_as_printed": grouping_accuracy([t.id for t in found], truth)}
    else:
        drain = Drain3Parser(masked=parser == "drain3_masked")
        ids = drain.parse(contents)
        took = time.perf_counter() - start
        peak = _rss_mb("VmHWM")
        predicted, templates = [str(i) for i in ids], drain.templates(ids)
        printed = {}
    return {**scores(predicted, templates, truth), **printed, "lines": len(contents), "cut": cut,
            "templates_found": len(set(predicted)), "templates_truth": len(set(truth)), "seconds": took,
            "lines_per_s": len(contents) / took, "rss_base_mb": base, "peak_rss_mb": peak}


_LOGHUB2_CHILD = """
import json, sys
from pathlib import Path
sys.path.insert(0, {bench!r})
import logs
print(json.dumps(logs.loghub2_one(Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]))))
"""


def loghub2(root: Path, max_lines: int) -> dict[str, object]:
    """Part 6: every Loghub-2.0 system under ``root``, each parser in its own child process, once."""
    present = [s for s in LOGHUB2_LINES if loghub2_path(root, s).is_file()]
    rows: dict[str, dict[str, object]] = {}
    for system in present:
        row: dict[str, object] = {"lines_published": LOGHUB2_LINES[system]}
        for parser in LOGHUB2_PARSERS:
            with console.status(f"Loghub-2.0 {system}: {parser}"):
                done = subprocess.run([sys.executable, "-c", _LOGHUB2_CHILD.format(bench=str(REPO / "bench")),
                                       str(root), system, parser, str(max_lines)],
                                      capture_output=True, text=True, check=True)
            row[parser] = json.loads(done.stdout.splitlines()[-1])
        first: dict[str, object] = row["vigil"]  # type: ignore[assignment]
        row.update({"lines_scored": first["lines"], "cut_to_prefix": first["cut"],
                    "templates_truth": first["templates_truth"]})
        rows[system] = row
    metrics = ("ga", "pa", "fga", "fta")
    means = {parser: {m: statistics.fmean(float(r[parser][m]) for r in rows.values())  # type: ignore[index]
                      for m in metrics} for parser in LOGHUB2_PARSERS} if rows else {}
    table = Table("system", "lines", "GA vigil", "GA drain3+mask", "GA drain3", "PA vigil", "PA drain3+mask",
                  "FGA vigil", "FGA drain3+mask", "FTA vigil", "FTA drain3+mask",
                  title="Loghub-2.0: shipped miner settings, drain3 in the same run")
    cells = (("vigil", "ga"), ("drain3_masked", "ga"), ("drain3", "ga"), ("vigil", "pa"), ("drain3_masked", "pa"),
             ("vigil", "fga"), ("drain3_masked", "fga"), ("vigil", "fta"), ("drain3_masked", "fta"))
    speed = Table("system", "lines", *(f"{what} {p.replace('_masked', '+mask')}" for what in ("lines/s", "peak MB")
                                       for p in LOGHUB2_PARSERS), "base MB vigil (lines loaded)",
                  title="Loghub-2.0: parse alone, each parser in a fresh process (peak = VmHWM)")
    for system, r in rows.items():
        lines = f"{r['lines_scored']:,}" + (" (prefix)" if r["cut_to_prefix"] else "")
        table.add_row(system, lines, *(f"{float(r[p][m]):.3f}" for p, m in cells))  # type: ignore[index]
        speed.add_row(system, lines, *(f"{float(r[p]['lines_per_s']):,.0f}" for p in LOGHUB2_PARSERS),  # type: ignore[index]
                      *(f"{float(r[p]['peak_rss_mb']):.0f}" for p in LOGHUB2_PARSERS),  # type: ignore[index]
                      f"{float(r['vigil']['rss_base_mb']):.0f}")  # type: ignore[index]
    if rows:
        table.add_row(f"mean ({len(rows)})", "", *(f"{means[p][m]:.3f}" for p, m in cells), style="bold")
    console.print(table)
    console.print(speed)
    return {"systems": rows, "means": means, "present": present,
            "absent": [s for s in LOGHUB2_LINES if s not in rows], "max_lines": max_lines}


STABILITY_LINES = 32_768
STABILITY_FORMS = 6  # forms kept per event in the few-values variants: fewer than max_split_values
STABILITY_BURST = 16  # mean run length of a line in the burst variants
STABILITY_VARIANTS = ("2k, blocks of 4,096", "2k, blocks of 1,024", "2k, blocks of 256", "32k shuffled",
                      "32k in bursts", "32k few forms shuffled", "32k few forms in bursts")


def stability_variants(contents: list[str], truth: list[str], seed: str) -> Iterator[tuple[str, list[int], int]]:
    """Seeded variants of one system's lines (indices into them, labels carried along) and the block size to read
    them in: the sample in blocks of 4,096, 1,024 and 256 lines; 32,768 lines drawn with replacement, in a
    shuffled order and in bursts (each drawn line repeated a geometric number of times, mean 16, as events come in
    runs); and the same two from at most 6 forms per event (lines equal once digits are zeroed), so that a
    variable field holds few distinct words over many lines."""
    rng = random.Random(seed)
    every = list(range(len(contents)))
    yield STABILITY_VARIANTS[0], every, 4096
    yield STABILITY_VARIANTS[1], every, 1024
    yield STABILITY_VARIANTS[2], every, 256

    def shuffled(pool: list[int]) -> list[int]:
        return [pool[rng.randrange(len(pool))] for _ in range(STABILITY_LINES)]

    def bursts(pool: list[int]) -> list[int]:
        drawn: list[int] = []
        while len(drawn) < STABILITY_LINES:
            run = 1 + int(rng.expovariate(1 / STABILITY_BURST))
            drawn += [pool[rng.randrange(len(pool))]] * min(run, STABILITY_LINES - len(drawn))
        return drawn

    yield STABILITY_VARIANTS[3], shuffled(every), 4096
    yield STABILITY_VARIANTS[4], bursts(every), 4096
    forms: dict[str, set[str]] = defaultdict(set)
    digitless = [_DIGITS.sub("0", line) for line in contents]
    for form, event in zip(digitless, truth, strict=True):
        forms[event].add(form)
    kept = {event: set(rng.sample(sorted(found), min(STABILITY_FORMS, len(found)))) for event, found in forms.items()}
    few = [i for i in every if digitless[i] in kept[truth[i]]]
    yield STABILITY_VARIANTS[5], shuffled(few), 4096
    yield STABILITY_VARIANTS[6], bursts(few), 4096


def stability(unseen: dict[str, Path]) -> dict[str, object]:
    """Part 7, a development criterion for size and block dependence (Loghub-2k only): GA of the shipped settings on
    each variant of :func:`stability_variants`, by the ids printed as the stream went and by the grouping once the
    stream is read. A grouping that is right does not change with the block size or with more lines of the same
    events."""
    roots = {system: DATA for system in SYSTEMS} | unseen
    ga: dict[str, dict[str, dict[str, float]]] = {}
    for system, root in roots.items():
        contents, truth = load(system, root)
        ga[system] = {}
        for name, drawn, block in stability_variants(contents, truth, f"2026/{system}"):
            lines, labels = [contents[i] for i in drawn], [truth[i] for i in drawn]
            miner = TemplateMiner()
            found = [t for i in range(0, len(lines), block) for t in miner.add_templates(lines[i:i + block])]
            ga[system][name] = {"printed": grouping_accuracy([t.id for t in found], labels),
                                "end": grouping_accuracy(grouping(miner, found)[0], labels)}
    means = {name: {how: statistics.fmean(ga[s][name][how] for s in roots) for how in ("printed", "end")}
             for name in STABILITY_VARIANTS}
    # the largest fall of a system's GA from its sample read in blocks of 4,096
    worst = {how: {s: max(ga[s][STABILITY_VARIANTS[0]]["end"] - ga[s][name][how] for name in STABILITY_VARIANTS)
                   for s in roots} for how in ("printed", "end")}
    table = Table("system", *(f"{name} {how}" for name in STABILITY_VARIANTS for how in ("printed", "end")),
                  title="Size and block dependence on Loghub-2k (GA; printed: ids as the stream went, end: the "
                        "grouping once read)")
    for system in roots:
        table.add_row(system, *(f"{ga[system][n][h]:.3f}" for n in STABILITY_VARIANTS for h in ("printed", "end")))
    table.add_row(f"mean ({len(roots)})", *(f"{means[n][h]:.3f}" for n in STABILITY_VARIANTS
                                             for h in ("printed", "end")), style="bold")
    console.print(table)
    return {"systems": list(roots), "variants": list(STABILITY_VARIANTS), "lines": STABILITY_LINES,
            "forms_per_event": STABILITY_FORMS, "mean_burst": STABILITY_BURST, "ga": ga, "ga_mean": means,
            "largest_fall_by_system": worst,
            "largest_fall_mean": {how: statistics.fmean(w.values()) for how, w in worst.items()}}


def git_commit() -> str:
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False)
    return done.stdout.strip() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=1.0, help="size of the generated log for memory")
    parser.add_argument("--stream-lines", type=int, default=150_000)
    parser.add_argument("--per-kind", type=int, default=20, help="simulated failed jobs per failure kind")
    parser.add_argument("--real-jobs", type=int, default=8, help="real crashed gloo jobs")
    parser.add_argument("--unseen", type=Path, default=None,
                        help="directory of more Loghub-2k systems (<System>/<System>_2k.log_structured_corrected.csv)"
                             " scored beside the ten as held-out (default: $VIGIL_LOGHUB_UNSEEN)")
    parser.add_argument("--only-real-logs", action="store_true",
                        help="run only part 4 (real failure logs) and update its entry in the results file")
    parser.add_argument("--only-mining", action="store_true",
                        help="run only parts 1-3 (template mining accuracy, throughput, memory) and update their "
                             "entries in the results file")
    parser.add_argument("--only-loghub2", action="store_true",
                        help="run only part 6 (Loghub-2.0 at full size, first touch) and write "
                             "bench/results/logs_loghub2.json")
    parser.add_argument("--loghub2", type=Path, default=None,
                        help="directory of Loghub-2.0 systems (<System>/<System>_full.log_structured.csv; default "
                             "$VIGIL_LOGHUB2, else ../cache/loghub2)")
    parser.add_argument("--loghub2-max-lines", type=int, default=LOGHUB2_MAX_LINES,
                        help="score at most the first N lines of each Loghub-2.0 system")
    parser.add_argument("--only-stability", action="store_true",
                        help="run only part 7 (size and block dependence on Loghub-2k) and record it under "
                             "--stability-label in bench/results/logs_stability.json")
    parser.add_argument("--stability-label", default="current",
                        help="name of the miner version measured by --only-stability")
    args = parser.parse_args()
    if args.only_loghub2:
        root = args.loghub2 or (Path(os.environ["VIGIL_LOGHUB2"]) if os.environ.get("VIGIL_LOGHUB2")
                                else LOGHUB2_DEFAULT)
        if not any(loghub2_path(root, s).is_file() for s in LOGHUB2_LINES):
            print(f"bench/logs.py: no Loghub-2.0 data at {root} (expected <System>/<System>_full.log_structured.csv "
                  "for some of " + ", ".join(LOGHUB2_LINES) + "; it is kept outside the repository, see "
                  "docs/logs.md): part 6 not run", file=sys.stderr)
            sys.exit(2)
        result = loghub2(root, args.loghub2_max_lines)
        console.print(f"absent: {', '.join(result['absent']) or 'none'}")  # type: ignore[arg-type]
        LOGHUB2_RESULTS.parent.mkdir(parents=True, exist_ok=True)
        LOGHUB2_RESULTS.write_text(json.dumps({
            "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "vigil_commit": git_commit(),
            "data": str(root), "drain3_version": "0.9.11: with its example masking, and default (no masking)",
            "miner_settings": {"max_split_values": TemplateMiner.max_split_values,
                               "max_unit_letters": TemplateMiner.max_unit_letters,
                               "field_values": TemplateMiner.field_values,
                               "max_slot_values": TemplateMiner.max_slot_values},
            **result}, indent=2))
        console.print(f"wrote {LOGHUB2_RESULTS.relative_to(REPO)}")
        return
    unseen_dir = args.unseen or (Path(os.environ["VIGIL_LOGHUB_UNSEEN"]) if os.environ.get("VIGIL_LOGHUB_UNSEEN")
                                 else None)
    try:
        unseen = unseen_systems(unseen_dir)
        for system, root in unseen.items():
            load(system, root)
    except (ValueError, OSError, KeyError, csv.Error) as err:
        print(f"bench/logs.py: {err}", file=sys.stderr)
        sys.exit(2)

    if args.only_stability:
        previous = json.loads(STABILITY_RESULTS.read_text()) if STABILITY_RESULTS.exists() else {"runs": {}}
        previous["runs"][args.stability_label] = {
            "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "vigil_commit": git_commit(),
            **stability(unseen)}
        STABILITY_RESULTS.parent.mkdir(parents=True, exist_ok=True)
        STABILITY_RESULTS.write_text(json.dumps(previous, indent=2))
        console.print(f"recorded {args.stability_label!r} in {STABILITY_RESULTS.relative_to(REPO)}")
        return

    if args.only_mining:
        acc, means, fold_means, speed, mem = mining(args, unseen)
        previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
        previous.update({"mining_generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                         "accuracy": acc, "means": means, "fold_ga_min": min(fold_means),
                         "fold_ga_max": max(fold_means), "throughput": speed, "memory": mem})
        previous.setdefault("targets", {}).update(mining_targets(acc["rows"], means))  # type: ignore[arg-type]
        previous["targets"].update({
            "throughput_ge_3x_long_stream": speed["ratio"] >= 3.0,  # type: ignore[operator]
            "throughput_ge_3x_cold_2k_samples": speed["cold_2k_ratio"] >= 3.0})  # type: ignore[operator]
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(previous, indent=2))
        console.print(f"updated the template-mining entries of {RESULTS.relative_to(REPO)}")
        return

    real = score_corpus()
    table = Table(*TABLE_COLUMNS, title="Root line named on real failure logs from public issue threads")
    for row in table_rows(real):
        table.add_row(*row)
    console.print(table)
    if args.only_real_logs:
        previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
        previous["real_logs"] = real
        previous["real_logs_generated_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        previous.setdefault("targets", {})["real_logs_held_out_ge_0_95"] = (
            real["accuracy"]["held_out"]["vigil"] >= 0.95)  # type: ignore[index]
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(previous, indent=2))
        console.print(f"updated real_logs in {RESULTS.relative_to(REPO)}")
        return

    acc, means, fold_means, speed, mem = mining(args, unseen)

    roots = root_accuracy(args.per_kind, args.real_jobs)
    table = Table("corpus", "jobs", "root-error accuracy", title="Root error across ranks")
    table.add_row("simulated (14 kinds)", str(roots["simulated_jobs"]), f"{roots['simulated_accuracy']:.3f}")
    if roots["real_jobs"]:
        table.add_row("real gloo jobs (torchrun)", str(roots["real_jobs"]), f"{roots['real_accuracy']:.3f}")
    table.add_row("all", str(roots["simulated_jobs"] + roots["real_jobs"]),  # type: ignore[operator]
                  f"{roots['overall_accuracy']:.3f}", style="bold")
    console.print(table)

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "drain3_version": "0.9.11: default config (no masking) and with its example masking",
        "ground_truth": "loghub2k_corrected (Khan et al. ICSE'22), GA grouped by template text",
        "accuracy": acc, "means": means, "fold_ga_min": min(fold_means), "fold_ga_max": max(fold_means),
        "throughput": speed, "memory": mem, "root_error": roots,
        "real_logs": real,
        "targets": {
            **mining_targets(acc["rows"], means),  # type: ignore[arg-type]
            "throughput_ge_3x_long_stream": speed["ratio"] >= 3.0,  # type: ignore[operator]
            "throughput_ge_3x_cold_2k_samples": speed["cold_2k_ratio"] >= 3.0,  # type: ignore[operator]
            "root_accuracy_ge_0_95": roots["overall_accuracy"] >= 0.95,  # type: ignore[operator]
            "real_logs_held_out_ge_0_95": real["accuracy"]["held_out"]["vigil"] >= 0.95,  # type: ignore[index]
        },
    }, indent=2))
    console.print(f"wrote {RESULTS.relative_to(REPO)}")


if __name__ == "__main__":
    main()
