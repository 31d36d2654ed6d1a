"""The live engine at 128, 1,000 and 10,000 simulated GPUs, through agent push and through Prometheus + PromQL:
fault -> incident latency, engine CPU and memory, false incidents on a healthy cluster.

Run: .venv/bin/python bench/live.py [--sizes 128,1000,10000] [--paths push,prometheus]   -> bench/results/live.json

Simulated cluster, real costs. Every node has 8 GPUs and a dcgm-exporter page in dcgm-exporter 3.x's format
whose temperatures, power and utilisation vary from scrape to scrape as a healthy GPU's do. Faults are
injected only as machines write them: an Xid 79 kernel line through the production kernel decoder (an agent's
event push) and a double-bit ECC counter step on a dcgm-exporter page. The first minutes of each run are
healthy: every incident opened there is a false incident. Each (path, size) runs in its own process, so peak
RSS is that run's.

- agent push (simulated clock): each node's agent parses its page with the production scraper
  (DcgmExporterScraper.parse_page) and pushes the samples into the store (Store.add_samples, as
  POST /api/v1/samples does) every scrape interval at its own phase. The engine's clock is injected: each
  tick's CPU time advances the simulated clock, so a slow engine shows as latency, and an hour of healthy
  cluster runs faster than real time. Pages are drawn from a pool of healthy variants, each parsed by the
  production scraper; a faulted node's page is rendered and parsed on every push.
- prometheus (real time): one process serves every node's dcgm-exporter page over HTTP (Hostname = the node,
  as dcgm-exporter on the host writes it); Debian's real Prometheus scrapes them every scrape interval; the
  engine (prom=PromQLSource) reads one PromQL instant query per tick. Healthy minutes are real minutes.

Latency = incident stored - fault written, in seconds and in scrape intervals. Engine CPU = CPU seconds of the
engine's ticks per (simulated or wall) second: the fraction of one core; "keeps real time" when it is < 1.
The machine (2 cores) is shared; the load average at start and end of each run is recorded.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.run.pages import dcgm_page, kernel_bus  # noqa: E402
from vigil.config import Settings  # noqa: E402
from vigil.model import Gpu, Node, Topology  # noqa: E402
from vigil.run.engine import Engine  # noqa: E402
from vigil.sources.collect.dcgm import DcgmExporterScraper  # noqa: E402
from vigil.sources.collect.kmsg import KernelLogSource  # noqa: E402
from vigil.sources.promql import PromQLSource  # noqa: E402
from vigil.store.sql import Store  # noqa: E402

GPUS_PER_NODE = 8
SCRAPE_S = 15.0
ENGINE_S = 5.0
VARIANTS = 32
TEMPLATE = "tmpl"


def healthy_readings(rng: random.Random) -> dict[str, list[float]]:
    """One scrape of a healthy, busy node: temperature, power and utilisation move; clocks hold."""
    return {
        "DCGM_FI_DEV_GPU_TEMP": [round(min(80.0, max(45.0, rng.gauss(62, 4))), 0) for _ in range(GPUS_PER_NODE)],
        "DCGM_FI_DEV_POWER_USAGE": [round(rng.gauss(560, 45), 1) for _ in range(GPUS_PER_NODE)],
        "DCGM_FI_DEV_GPU_UTIL": [float(rng.randint(82, 100)) for _ in range(GPUS_PER_NODE)],
    }


def node_page(node: str, rng: random.Random, dbe: dict[int, int] | None = None) -> str:
    return dcgm_page(node, gpus=GPUS_PER_NODE, dbe=dbe, readings=healthy_readings(rng), hostname=node)


def xid_event(node: str, gpu: int, now: float, scraper: DcgmExporterScraper) -> Any:
    """What the node's agent pushes after the driver writes an Xid 79 line (production kernel decoder)."""
    kernel = KernelLogSource(lambda: [], node=node, gpu_index=lambda pci: scraper.pci_to_index.get(pci))
    event = kernel.decode(f"NVRM: Xid (PCI:{kernel_bus(gpu)}): 79, pid=0, name=, GPU has fallen off the bus.", now)
    assert event is not None
    return event


