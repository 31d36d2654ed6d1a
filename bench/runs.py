"""Experiment board: scalars of 100 runs x 100,000 steps served over HTTP, against re-reading event files.

Run: .venv/bin/python bench/runs.py [--runs 100 --steps 100000 --requests 400 --clients 8]
     -> bench/results/runs.json

1. Writes one TensorBoard event file per run (tag `loss`), records framed as TensorBoard frames them (checked
   against TensorBoard's own EventFileLoader on the first run), kept under --dir for reruns.
2. Indexes them (`RunIndex.update`), timed.
3. Serves the index with `vigil serve`'s app on loopback and sends --requests comparisons of 2-5 random runs
   (1,000 points per run) from --clients concurrent clients: p50 / p99 latency (goal: p99 < 200 ms).
4. Baseline in the same run: the same kind of request answered by reading the runs' event files with
   TensorBoard's EventAccumulator (what a board without an index does on a cold cache), a few requests.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import struct
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from vigil.config import Settings
from vigil.faces.api.app import create_app
from vigil.sources.tensorboard import RunIndex, masked_crc32c
from vigil.store.sql import Store

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "runs.json"
console = Console()


def frame(data: bytes) -> bytes:
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", masked_crc32c(header)) + data + struct.pack("<I", masked_crc32c(data))


def write_runs(logdir: Path, runs: int, steps: int) -> None:
    from tensorboard.compat.proto import event_pb2, summary_pb2

    marker = logdir / ".complete"
    if marker.is_file() and marker.read_text() == f"{runs} {steps}":
        return
    rng = random.Random(0)
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("writing event files", total=runs)
        for r in range(runs):
            run_dir = logdir / f"run{r:03d}"
            run_dir.mkdir(parents=True, exist_ok=True)
            start = 1_700_000_000.0 + r * 1000
            chunks = [frame(event_pb2.Event(wall_time=start, file_version="brain.Event:2").SerializeToString())]
            scale = rng.uniform(0.5, 2.0)
            for step in range(steps):
                value = scale * 5.0 / (1 + step / 1000) + rng.gauss(0, 0.01)
                event = event_pb2.Event(
                    wall_time=start + step * 0.5,
                    step=step,
                    summary=summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag="loss", simple_value=value)]),
                )
                chunks.append(frame(event.SerializeToString()))
            (run_dir / f"events.out.tfevents.{int(start)}.bench.{r}").write_bytes(b"".join(chunks))
            bar.advance(task)
    marker.write_text(f"{runs} {steps}")


def check_format(logdir: Path) -> int:
    """TensorBoard's own loader reads the generated files: the same framing as its writer's."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    path = next((logdir / "run000").glob("events.out.tfevents.*"))
    return sum(1 for _ in EventFileLoader(str(path)).Load())


def serve(app: object) -> tuple[str, object]:
    import socket

    import uvicorn

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))  # type: ignore[arg-type]
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline:
            raise SystemExit("the server did not start")
        time.sleep(0.02)
    return f"http://127.0.0.1:{port}", server


def tensorboard_baseline(logdir: Path, runs: list[str]) -> float:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    start = time.perf_counter()
    for run in runs:
        acc = EventAccumulator(str(logdir / run), size_guidance={"scalars": 1000})
        acc.Reload()
        acc.Scalars("loss")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--baseline-requests", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "vigil-runs-bench")
    args = parser.parse_args()

    logdir = args.dir / "logs"
    write_runs(logdir, args.runs, args.steps)
    records = check_format(logdir)
    assert records == args.steps + 1, records

    home = Path(tempfile.mkdtemp(prefix="vigil-runs-home-"))
    index = RunIndex(home / "runs.sqlite")
    started = time.perf_counter()
    added = index.update(logdir)
    index_s = time.perf_counter() - started
    index.close()
    assert sum(added.values()) == args.runs * args.steps
    size_mb = (home / "runs.sqlite").stat().st_size / 1e6

    settings = Settings(home=home, db_url=f"sqlite:///{home / 'vigil.db'}")
    base, server = serve(create_app(Store(settings.database_url()), settings=settings))
    names = [f"run{r:03d}" for r in range(args.runs)]
    rng = random.Random(1)
    queries = [rng.sample(names, rng.randint(2, 5)) for _ in range(args.requests)]

    def one(runs: list[str]) -> float:
        params = [("run", r) for r in runs] + [("tag", "loss"), ("points", "1000")]
        t0 = time.perf_counter()
        response = client.get(base + "/api/v1/runs/scalars", params=params)
        elapsed = time.perf_counter() - t0
        response.raise_for_status()
        assert len(response.json()["series"]) == len(runs)
        return elapsed

    with httpx.Client(timeout=60, limits=httpx.Limits(max_connections=args.clients)) as client:
        one(queries[0])  # the first request opens the index
        with ThreadPoolExecutor(args.clients) as pool:
            latencies = sorted(pool.map(one, queries))
    server.should_exit = True  # type: ignore[attr-defined]
    p50 = statistics.median(latencies)
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
    baseline = [tensorboard_baseline(logdir, queries[i]) for i in range(args.baseline_requests)]
    baseline_med = statistics.median(baseline)

    table = Table(title=f"Runs board: {args.runs} runs x {args.steps:,} steps, {args.clients} concurrent clients")
    for column in ("what", "value"):
        table.add_column(column)
    rate = args.runs * args.steps / index_s
    table.add_row("index build (all event files)", f"{index_s:.1f} s ({rate:,.0f} points/s)")
    table.add_row("index size", f"{size_mb:.0f} MB")
    table.add_row("compare 2-5 runs, p50", f"{p50 * 1000:.1f} ms")
    table.add_row("compare 2-5 runs, p99", f"{p99 * 1000:.1f} ms")
    table.add_row("baseline: TensorBoard EventAccumulator per request, median", f"{baseline_med * 1000:.0f} ms")
    table.add_row("baseline / indexed (p50)", f"{baseline_med / p50:.0f}x")
    console.print(table)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "machine": platform.processor() or platform.machine(), "cores": os.cpu_count(), "runs": args.runs,
        "steps": args.steps, "requests": args.requests, "clients": args.clients, "index_seconds": index_s,
        "index_mb": size_mb, "p50_ms": p50 * 1000, "p99_ms": p99 * 1000,
        "baseline_eventaccumulator_ms": [b * 1000 for b in baseline], "baseline_over_p50": baseline_med / p50,
    }, indent=2) + "\n")


if __name__ == "__main__":
    main()
