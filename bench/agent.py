"""Node agent overhead (CPU, memory) at full rate, and compression ratios per codec on realistic series.

Run: .venv/bin/python bench/agent.py [--seconds 60]   -> bench/results/agent.json

Overhead: the agent runs in a child process with every source this machine can give it - psutil host
metrics, /dev/kmsg, a dcgm-exporter page of 8 simulated H100s served over HTTP by this (parent) process,
an 8-port InfiniBand sysfs tree, NVML (no GPU here: it reports so), Prometheus exposition scraped every
15 s by the parent as Prometheus would, and the local history with tiered retention. Its CPU time and
memory are read from /proc with psutil after imports; the same child idling with the same imports is the
baseline measured in the same run. "Full rate" is the default intervals (gpu 10 s, network 30 s, host
15 s, kernel 5 s); a 10x rate run gives a steadier per-cycle cost.

Compression: every codec on every series of a 4-node simulation (gpu / node / nic / job families), the
Server Machine Dataset (smd, machine-1-2) and NAB realKnownCause, side by side with zlib (level 6) on the
same bytes.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import numpy as np
import psutil
from rich.console import Console
from rich.table import Table

from vigil.store.safe_pickle import load_array

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
SHARED = REPO.parent / "shared" / "data"
console = Console()

IB_COUNTERS = (
    "port_rcv_data",
    "port_xmit_data",
    "symbol_error",
    "link_downed",
    "link_error_recovery",
    "port_rcv_errors",
    "port_xmit_discards",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "port_xmit_wait",
)


# --------------------------------------------------------------------------- child: the agent under test


def child(mode: str, dcgm_url: str, sysfs: str, store: str, rate: float, port_file: str) -> None:
    """Runs in the child process: import, say ready, run until stdin closes."""
    from vigil.sources.collect.agent import DEFAULT_INTERVALS, Agent, AgentSettings
    from vigil.sources.collect.dcgm import DcgmExporterScraper
    from vigil.sources.collect.host import HostCollector
    from vigil.sources.collect.infiniband import InfinibandCollector
    from vigil.sources.collect.kmsg import KernelLogSource
    from vigil.sources.collect.nvml import NvmlCollector

    if mode == "idle":
        print("ready", flush=True)
        sys.stdin.read()
        return
    intervals = {k: v / rate for k, v in DEFAULT_INTERVALS.items()}
    # cpu_high=1.0: never degrade, so "full rate" stays full rate on this shared, often saturated machine.
    settings = AgentSettings(
        node="bench01",
        intervals=intervals,
        store=store,
        record_interval_s=10.0 / rate,
        retention_every_s=600.0 / rate,
        dcgm_url=dcgm_url,
        port=0,
        cpu_high=1.0,
        cpu_low=0.99,
    )
    nvml = NvmlCollector(node="bench01")
    sources = [
        HostCollector(node="bench01"),
        nvml,
        InfinibandCollector(node="bench01", root=Path(sysfs)),
        DcgmExporterScraper(dcgm_url, node="bench01"),
    ]
    kernel = KernelLogSource.auto(node="bench01", gpu_index=nvml.pci_to_index.get)
    if kernel is not None:
        sources.append(kernel)
    agent = Agent(sources, settings)
    _server, port = agent.serve(port=0)
    Path(port_file).write_text(str(port))
    loop = threading.Thread(target=agent.run, daemon=True)
    loop.start()
    print("ready", flush=True)
    sys.stdin.read()
    agent.stop_event.set()
    loop.join(10)
    agent.close()


# --------------------------------------------------------------------------- parent: fixtures and measurement


def dcgm_page() -> str:
    from vigil.faces.api.dcgm import render_dcgm
    from vigil.sources.sim import SimConfig, simulate

    run = simulate(SimConfig(nodes=1, gpus=8, minutes=1, seed=3))
    tick = next(iter(run.ticks()))
    frame = next(f for f in tick.frames if f.family == "gpu")
    return render_dcgm(frame, run.topology)


def fake_sysfs(root: Path) -> None:
    for i in range(8):
        port = root / f"mlx5_{i}" / "ports" / "1"
        (port / "counters").mkdir(parents=True)
        (port / "hw_counters").mkdir()
        (port / "state").write_text("4: ACTIVE\n")
        (port / "phys_state").write_text("5: LinkUp\n")
        (port / "rate").write_text("400 Gb/sec (4X NDR)\n")
        (port / "link_layer").write_text("InfiniBand\n")
        for name in IB_COUNTERS:
            (port / "counters" / name).write_text(f"{i * 1000}\n")
        (port / "hw_counters" / "local_ack_timeout_err").write_text("0\n")


def serve_page(page: bytes) -> ThreadingHTTPServer:
    """``page`` over HTTP on a free loopback port, as dcgm-exporter serves its metrics."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def measure(mode: str, seconds: float, rate: float, dcgm_url: str, sysfs: Path, work: Path) -> dict[str, float]:
    store = work / f"store-{mode}-{rate:g}"
    port_file = work / f"port-{mode}-{rate:g}"
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", mode, dcgm_url, str(sysfs), str(store), str(rate), str(port_file)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.stdout is not None and proc.stdin is not None
    if proc.stdout.readline().strip() != "ready":
        raise RuntimeError(f"agent child ({mode}) did not start")
    ps = psutil.Process(proc.pid)
    cpu_start = sum(ps.cpu_times()[:2])
    machine_cpu = psutil.cpu_percent(interval=None)
    started = time.monotonic()
    scrapes = 0
    while time.monotonic() - started < seconds:
        time.sleep(min(15.0, max(0.0, seconds - (time.monotonic() - started))))
        if mode == "agent" and time.monotonic() - started < seconds + 1:
            httpx.get(f"http://127.0.0.1:{port_file.read_text()}/metrics", timeout=10)
            scrapes += 1
    elapsed = time.monotonic() - started
    cpu = sum(ps.cpu_times()[:2]) - cpu_start
    machine_cpu = psutil.cpu_percent(interval=None)
    memory = ps.memory_full_info()
    proc.stdin.close()
    proc.wait(30)
    return {
        "seconds": elapsed,
        "cpu_s": cpu,
        "core_percent": 100.0 * cpu / elapsed,
        "rss_mb": memory.rss / 2**20,
        "uss_mb": memory.uss / 2**20,
        "prometheus_scrapes": scrapes,
        "machine_cpu_percent": machine_cpu,
    }


