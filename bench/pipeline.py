"""Ingest + rule evaluation throughput on a 10,000-GPU simulation, peak memory, detection by fault type.

Run: .venv/bin/python bench/pipeline.py   (or `make bench BENCH=pipeline`) -> bench/results/pipeline.json

Throughput is measured on one core over pre-generated scrapes (generation is not counted), side by side
with a per-sample Python rule loop over the same scrapes - the shape of a hand-written alerting script -
so the ratio holds on a noisy shared machine.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import time
import tracemalloc
from collections import defaultdict
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from vigil.detect.incidents import IncidentGrouper
from vigil.detect.rules import RuleDetector, Thresholds
from vigil.run.pipeline import run_pipeline
from vigil.sources.replay import KernelLineDecoder, decode_kube_events, decode_rank_lines
from vigil.sources.sim import SimConfig, simulate
from vigil.sources.sim import metrics as M
from vigil.store.metrics import MetricStore
from vigil_eval.scoring import score as score_incidents

RESULTS = Path(__file__).resolve().parent / "results"
console = Console()


def throughput(nodes: int, minutes: float) -> dict[str, float]:
    run = simulate(SimConfig(nodes=nodes, gpus=8, minutes=minutes, seed=7, faults_per_node_hour=0.05))
    ticks = list(run.ticks())
    samples = sum(t.sample_count for t in ticks)
    tracemalloc.start()
    store, rules, grouper = MetricStore(), RuleDetector(run.topology), IncidentGrouper(run.topology)
    kernel = KernelLineDecoder(run.topology)
    started = time.process_time()
    for tick in ticks:
        for frame in tick.frames:
            store.append(frame)
        grouper.add(rules.update(tick.frames, [*tick.events, *kernel.decode(tick.kernel_lines),
                                               *decode_kube_events(tick.kube_events),
                                               *decode_rank_lines(tick.rank_lines)]))
    cpu_s = time.process_time() - started
    _, peak_traced = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"gpus": nodes * 8, "ticks": len(ticks), "samples": samples, "cpu_s": cpu_s,
            "samples_per_s": samples / cpu_s, "real_time_factor": samples / cpu_s / (samples / (minutes * 60)),
            "peak_traced_mb": peak_traced / 2**20}


def naive_baseline(nodes: int, ticks_n: int) -> dict[str, float]:
    """Per-sample thresholds in plain Python (dicts of previous values for counters), same scrapes."""
    run = simulate(SimConfig(nodes=nodes, gpus=8, minutes=ticks_n * 10 / 60, seed=7, faults_per_node_hour=0.05))
    ticks = list(run.ticks())
    t = Thresholds()
    gi = M.index("gpu")
    temp, dbe = gi["DCGM_FI_DEV_GPU_TEMP"], gi["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"]
    width = gi["DCGM_FI_DEV_PCIE_LINK_WIDTH"]
    prev: dict[str, float] = {}
    fired = 0
    samples = 0
    started = time.process_time()
    for tick in ticks:
        gpu = tick.frames[0]
        rows = gpu.values.tolist()
        for entity, row in zip(gpu.entities, rows, strict=True):
            samples += len(row)
            if row[temp] > t.gpu_temp_c:
                fired += 1
            if row[width] < M.PCIE_WIDTH:
                fired += 1
            last = prev.get(entity)
            if last is not None and row[dbe] > last:
                fired += 1
            prev[entity] = row[dbe]
    cpu_s = time.process_time() - started
    return {"samples": samples, "cpu_s": cpu_s, "samples_per_s": samples / cpu_s, "rules_evaluated": 3}


def detection(seeds: range, nodes: int, minutes: float) -> dict[str, object]:
    by_type: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    totals = {"incidents": 0, "true_incidents": 0, "visible": 0, "detected": 0, "localized": 0, "exact": 0}
    delays = []
    for seed in seeds:
        run = simulate(SimConfig(nodes=nodes, minutes=minutes, seed=seed))
        result = run_pipeline(run, keep_events=False)  # only the incidents are scored
        score = score_incidents(result.incidents, run.ground_truth, run.topology)
        totals["incidents"] += score.incidents
        totals["true_incidents"] += score.true_incidents
        for m in score.matches:
            row = by_type[m.fault_type]
            row[0] += 1
            row[1] += bool(m.incident_id)
            row[2] += int(m.localized)
            row[3] += int(m.exact)
            if m.visible_to_rules:
                totals["visible"] += 1
                totals["detected"] += bool(m.incident_id)
                totals["localized"] += int(m.localized)
                totals["exact"] += int(m.exact)
                if m.delay_s is not None:
                    delays.append(m.delay_s)
    return {
        "runs": len(seeds), "nodes": nodes, "minutes": minutes,
        "precision": totals["true_incidents"] / max(1, totals["incidents"]),
        "recall": totals["detected"] / max(1, totals["visible"]),
        "localization": totals["localized"] / max(1, totals["detected"]),
        "exact_localization": totals["exact"] / max(1, totals["detected"]),
        "median_delay_s": float(np.median(delays)) if delays else None,
        "by_fault": {k: {"injected": v[0], "detected": v[1], "localized": v[2], "exact": v[3], "recall": v[1] / v[0]}
                     for k, v in sorted(by_type.items())},
    }


def main() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    console.print("[bold]pipeline[/]: 10,000-GPU ingest + rules throughput, detection quality")
    big = throughput(nodes=1250, minutes=10)
    naive = naive_baseline(nodes=1250, ticks_n=6)
    demo = detection(range(100, 120), nodes=16, minutes=60)
    large = detection(range(200, 202), nodes=1250, minutes=30)
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    table = Table(title="Throughput on one core (10,000 GPUs, 37 samples per GPU per 10 s scrape)")
    for col in ("engine", "samples/s", "x real time", "ratio vs naive"):
        table.add_column(col, justify="right")
    table.add_row("vigil (store + rules + incidents)", f"{big['samples_per_s']:,.0f}",
                  f"{big['real_time_factor']:,.0f}", f"{big['samples_per_s'] / naive['samples_per_s']:.1f}x")
    table.add_row("naive per-sample Python (3 rules only)", f"{naive['samples_per_s']:,.0f}", "-", "1.0x")
    console.print(table)
    console.print(f"peak traced memory during ingest {big['peak_traced_mb']:.0f} MB; "
                  f"process peak RSS {peak_rss_mb:.0f} MB")
    det = Table(title="Detection on the simulator (ground truth)")
    for col in ("fault type", "injected", "detected", "localized", "on its entity", "recall"):
        det.add_column(col, justify="right")
    merged: dict[str, dict[str, float]] = {}
    for block in (demo, large):
        for name, row in block["by_fault"].items():  # type: ignore[attr-defined]
            acc = merged.setdefault(name, {"injected": 0, "detected": 0, "localized": 0, "exact": 0})
            for key in acc:
                acc[key] += row[key]
    for name, row in merged.items():
        det.add_row(name, str(row["injected"]), str(row["detected"]), str(row["localized"]), str(row["exact"]),
                    f"{row['detected'] / row['injected']:.2f}")
    console.print(det)
    for label, block in (("16 x 8 GPUs, 60 min, 20 seeds", demo), ("1,250 x 8 GPUs, 30 min, 2 seeds", large)):
        console.print(f"{label}: precision {block['precision']:.3f} recall {block['recall']:.3f} "
                      f"localization {block['localization']:.3f} (on the fault's own entity "
                      f"{block['exact_localization']:.3f}) median delay {block['median_delay_s']} s")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "pipeline.json").write_text(json.dumps({
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "throughput_10k_gpus": big, "naive_per_sample_baseline": naive,
        "speedup_vs_naive": big["samples_per_s"] / naive["samples_per_s"],
        "peak_rss_mb": peak_rss_mb, "detection_demo_config": demo, "detection_10k_gpus": large,
        "detection_by_fault": merged,
    }, indent=1))
    console.print(f"wrote {RESULTS / 'pipeline.json'}")


if __name__ == "__main__":
    main()
