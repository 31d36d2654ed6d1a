"""What the probe costs a real DDP training step: same processes, probe on vs off, several runs.

Run: .venv/bin/python bench/probe_overhead.py [--runs 3] [--blocks 8] [--block-steps 6]
     -> bench/results/probe_overhead.json

bench/jobs/train_ddp.py as a 2-rank gloo job under `vigil launch` (probe, watchdog, supervisor and Flight
Recorder as a user gets them): a 4-layer transformer language model under DistributedDataParallel, held
five times in every rank - one stepped with torch alone (built-in C++ all_reduce, no Vigil code), one with
the probe's default (no comm hook: DDP's all_reduces read from torch's FR ring by the watchdog; wrappers and
compute marks in the step), one with the comm-hook path (the probe's Python comm hook, op records, compute
marks, current-op writes), and two with a Python comm hook alone (torch's allreduce_hook; the probe's
allreduce_mean_hook) - in alternating blocks of steps. The watchdog thread (and its ring reads) runs through
every arm, so its share of the process CPU is reported on its own and adds to each probe arm's overhead.
Per run: median step time of each arm, wall clock and process CPU time (all threads, the watchdog's
included), and the ratio of medians of adjacent blocks (paired). Across runs: median,
min and max. Goal: <= 1% of step time.

Also the probe's cost per op in isolation (a one-rank gloo all_reduce of 1,000 floats, sync and
async + wait, hooked vs not) and per module call (a forward of 150 small modules), each in alternating
blocks in one process; and what reading the FR ring costs: the cursor (per-group counters) and a full read
of 2,000 entries.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vigil.run.launcher import launch  # noqa: E402

RESULTS = REPO / "bench" / "results"
JOB = REPO / "bench" / "jobs" / "train_ddp.py"
console = Console()


def pct(on: float, off: float) -> float:
    return round((on / off - 1.0) * 100, 2)


def paired_ratios(on: list[float], off: list[float], block: int) -> list[float]:
    """Block k of one arm against block k of the other (ABBA order: neighbours in time)."""
    pairs = min(len(on), len(off)) // block
    return [statistics.median(on[i * block:(i + 1) * block]) / statistics.median(off[i * block:(i + 1) * block])
            for i in range(pairs)]


def run_job(work: Path, index: int, blocks: int, block_steps: int) -> dict[str, Any]:
    result = work / f"run{index}.json"
    diagnosis = launch(JOB, ["--result", str(result), "--blocks", str(blocks), "--block-steps", str(block_steps)],
                       nproc=2, hang_timeout=60.0, out_dir=work / f"run{index}", flight_recorder=True)
    if diagnosis.verdict not in ("ok", "slow"):  # "slow": this loaded machine makes one rank lag
        raise RuntimeError(f"overhead job ended {diagnosis.verdict}: {diagnosis.summary}")
    data = json.loads(result.read_text())
    row: dict[str, Any] = {"run": index, "steps_per_arm": len(data["wall_s"]["plain"]),
                           "module_calls_per_step": data["module_calls_per_step"]}
    for measure in ("wall", "cpu"):
        times = data[f"{measure}_s"]
        off = times["plain"]
        row[f"{measure}_off_ms"] = round(statistics.median(off) * 1000, 2)
        for arm, name in (("probed", "on"), ("fr", "fr"), ("torch_hook", "torch_hook"), ("mean_hook", "mean_hook")):
            on = times[arm]
            row[f"{measure}_{name}_ms"] = round(statistics.median(on) * 1000, 2)
            row[f"{measure}_{name}_overhead_pct"] = pct(statistics.median(on), statistics.median(off))
            paired = statistics.median(paired_ratios(on, off, data["block_steps"]))
            row[f"{measure}_{name}_paired_pct"] = round((paired - 1) * 100, 2)
    row["watchdog_cpu_pct_of_process"] = round(
        100 * data["watchdog_cpu_s"] / max(1e-9, sum(sum(v) for v in data["cpu_s"].values())), 3)
    row["ops_per_step"] = round(data["ops_recorded"] / max(1, sum(len(v) for v in data["wall_s"].values())), 1)
    if not data.get("reads_ring"):
        raise RuntimeError("the probe did not read the Flight Recorder ring in the overhead job")
    reader = data["ring_reader"]
    row["ring_reads"] = reader["reads"]
    row["ring_read_ms_mean"] = round(1000 * reader["read_s"] / max(1, reader["reads"]), 3)
    row["ring_cursor_us_mean"] = round(1e6 * reader["cursor_s"] / max(1, reader["cursor_reads"]), 2)
    row["ring_reader_cpu_pct_of_process"] = round(
        100 * (reader["read_s"] + reader["cursor_s"]) / max(1e-9, sum(sum(v) for v in data["cpu_s"].values())), 3)
    for measure in ("cpu", "wall"):
        # The default's whole cost: its arm against torch alone, plus the watchdog that runs beside every arm.
        row[f"{measure}_fr_total_paired_pct"] = round(row[f"{measure}_fr_paired_pct"]
                                                       + row["watchdog_cpu_pct_of_process"], 2)
    return row


def measure_unit_costs(calls: int = 3000) -> dict[str, float]:
    """The probe's own cost per op and per module call, hooked vs not, alternating blocks, best block."""
    import torch
    import torch.distributed as dist
    from torch import nn

    from vigil.sources.probe.hooks import install_hooks, uninstall_hooks
    from vigil.sources.probe.probe import Probe

    torch.set_num_threads(1)
    # The ring torch keeps when Vigil launches a job, so the reader's costs below are those of a real one.
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
    with tempfile.TemporaryDirectory(prefix="vigil-bench-op-") as tmp:
        dist.init_process_group("gloo", store=dist.FileStore(f"{tmp}/store", 1), rank=0, world_size=1)
        probe = Probe(rank=0, world_size=1, out_dir=Path(tmp))
        tensor = torch.ones(1000)
        modules = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(50)])
        batch = torch.randn(2, 8)

        def sync() -> None:
            dist.all_reduce(tensor)

        def async_wait() -> None:
            dist.all_reduce(tensor, async_op=True).wait()

        def forward() -> None:
            modules(batch)

        # Steady state: the first optimizer step shows the probe the root module, and only it keeps a hook.
        install_hooks(probe)
        forward()
        torch.optim.SGD(modules.parameters(), lr=0.0).step()

        costs: dict[str, float] = {}
        try:
            for name, call, count, per in (("all_reduce_sync", sync, calls, 1), ("all_reduce_async_wait", async_wait,
                                           calls, 1), ("module_call", forward, calls // 20, 151)):
                times: dict[bool, list[float]] = {True: [], False: []}
                for block in range(10):
                    hooked = block % 2 == 1
                    install_hooks(probe) if hooked else uninstall_hooks()
                    start = time.perf_counter()
                    for _ in range(count):
                        call()
                    times[hooked].append((time.perf_counter() - start) / count / per)
                costs[f"{name}_unhooked_us"] = round(min(times[False]) * 1e6, 2)
                costs[f"{name}_probe_cost_us"] = round((min(times[True]) - min(times[False])) * 1e6, 2)
            costs.update(ring_read_costs(probe, tensor))
        finally:
            uninstall_hooks()
            dist.destroy_process_group()
    return costs


def ring_read_costs(probe: Any, tensor: Any, repeats: int = 20) -> dict[str, float]:
    """The FR ring reader's cursor read and full read once the ring is full (2,000 entries), best of
    ``repeats``; the full read's cost per entry."""
    import torch.distributed as dist

    from vigil.sources.probe.flight import FlightReader, flight_recorder_dump

    dump = flight_recorder_dump()
    if dump is None:
        return {}
    for _ in range(2100):
        dist.all_reduce(tensor)
    entries = len(pickle.loads(dump(True, False, False))["entries"])
    # CPU time of this thread (what the watchdog pays), not wall time, which counts waits on a loaded machine.
    cursor, full, again = [], [], []
    for _ in range(repeats):
        reader = FlightReader(probe, dump)  # a fresh reader: every entry is new to it, the worst case
        start = time.thread_time()
        reader.observe(time.time())
        cursor.append(time.thread_time() - start)
        start = time.thread_time()
        reader.read()
        full.append(time.thread_time() - start)
        # Read again: every entry known already (the steady state, where a read adds a few records).
        start = time.thread_time()
        reader.read()
        again.append(time.thread_time() - start)
    return {"ring_entries": entries, "ring_cursor_read_us": round(min(cursor) * 1e6, 2),
            "ring_full_read_ms": round(min(full) * 1e3, 3),
            "ring_full_read_us_per_entry": round(min(full) * 1e6 / max(1, entries), 2),
            "ring_reread_ms": round(min(again) * 1e3, 3)}


def spread(rows: list[dict[str, Any]], key: str) -> dict[str, float]:
    values = [row[key] for row in rows]
    return {"median": round(statistics.median(values), 2), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--block-steps", type=int, default=6)
    args = parser.parse_args()
    rows = []
    load_at_start = list(os.getloadavg())
    console.log(f"load average at start: {load_at_start}")
    with tempfile.TemporaryDirectory(prefix="vigil-bench-overhead-") as tmp:
        for index in range(args.runs):
            rows.append(run_job(Path(tmp), index, args.blocks, args.block_steps))
            console.log(f"run {index}: {rows[-1]}")
    units = measure_unit_costs()
    summary = {key: spread(rows, key) for key in
               ("cpu_off_ms", "cpu_fr_ms", "cpu_fr_overhead_pct", "cpu_fr_paired_pct", "cpu_fr_total_paired_pct",
                "cpu_on_ms", "cpu_on_overhead_pct", "cpu_on_paired_pct", "cpu_torch_hook_paired_pct",
                "cpu_mean_hook_paired_pct", "wall_off_ms", "wall_fr_ms", "wall_fr_overhead_pct", "wall_fr_paired_pct",
                "wall_fr_total_paired_pct", "wall_on_ms", "wall_on_overhead_pct", "wall_on_paired_pct",
                "wall_torch_hook_paired_pct", "wall_mean_hook_paired_pct", "watchdog_cpu_pct_of_process",
                "ring_reader_cpu_pct_of_process", "ring_reads", "ring_read_ms_mean", "ring_cursor_us_mean")}
    table = Table(title="Probe overhead on a DDP transformer step (2 gloo ranks, same processes)")
    for column in ("measure", "median", "min", "max"):
        table.add_column(column, justify="left" if column == "measure" else "right")
    for key, values in summary.items():
        table.add_row(key, *(f"{values[k]:g}" for k in ("median", "min", "max")))
    console.print(table)
    console.print(units)
    console.log(f"load average at end: {list(os.getloadavg())}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {"job": "bench/jobs/train_ddp.py, 2 ranks, gloo, torch.set_num_threads(1), TORCH_FR_BUFFER_SIZE=2000",
           "load_average_at_start": load_at_start, "load_average_at_end": list(os.getloadavg()), "runs": rows,
           "summary": summary, "unit_costs": units, "block_steps": args.block_steps, "blocks_per_arm": args.blocks}
    (RESULTS / "probe_overhead.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