# --------------------------------------------------------------------------- compression


def sim_series() -> tuple[list[np.ndarray], list[np.ndarray]]:
    from vigil.sources.sim import SimConfig, simulate

    run = simulate(SimConfig(nodes=4, gpus=8, minutes=60, seed=11))
    frames: dict[str, list[np.ndarray]] = {}
    stamps: list[float] = []
    for tick in run.ticks():
        stamps.append(tick.ts)
        for frame in tick.frames:
            frames.setdefault(frame.family, []).append(np.asarray(frame.values, dtype=np.float32))
    series = []
    for cube in frames.values():
        stacked = np.stack(cube)
        for i in range(stacked.shape[1]):
            for j in range(stacked.shape[2]):
                series.append(np.ascontiguousarray(stacked[:, i, j]))
    return series, [np.array(stamps, dtype=np.float64)]


def smd_series() -> tuple[list[np.ndarray], list[np.ndarray]]:
    with gzip.open(SHARED / "smd" / "processed" / "machine-1-2_test.pkl.gz") as fh:
        matrix = np.asarray(load_array(fh.read(), "SMD machine-1-2"), dtype=np.float32)[:8000]
    return [np.ascontiguousarray(matrix[:, j]) for j in range(matrix.shape[1])], []


def nab_series() -> tuple[list[np.ndarray], list[np.ndarray]]:
    values, stamps = [], []
    for path in sorted((SHARED / "nab" / "data" / "realKnownCause").glob("*.csv")):
        with path.open() as fh:
            rows = list(csv.DictReader(fh))
        values.append(np.array([float(r["value"]) for r in rows], dtype=np.float64))
        stamps.append(np.array([datetime.fromisoformat(r["timestamp"]).timestamp() for r in rows]))
    return values, stamps


