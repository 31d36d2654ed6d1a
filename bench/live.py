"""The live engine at 128, 1,000 and 10,000 simulated GPUs: fault -> incident latency, engine CPU and memory,
false incidents on a healthy cluster.

Run: .venv/bin/python bench/live.py [--sizes 128,1000,10000] [--minutes 10]   -> bench/results/live.json

Simulated cluster, simulated clock, real costs. Every node (8 GPUs) runs an agent whose dcgm-exporter page is
parsed by the production scraper (DcgmExporterScraper.parse_page); each agent pushes its samples into the
store (Store.add_samples, as POST /api/v1/samples does) every scrape interval, at its own phase. The engine
(vigil.run.engine.Engine) ticks every engine interval on the same SQLite store; each tick's CPU time is
measured and advances the simulated clock, so a slow engine shows up as latency. Faults are injected only as
machines write them: an Xid 79 kernel line through the production kernel decoder (an event push) and a
double-bit ECC counter step on a dcgm-exporter page. Latency = incident stored - fault written (simulated
seconds). "keeps real time" = engine CPU per simulated second < 1 on one core. The first --minutes are
healthy: every incident opened there is a false incident.

Baseline in the same run: the batch path (vigil.run.pipeline) cannot open incidents until its input ends;
the live engine's latency is compared with the scrape interval it must wait for anyway.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.run.pages import dcgm_page, kernel_bus  # noqa: E402
from vigil.config import Settings  # noqa: E402
from vigil.model import Gpu, Node, Sample  # noqa: E402
from vigil.run.engine import Engine  # noqa: E402
from vigil.sources.collect.dcgm import DcgmExporterScraper  # noqa: E402
from vigil.sources.collect.kmsg import KernelLogSource  # noqa: E402
from vigil.store.sql import Store  # noqa: E402

GPUS_PER_NODE = 8
SCRAPE_S = 15.0
ENGINE_S = 5.0


class SimClock:
    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def run_size(gpus: int, healthy_min: float, faults: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    nodes = [f"n{i:05d}" for i in range(gpus // GPUS_PER_NODE)]
    home = Path(tempfile.mkdtemp(prefix="vigil-bench-live-"))
    settings = Settings(home=home, engine_interval_s=ENGINE_S, resolve_after_s=3600.0)
    store = Store(settings.database_url())
    clock = SimClock(time.time())
    scrapers = {n: DcgmExporterScraper("http://bench", node=n) for n in nodes}
    dbe: dict[str, dict[int, int]] = {n: {} for n in nodes}
    phase = {n: rng.uniform(0, SCRAPE_S) for n in nodes}
    next_push = {n: clock.now + phase[n] for n in nodes}
    pages = {n: dcgm_page(n, gpus=GPUS_PER_NODE) for n in nodes}

    parsed: dict[str, list[tuple[str, str, float]]] = {}

    def push(node: str) -> None:
        page = pages[node] if not dbe[node] else dcgm_page(node, gpus=GPUS_PER_NODE, dbe=dbe[node])
        if page not in parsed:  # an unchanged page parses to the same points: parse it once (agent-side cost)
            parsed[page] = [(p.entity, p.metric, p.value) for p in scrapers[node].parse_page(page, clock.now).points]
        store.add_samples(node, [Sample(ts=clock.now, entity=e, metric=m, value=v) for e, m, v in parsed[page]])

    for node in nodes:  # registration: the first page gives each agent its GPUs' identity
        scrapers[node].parse_page(pages[node], clock.now)
        store.register_node(Node(name=node, gpus=[Gpu(node=node, index=i) for i in range(GPUS_PER_NODE)]))
    engine = Engine(store, settings, notifiers=[], clock=clock)
    tick_cpu: list[float] = []
    healthy_end = clock.now + 60 * healthy_min
    pending: list[tuple[float, str, str]] = []  # (written at, expected scope, fault)
    latencies: dict[str, list[float]] = {"gpu_lost": [], "gpu_dbe": []}
    false_incidents = 0
    injected = 0
    fault_nodes = rng.sample(nodes, faults)  # one fault per node: each is its own incident
    fault_times = [healthy_end + k * 2 * SCRAPE_S + rng.uniform(0, 2 * SCRAPE_S) for k in range(faults)]
    end = fault_times[-1] + 4 * SCRAPE_S if faults else healthy_end
    next_tick = clock.now + ENGINE_S
    seen: set[str] = set()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    while clock.now < end:
        step_to = min(next_tick, min(next_push.values()))
        if fault_times and fault_times[0] <= step_to:
            clock.now = fault_times.pop(0)
            node, gpu = fault_nodes.pop(), rng.randrange(GPUS_PER_NODE)
            injected += 1
            if injected % 2:
                kernel = KernelLogSource(lambda: [], node=node,
                                         gpu_index=lambda pci, s=scrapers[node]: s.pci_to_index.get(pci))
                line = f"NVRM: Xid (PCI:{kernel_bus(gpu)}): 79, pid=0, name=, GPU has fallen off the bus."
                event = kernel.decode(line, clock.now)
                assert event is not None
                store.add_events([event])
                pending.append((clock.now, f"gpu/{node}/{gpu}", "gpu_lost"))
            else:
                dbe[node][gpu] = dbe[node].get(gpu, 0) + 1
                pending.append((clock.now, f"gpu/{node}/{gpu}", "gpu_dbe"))
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
            for incident_id in report.opened + report.changed:
                incident = store.incident(incident_id)
                assert incident is not None
                match = [p for p in pending if p[1] in incident.entities and p[2] in incident.fault_types]
                for found in match:
                    latencies[found[2]].append(clock.now - found[0])
                    pending.remove(found)
                if not match and incident_id not in seen:
                    false_incidents += 1
                seen.add(incident_id)
    all_latency = latencies["gpu_lost"] + latencies["gpu_dbe"]
    cpu = np.array(tick_cpu)
    return {
        "gpus": gpus,
        "nodes": len(nodes),
        "path": "agent push",
        "healthy_minutes": healthy_min,
        "false_incidents": false_incidents,
        "faults": faults,
        "missed": len(pending),
        "latency_p50_s": float(np.percentile(all_latency, 50)) if all_latency else None,
        "latency_p99_s": float(np.percentile(all_latency, 99)) if all_latency else None,
        "latency_xid_p50_s": float(np.median(latencies["gpu_lost"])) if latencies["gpu_lost"] else None,
        "latency_dbe_p50_s": float(np.median(latencies["gpu_dbe"])) if latencies["gpu_dbe"] else None,
        "tick_cpu_p50_ms": float(np.percentile(cpu, 50) * 1000),
        "tick_cpu_p99_ms": float(np.percentile(cpu, 99) * 1000),
        "cpu_per_sim_s": float(cpu.sum() / (len(cpu) * ENGINE_S)),
        "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_growth_mib": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="128,1000,10000")
    parser.add_argument("--minutes", type=float, default=10.0, help="healthy simulated minutes before the faults")
    parser.add_argument("--faults", type=int, default=10)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    # The injected kernel lines carry no timestamp prefix (the simulated clock stamps them); the decoder's
    # warning about that format is expected here.
    logging.getLogger("vigil").setLevel(logging.ERROR)
    out = REPO / "bench" / "results" / "live.json"
    # Sizes run one at a time (10,000 GPUs takes minutes here); each run replaces its size in the results file.
    kept = json.loads(out.read_text())["results"] if out.exists() else []
    results = []
    for size in (int(s) for s in args.sizes.split(",")):
        results.append(run_size(size, args.minutes, args.faults, args.seed))
        print(json.dumps(results[-1]), flush=True)
    sizes = {r["gpus"] for r in results}
    results = sorted([r for r in kept if r["gpus"] not in sizes] + results, key=lambda r: r["gpus"])
    table = Table(title=f"live engine, agent push path (scrape {SCRAPE_S:g} s, engine tick {ENGINE_S:g} s; simulated)")
    for column in ("GPUs", "false inc.", "missed", "latency p50 s", "p99 s", "tick CPU p50 ms", "p99 ms",
                   "CPU / sim s", "max RSS MiB"):
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(str(r["gpus"]), str(r["false_incidents"]), f"{r['missed']}/{r['faults']}",
                      f"{r['latency_p50_s']:.1f}", f"{r['latency_p99_s']:.1f}", f"{r['tick_cpu_p50_ms']:.0f}",
                      f"{r['tick_cpu_p99_ms']:.0f}", f"{r['cpu_per_sim_s']:.3f}", f"{r['max_rss_mib']:.0f}")
    Console().print(table)
    out.write_text(json.dumps({"scrape_s": SCRAPE_S, "engine_s": ENGINE_S, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