def inventories(nodes: list[str], rng: random.Random) -> tuple[dict[str, DcgmExporterScraper], list[Node]]:
    """Each agent's first page gives it its GPUs' identity (its inventory, NVLink peers as on an HGX board)."""
    scrapers = {}
    inventory = []
    for node in nodes:
        scrapers[node] = DcgmExporterScraper("http://bench", node=node)
        scrapers[node].parse_page(node_page(node, rng), 0.0)
        inventory.append(Node(name=node, gpus=[
            Gpu(node=node, index=i, uuid=g.uuid, pci_bus_id=g.pci_bus_id, model=g.model,
                nvlink_peers=[j for j in range(GPUS_PER_NODE) if j != i])
            for i, g in sorted(scrapers[node].gpus.items())]))
    return scrapers, inventory


def register(store: Store, nodes: list[str], rng: random.Random) -> dict[str, DcgmExporterScraper]:
    """The agents' inventories, stored as one topology version: agent registration is measured on its own
    (``--registration``), not in the loop measured here."""
    scrapers, inventory = inventories(nodes, rng)
    store.save_topology(Topology(nodes=inventory), source="agent")
    return scrapers


# Above this many GPUs the baseline (quadratic) is not run: it would take most of an hour here.
REGISTRATION_BASELINE_MAX_GPUS = 1000