def ratios(series: list[np.ndarray]) -> dict[str, dict[str, float]]:
    from vigil.store.compress import applicable_codecs, encode

    raw = sum(s.nbytes for s in series)
    out: dict[str, dict[str, float]] = {}
    for codec in ("raw", "delta", "dod", "xor", "auto"):
        size, used, started = 0, 0, time.process_time()
        chosen: dict[str, int] = {}
        for s in series:
            if codec == "auto" or codec in applicable_codecs(s):
                encoded = encode(s, codec)
                size += len(encoded.data)
                used += 1
                chosen[encoded.codec] = chosen.get(encoded.codec, 0) + 1
            else:
                size += s.nbytes  # not applicable: stored raw
        cpu = time.process_time() - started
        out[codec] = {
            "ratio": raw / max(1, size),
            "applicable_share": used / max(1, len(series)),
            "mb_per_s": raw / 2**20 / max(cpu, 1e-9),
        }
        if codec == "auto":
            out[codec]["chosen"] = chosen  # type: ignore[assignment]
    started = time.process_time()
    size = sum(len(zlib.compress(s.tobytes(), 6)) for s in series)
    out["zlib-6"] = {
        "ratio": raw / size,
        "applicable_share": 1.0,
        "mb_per_s": raw / 2**20 / max(time.process_time() - started, 1e-9),
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="length of the full-rate overhead run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        sysfs = work / "infiniband"
        fake_sysfs(sysfs)
        page = dcgm_page()
        httpd = serve_page(page.encode())
        url = f"http://127.0.0.1:{httpd.server_port}/metrics"
        with console.status("agent overhead: idle baseline, full rate, 10x rate"):
            overhead = {
                "idle baseline (same imports)": measure("idle", args.seconds / 2, 1.0, url, sysfs, work),
                "agent, full rate": measure("agent", args.seconds, 1.0, url, sysfs, work),
                "agent, 10x rate": measure("agent", args.seconds / 2, 10.0, url, sysfs, work),
            }
        httpd.shutdown()
    with console.status("compression ratios"):
        datasets = {
            "simulator (4 nodes x 8 GPUs, 1 h)": sim_series(),
            "smd machine-1-2": smd_series(),
            "NAB realKnownCause": nab_series(),
        }
        compression = {}
        for name, (values, stamps) in datasets.items():
            compression[name] = ratios(values)
            if stamps:
                compression[f"{name}: timestamps"] = ratios(stamps)

    table = Table(title="vigil agent overhead (this machine; child process, after imports)")
    for column in ("run", "seconds", "CPU % of one core", "RSS MB", "USS MB", "machine CPU %"):
        table.add_column(column, justify="right" if column != "run" else "left")
    for name, row in overhead.items():
        table.add_row(
            name,
            f"{row['seconds']:.0f}",
            f"{row['core_percent']:.3f}",
            f"{row['rss_mb']:.1f}",
            f"{row['uss_mb']:.1f}",
            f"{row['machine_cpu_percent']:.0f}",
        )
    console.print(table)
    full = overhead["agent, full rate"]
    console.print(
        f"goal < 1% of one core and < 100 MB: CPU {full['core_percent']:.3f}% "
        f"({'met' if full['core_percent'] < 1 else 'NOT met'}), RSS {full['rss_mb']:.0f} MB "
        f"({'met' if full['rss_mb'] < 100 else 'NOT met'})"
    )
    table = Table(title="compression ratio (raw bytes / encoded bytes; not-applicable series counted raw)")
    codecs = ("raw", "delta", "dod", "xor", "auto", "zlib-6")
    table.add_column("series")
    for codec in codecs:
        table.add_column(codec, justify="right")
    for name, row in compression.items():
        table.add_row(name, *[f"{row[c]['ratio']:.2f}" for c in codecs])
    console.print(table)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "agent.json").write_text(
        json.dumps(
            {
                "machine": {"cpus": psutil.cpu_count(), "python": sys.version.split()[0]},
                "overhead": overhead,
                "compression": compression,
                "goal": {"cpu_percent_of_core": 1.0, "memory_mb": 100.0},
            },
            indent=2,
        )
    )
    console.print(f"wrote {RESULTS / 'agent.json'}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(*sys.argv[2:6], float(sys.argv[6]), sys.argv[7])
    else:
        main()