def run_registration(gpus: int, seed: int) -> dict[str, Any]:
    """Every agent registers its inventory once, one after another, as ``POST /api/v1/inventory`` does
    (``Store.register_node``, a fresh SQLite store). Baseline, same run: the store before node versions, a whole
    topology version per registration (the current topology read, the node merged, ``Store.save_topology``)."""
    nodes = [f"n{i:05d}" for i in range(gpus // GPUS_PER_NODE)]
    _, inventory = inventories(nodes, random.Random(seed))

    def timed(register_one: Callable[[Store, Node], object]) -> tuple[float, int]:
        home = Path(tempfile.mkdtemp(prefix="vigil-bench-register-"))
        store = Store(f"sqlite:///{home / 'vigil.db'}")
        started = time.perf_counter()
        for node in inventory:
            register_one(store, node)
        seconds = time.perf_counter() - started
        topology = store.topology()
        assert topology is not None and len(topology.nodes) == len(nodes)
        store.close()
        return seconds, (home / "vigil.db").stat().st_size

    def whole_version(store: Store, node: Node) -> None:
        current = store.topology() or Topology()
        store.save_topology(current.model_copy(update={"nodes": [*current.nodes, node]}), source="agent")

    seconds, size = timed(lambda store, node: store.register_node(node))
    result: dict[str, Any] = {"gpus": gpus, "nodes": len(nodes), "seconds": seconds,
                              "ms_per_node": 1000 * seconds / len(nodes), "store_mib": size / 2**20}
    if gpus <= REGISTRATION_BASELINE_MAX_GPUS:
        base_seconds, base_size = timed(whole_version)
        result.update(baseline_seconds=base_seconds, baseline_ms_per_node=1000 * base_seconds / len(nodes),
                      baseline_store_mib=base_size / 2**20)
    return result


def registration_table(rows: list[dict[str, Any]]) -> None:
    table = Table(title="agent registration, one Store.register_node per agent (simulated inventories, SQLite)")
    for column in ("GPUs", "nodes", "s", "ms / node", "store MiB", "baseline s", "baseline ms / node",
                   "baseline store MiB", "speed-up"):
        table.add_column(column, justify="right")
    for r in rows:
        base = "baseline_seconds" in r
        table.add_row(str(r["gpus"]), str(r["nodes"]), f"{r['seconds']:.2f}", f"{r['ms_per_node']:.1f}",
                      f"{r['store_mib']:.1f}", f"{r['baseline_seconds']:.2f}" if base else "-",
                      f"{r['baseline_ms_per_node']:.1f}" if base else "-",
                      f"{r['baseline_store_mib']:.1f}" if base else "-",
                      f"{r['baseline_seconds'] / r['seconds']:.1f}x" if base else "-")
    Console().print(table)


class Outcome:
    """Matches the incidents the engine opens against the faults written; anything else is a false incident."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.pending: list[tuple[float, str, str]] = []  # (written at, GPU, fault)
        self.latency: dict[str, list[float]] = {"gpu_lost": [], "gpu_dbe": []}
        self.false_incidents = 0
        self.seen: set[str] = set()

    def written(self, at: float, gpu: str, fault: str) -> None:
        self.pending.append((at, gpu, fault))

    def read(self, incident_ids: list[str], now: float) -> None:
        for incident_id in incident_ids:
            incident = self.store.incident(incident_id)
            assert incident is not None
            match = [p for p in self.pending if p[1] in incident.entities and p[2] in incident.fault_types]
            for found in match:
                self.latency[found[2]].append(now - found[0])
                self.pending.remove(found)
            if not match and incident_id not in self.seen:
                self.false_incidents += 1
            self.seen.add(incident_id)


def summary(gpus: int, path: str, healthy_s: float, outcome: Outcome, faults: int, tick_cpu: list[float],
            elapsed_s: float, load_start: tuple[float, ...]) -> dict[str, Any]:
    both = outcome.latency["gpu_lost"] + outcome.latency["gpu_dbe"]

    def pct(values: list[float], q: float) -> float | None:
        return float(np.percentile(values, q)) if values else None

    def scrapes(value: float | None) -> float | None:
        return None if value is None else value / SCRAPE_S

    cpu = np.array(tick_cpu)
    return {
        "gpus": gpus,
        "nodes": gpus // GPUS_PER_NODE,
        "path": path,
        "healthy_minutes": healthy_s / 60.0,
        "false_incidents": outcome.false_incidents,
        "false_incidents_per_hour": outcome.false_incidents / (healthy_s / 3600.0),
        "faults": faults,
        "missed": len(outcome.pending),
        "latency_p50_s": pct(both, 50),
        "latency_p99_s": pct(both, 99),
        "latency_p50_scrapes": scrapes(pct(both, 50)),
        "latency_p99_scrapes": scrapes(pct(both, 99)),
        "latency_xid_p50_s": pct(outcome.latency["gpu_lost"], 50),
        "latency_dbe_p50_s": pct(outcome.latency["gpu_dbe"], 50),
        "latency_dbe_p99_s": pct(outcome.latency["gpu_dbe"], 99),
        "latency_dbe_p99_scrapes": scrapes(pct(outcome.latency["gpu_dbe"], 99)),
        "ticks": len(tick_cpu),
        # Wall (or simulated) seconds per engine tick: 5 when the engine keeps its interval.
        "tick_interval_mean_s": elapsed_s / max(1, len(tick_cpu)),
        "tick_cpu_p50_ms": float(np.percentile(cpu, 50) * 1000),
        "tick_cpu_p99_ms": float(np.percentile(cpu, 99) * 1000),
        "engine_cpu_core_fraction": float(cpu.sum() / elapsed_s),
        "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "load_average_start": list(load_start),
        "load_average_end": list(os.getloadavg()),
    }


# ------------------------------------------------------------------------------------------------- agent push


class SimClock:
    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def run_push(gpus: int, healthy_min: float, faults: int, seed: int) -> dict[str, Any]:
    load_start = os.getloadavg()
    rng = random.Random(seed)
    nodes = [f"n{i:05d}" for i in range(gpus // GPUS_PER_NODE)]
    home = Path(tempfile.mkdtemp(prefix="vigil-bench-live-"))
    settings = Settings(home=home, engine_interval_s=ENGINE_S, resolve_after_s=3600.0)
    store = Store(settings.database_url())
    clock = SimClock(time.time())
    scrapers = register(store, nodes, rng)
    template = DcgmExporterScraper("http://bench", node=TEMPLATE)
    # Healthy pages: a pool of variants, each parsed by the production scraper; a node's push names its own GPUs.
    variants = [[(p.entity.split("/", 2)[2], p.metric, p.value)
                 for p in template.parse_page(node_page(TEMPLATE, rng), 0.0).points if p.entity.startswith("gpu/")]
                for _ in range(VARIANTS)]
    dbe: dict[str, dict[int, int]] = {}
    next_push = {n: clock.now + rng.uniform(0, SCRAPE_S) for n in nodes}

    def push(node: str) -> None:
        if node in dbe:
            points = [(p.entity, p.metric, p.value)
                      for p in scrapers[node].parse_page(node_page(node, rng, dbe[node]), clock.now).points]
        else:
            points = [(f"gpu/{node}/{index}", metric, value) for index, metric, value in rng.choice(variants)]
        store.add_samples(node, [{"ts": clock.now, "entity": e, "metric": m, "value": v} for e, m, v in points])

    engine = Engine(store, settings, notifiers=[], clock=clock)
    outcome = Outcome(store)
    tick_cpu: list[float] = []
    started = clock.now
    healthy_end = clock.now + 60 * healthy_min
    fault_nodes = rng.sample(nodes, faults)  # one fault per node: each is its own incident
    fault_times = [healthy_end + k * 2 * SCRAPE_S + rng.uniform(0, 2 * SCRAPE_S) for k in range(faults)]
    end = fault_times[-1] + 4 * SCRAPE_S if faults else healthy_end
    next_tick = clock.now + ENGINE_S
    injected = 0
    while clock.now < end:
        step_to = min(next_tick, min(next_push.values()))
        if fault_times and fault_times[0] <= step_to:
            clock.now = fault_times.pop(0)
            node, gpu = fault_nodes.pop(), rng.randrange(GPUS_PER_NODE)
            injected += 1
            if injected % 2:
                store.add_events([xid_event(node, gpu, clock.now, scrapers[node])])
                outcome.written(clock.now, f"gpu/{node}/{gpu}", "gpu_lost")
            else:
                dbe.setdefault(node, {})[gpu] = 1
                outcome.written(clock.now, f"gpu/{node}/{gpu}", "gpu_dbe")
            continue
        clock.now = step_to
        for node in [n for n, t in next_push.items() if t <= clock.now]:
            push(node)
            next_push[node] += SCRAPE_S
        if next_tick <= clock.now:
            began = time.process_time()
            report = engine.tick()
            cpu = time.process_time() - began
            tick_cpu.append(cpu)
            clock.now += cpu  # the engine's own time is part of the latency
            next_tick += ENGINE_S
            outcome.read(report.opened + report.changed, clock.now)
            if clock.now < healthy_end and outcome.false_incidents:
                log_false(store, report.opened)
    return summary(gpus, "agent push", 60 * healthy_min, outcome, faults, tick_cpu, clock.now - started,
                   load_start)


def log_false(store: Store, incident_ids: list[str]) -> None:
    for incident_id in incident_ids:
        incident = store.incident(incident_id)
        if incident is not None:
            print(f"false incident: {incident.scope} {incident.fault_types} {incident.title}", file=sys.stderr)


# ------------------------------------------------------------------------------------------------- prometheus

PROMETHEUS = """global: {{scrape_interval: {scrape}s, scrape_timeout: 10s, evaluation_interval: 1m}}
scrape_configs:
  - job_name: dcgm-exporter
    file_sd_configs: [{{files: ["{targets}"]}}]
"""


def serve_exporters(nodes: int, seed: int, port_file: Path) -> None:
    """Every node's dcgm-exporter page at /<node>/metrics (fresh healthy readings per scrape);
    POST /dbe/<node>/<gpu> raises that GPU's double-bit ECC counter, as the driver does."""
    rng = random.Random(seed)
    lock = threading.Lock()
    names = {f"n{i:05d}" for i in range(nodes)}
    dbe: dict[str, dict[int, int]] = {}
    route = re.compile(r"^/(n\d{5})/metrics$")
    fault = re.compile(r"^/dbe/(n\d{5})/(\d)$")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            match = route.match(self.path)
            if match is None or match.group(1) not in names:
                self.send_error(404)
                return
            with lock:
                page = node_page(match.group(1), rng, dbe.get(match.group(1))).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def do_POST(self) -> None:  # noqa: N802
            match = fault.match(self.path)
            if match is None or match.group(1) not in names:
                self.send_error(404)
                return
            with lock:
                counters = dbe.setdefault(match.group(1), {})
                counters[int(match.group(2))] = counters.get(int(match.group(2)), 0) + 1
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    port_file.write_text(str(server.server_port))
    server.serve_forever()


def _wait(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench/live.py: timed out waiting for {what}")
        time.sleep(0.5)


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def run_prometheus(gpus: int, healthy_min: float, faults: int, seed: int, prometheus_bin: str) -> dict[str, Any]:
    load_start = os.getloadavg()
    rng = random.Random(seed)
    nodes = [f"n{i:05d}" for i in range(gpus // GPUS_PER_NODE)]
    tmp = Path(tempfile.mkdtemp(prefix="vigil-bench-live-prom-"))
    port_file = tmp / "exporters.port"
    exporters = subprocess.Popen([sys.executable, __file__, "--serve-exporters", str(len(nodes)),
                                  "--port-file", str(port_file), "--seed", str(seed)])
    prometheus: subprocess.Popen[bytes] | None = None
    try:
        _wait(lambda: port_file.exists() and port_file.read_text().strip() != "", 60, "the exporters")
        exporter = f"127.0.0.1:{port_file.read_text().strip()}"
        targets = tmp / "targets.json"
        targets.write_text(json.dumps([{"targets": [exporter], "labels": {"__metrics_path__": f"/{n}/metrics"}}
                                       for n in nodes]))
        (tmp / "prometheus.yml").write_text(PROMETHEUS.format(scrape=int(SCRAPE_S), targets=targets))
        prom_port = _free_port()
        prometheus = subprocess.Popen(
            [prometheus_bin, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
            stdout=(tmp / "prometheus.log").open("w"), stderr=subprocess.STDOUT)
        source = PromQLSource(f"http://127.0.0.1:{prom_port}", timeout_s=60.0)
        source.wait_ready(timeout_s=120)

        def scraped(times: int) -> Callable[[], bool]:
            expr = f"count(count_over_time(DCGM_FI_DEV_GPU_UTIL[5m]) >= {times})"
            return lambda: bool(found := source.query(expr)) and int(found[0].values[0]) == gpus

        # Two scrapes of every target before the engine starts: every counter has a value to step from.
        _wait(scraped(2), 6 * SCRAPE_S, "Prometheus to scrape every exporter twice")
        home = tmp / "home"
        settings = Settings(home=home, engine_interval_s=ENGINE_S, resolve_after_s=3600.0)
        store = Store(settings.database_url())
        scrapers = register(store, nodes, rng)
        engine = Engine(store, settings, prom=source, notifiers=[])
        outcome = Outcome(store)
        tick_cpu: list[float] = []
        started = time.time()
        healthy_end = started + 60 * healthy_min
        fault_nodes = rng.sample(nodes, faults)
        fault_times = [healthy_end + k * 1.5 * SCRAPE_S + rng.uniform(0, 1.5 * SCRAPE_S) for k in range(faults)]
        end = fault_times[-1] + 4 * SCRAPE_S if faults else healthy_end
        next_tick = started
        injected = 0
        with httpx.Client(base_url=f"http://{exporter}") as client:
            while time.time() < end:
                now = time.time()
                if fault_times and fault_times[0] <= now:
                    fault_times.pop(0)
                    node, gpu = fault_nodes.pop(), rng.randrange(GPUS_PER_NODE)
                    injected += 1
                    if injected % 2:
                        store.add_events([xid_event(node, gpu, time.time(), scrapers[node])])
                        outcome.written(time.time(), f"gpu/{node}/{gpu}", "gpu_lost")
                    else:
                        client.post(f"/dbe/{node}/{gpu}").raise_for_status()
                        outcome.written(time.time(), f"gpu/{node}/{gpu}", "gpu_dbe")
                    continue
                if next_tick <= now:
                    began = time.process_time()
                    report = engine.tick()
                    tick_cpu.append(time.process_time() - began)
                    next_tick += ENGINE_S
                    outcome.read(report.opened + report.changed, time.time())
                    if time.time() < healthy_end and outcome.false_incidents:
                        log_false(store, report.opened)
                    continue
                # Pacing a real-time run: wake at the next tick or fault.
                time.sleep(max(0.0, min([next_tick] + fault_times[:1]) - time.time()))
        elapsed = time.time() - started
        result = summary(gpus, "prometheus", 60 * healthy_min, outcome, faults, tick_cpu, elapsed, load_start)
        for name, process in (("prometheus", prometheus), ("exporters", exporters)):
            info = psutil.Process(process.pid)
            times = info.cpu_times()
            result[f"{name}_cpu_core_fraction"] = (times.user + times.system) / (time.time() - info.create_time())
            result[f"{name}_rss_mib"] = info.memory_info().rss / 2**20
        source.close()
        return result
    finally:
        if prometheus is not None:
            _stop(prometheus)
        _stop(exporters)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# ------------------------------------------------------------------------------------------------- driver


def run_one(path: str, gpus: int, args: argparse.Namespace) -> dict[str, Any]:
    """One (path, size) in a child process: its peak RSS is its own."""
    command = [sys.executable, __file__, "--one", f"{path}:{gpus}", "--seed", str(args.seed),
               "--hour-minutes", str(args.hour_minutes), "--prom-minutes", str(args.prom_minutes),
               "--faults", str(args.faults), "--prometheus", args.prometheus]
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="128,1000,10000")
    parser.add_argument("--paths", default="push,prometheus")
    parser.add_argument("--hour-minutes", type=float, default=60.0,
                        help="healthy simulated minutes before the faults (agent push path)")
    parser.add_argument("--prom-minutes", type=float, default=2.0,
                        help="healthy real minutes before the faults (Prometheus path)")
    parser.add_argument("--faults", type=int, default=10)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--prometheus", default="/usr/bin/prometheus")
    parser.add_argument("--registration", action="store_true",
                        help="measure only agent registration (Store.register_node) at --sizes")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--serve-exporters", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port-file", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    # The injected kernel lines carry no timestamp prefix (the simulated clock stamps them); the decoder's
    # warning about that format is expected here.
    logging.getLogger("vigil").setLevel(logging.ERROR)
    if args.serve_exporters:
        serve_exporters(args.serve_exporters, args.seed, args.port_file)
        return
    if args.one:
        path, size = args.one.split(":")
        if path == "push":
            result = run_push(int(size), args.hour_minutes, args.faults, args.seed)
        else:
            result = run_prometheus(int(size), args.prom_minutes, args.faults, args.seed, args.prometheus)
        print(json.dumps(result), flush=True)
        return
    if "prometheus" in args.paths and not Path(args.prometheus).exists():
        print(f"bench/live.py: no Prometheus binary at {args.prometheus} (install Debian's prometheus)",
              file=sys.stderr)
        raise SystemExit(2)
    out = REPO / "bench" / "results" / "live.json"
    if args.registration:
        rows = [run_registration(int(size), args.seed) for size in args.sizes.split(",")]
        results = json.loads(out.read_text()) if out.exists() else {"scrape_s": SCRAPE_S, "engine_s": ENGINE_S,
                                                                      "results": []}
        out.write_text(json.dumps({**results, "registration": rows}, indent=2) + "\n")
        registration_table(rows)
        return
    # Runs go one at a time (10,000 GPUs takes minutes here); each replaces its (path, size) in the results file.
    kept = [r for r in (json.loads(out.read_text())["results"] if out.exists() else [])
            if "false_incidents_per_hour" in r]
    names = {"push": "agent push", "prometheus": "prometheus"}
    for path in args.paths.split(","):
        for size in (int(s) for s in args.sizes.split(",")):
            result = run_one(path, size, args)
            print(json.dumps(result), flush=True)
            kept = [r for r in kept if (r["path"], r["gpus"]) != (names[path], size)] + [result]
            kept.sort(key=lambda r: (r["path"], r["gpus"]))
            previous = json.loads(out.read_text()) if out.exists() else {}
            out.write_text(json.dumps({**previous, "scrape_s": SCRAPE_S, "engine_s": ENGINE_S, "results": kept},
                                      indent=2) + "\n")
    table = Table(title=f"live engine (scrape {SCRAPE_S:g} s, engine tick {ENGINE_S:g} s; simulated cluster)")
    for column in ("path", "GPUs", "healthy min", "false / h", "missed", "p50 s", "p99 s", "p50 scr.", "p99 scr.",
                   "tick p50 ms", "p99 ms", "CPU core frac.", "max RSS MiB", "load avg"):
        table.add_column(column, justify="right")
    for r in kept:
        table.add_row(r["path"], str(r["gpus"]), f"{r['healthy_minutes']:.0f}", f"{r['false_incidents_per_hour']:.1f}",
                      f"{r['missed']}/{r['faults']}", f"{r['latency_p50_s']:.1f}", f"{r['latency_p99_s']:.1f}",
                      f"{r['latency_p50_scrapes']:.2f}", f"{r['latency_p99_scrapes']:.2f}",
                      f"{r['tick_cpu_p50_ms']:.0f}", f"{r['tick_cpu_p99_ms']:.0f}",
                      f"{r['engine_cpu_core_fraction']:.3f}", f"{r['max_rss_mib']:.0f}",
                      f"{r['load_average_start'][0]:.1f}-{r['load_average_end'][0]:.1f}")
    Console().print(table)


if __name__ == "__main__":
    main()
