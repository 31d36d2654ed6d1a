"""Vigil server under load, and its durability under kill -9.

Run: .venv/bin/python bench/serve.py [--rate 200] [--seconds 60]   -> bench/results/serve.json

Load: `vigil serve` runs as its own process (one uvicorn worker) over a SQLite store filled by the
simulator and the pipeline (16 nodes x 8 GPUs, 60 minutes). An open-loop client sends --rate requests/s
for --seconds on loopback - a mix of dashboard and agent reads (incident list and detail, nodes, GPUs,
metric series, /metrics) and writes (events, actions) - and measures each latency from the moment the
request was *due*, so a stalled server cannot hide queueing (no coordinated omission). Target: p99 < 200 ms
and no errors. The floor measured in the same run is /api/v1/health, the cheapest route through the same
stack; each endpoint's p50 is reported as a ratio to it.

Durability: a writer posts incidents as fast as the server acknowledges them (HTTP 201 is sent after the
store's commit); the server is killed with SIGKILL mid-stream, restarted on the same store, and every
acknowledged incident is read back. Target: none lost. Repeated --kills times.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import uvloop
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
TOKEN = "bench-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
console = Console()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def populate(home: Path) -> dict[str, Any]:
    from vigil.run.pipeline import run_pipeline
    from vigil.sources.sim import SimConfig, simulate
    from vigil.store.metrics import MetricStore
    from vigil.store.sql import Store

    run = simulate(SimConfig(nodes=16, gpus=8, minutes=60, seed=11))
    store = Store(f"sqlite:///{home / 'vigil.db'}")
    result = run_pipeline(run, store=store, metrics=MetricStore(home / "metrics"))
    store.close()
    return {
        "incidents": [i.id for i in result.incidents],
        "gpus": [g.id for n in run.topology.nodes for g in n.gpus],
        "nodes": [n.name for n in run.topology.nodes],
        "jobs": [j.id for j in run.topology.jobs],
        "ts": run.end_ts,
    }


class Server:
    """`vigil serve` as a child process on a free loopback port; ``code`` is the checkout it runs from (another
    one gives a same-run baseline of an earlier version)."""

    def __init__(self, home: Path, code: Path = REPO) -> None:
        self.home = home
        self.code = code
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> float:
        env = {
            **os.environ,
            "VIGIL_HOME": str(self.home),
            "VIGIL_API_TOKEN": TOKEN,
            "VIGIL_DB_URL": f"sqlite:///{self.home / 'vigil.db'}",
            "PYTHONPATH": str(self.code),
        }
        started = time.perf_counter()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "vigil", "serve", "--port", str(self.port)],
            cwd=self.code,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=(self.home / "serve.log").open("ab"),
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vigil serve exited with {self.process.returncode}; see {self.home}/serve.log")
            try:
                if httpx.get(self.url + "/api/v1/health", timeout=1).status_code == 200:
                    return time.perf_counter() - started
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError("vigil serve did not come up in 120 s")

    def kill(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)


def request_mix(data: dict[str, Any], rng: random.Random) -> tuple[str, str, str, dict[str, Any] | None]:
    """(label, method, path, json body) for one request, in proportions a dashboard + agents produce."""
    roll = rng.random()
    if roll < 0.22:
        return "incidents", "GET", "/api/v1/incidents?limit=50", None
    if roll < 0.40:
        return "incident", "GET", f"/api/v1/incidents/{rng.choice(data['incidents'])}", None
    if roll < 0.55:
        return "nodes", "GET", "/api/v1/nodes", None
    if roll < 0.65:
        return "gpus", "GET", "/api/v1/gpus?min_level=2", None
    if roll < 0.77:
        gpu = rng.choice(data["gpus"])
        return "series", "GET", f"/api/v1/metrics/series?entity={gpu}&metric=DCGM_FI_DEV_GPU_TEMP", None
    if roll < 0.79:
        return "metrics", "GET", "/metrics", None
    if roll < 0.90:
        return "health", "GET", "/api/v1/health", None
    if roll < 0.97:
        event = {
            "ts": data["ts"],
            "entity": rng.choice(data["gpus"]),
            "kind": "bench",
            "source": "bench",
            "message": "synthetic load event",
            "level": 1,
        }
        return "post_events", "POST", "/api/v1/events", [event]  # type: ignore[return-value]
    return "post_action", "POST", "/api/v1/actions", {"kind": "collect_logs", "target": rng.choice(data["gpus"])}


class Connection:
    """One keep-alive HTTP/1.1 connection on asyncio streams: a few microseconds of client CPU per request,
    so the load generator measures the server rather than itself (httpx costs ~1 ms per request)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str) -> None:
        self.reader, self.writer, self.host = reader, writer, host

    async def request(self, method: str, path: str, body: Any) -> int:
        payload = json.dumps(body).encode() if body is not None else b""
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
        )
        self.writer.write(head.encode() + payload)
        status_line = await self.reader.readline()
        length = 0
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            if name.lower() == "content-length":
                length = int(value)
        await self.reader.readexactly(length)
        return int(status_line.split()[1])


async def load(
    url: str, data: dict[str, Any], rate: float, seconds: float, connections: int = 64
) -> list[tuple[str, float, int]]:
    """Open loop: request k is due at start + k / rate and takes the next idle connection; its latency counts
    from the moment it was due, so waiting for a connection (server backlog) is included."""
    rng = random.Random(5)
    host, port = url.removeprefix("http://").split(":")
    idle: asyncio.Queue[Connection] = asyncio.Queue()
    for _ in range(connections):
        reader, writer = await asyncio.open_connection(host, int(port))
        idle.put_nowait(Connection(reader, writer, f"{host}:{port}"))
    total = int(rate * seconds)
    results: list[tuple[str, float, int]] = []
    start = time.perf_counter()

    async def one(k: int, due: float) -> None:
        label, method, path, body = request_mix(data, rng)
        connection = await idle.get()
        try:
            code = await asyncio.wait_for(connection.request(method, path, body), timeout=30)
            idle.put_nowait(connection)
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError, IndexError):
            code = 0  # the connection is unusable after a failure; replace it
            reader, writer = await asyncio.open_connection(host, int(port))
            idle.put_nowait(Connection(reader, writer, f"{host}:{port}"))
        results.append((label, time.perf_counter() - due, code))

    pending: set[asyncio.Task[None]] = set()
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"{rate:g} req/s for {seconds:g} s", total=total)
        for k in range(total):
            due = start + k / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            job = asyncio.create_task(one(k, due))
            pending.add(job)
            job.add_done_callback(pending.discard)
            if k % 50 == 0:
                progress.update(task, completed=len(results))
        await asyncio.gather(*pending)
    return results


def durability(home: Path, server: Server, kills: int, rng: random.Random) -> dict[str, Any]:
    from vigil.model import FaultLevel, Incident

    acknowledged: list[str] = []
    restarts = []
    for _ in range(kills):
        stop = threading.Event()

        def writer(stop: threading.Event) -> None:
            with httpx.Client(base_url=server.url, headers=AUTH, timeout=10) as client:
                while not stop.is_set():
                    incident = Incident(
                        title="durability probe",
                        scope="node/n000",
                        entities=["node/n000"],
                        start=time.time(),
                        end=time.time(),
                        level=FaultLevel.DRAIN,
                        fault_types=["bench"],
                    )
                    try:
                        response = client.post(
                            "/api/v1/incidents",
                            content=incident.model_dump_json(),
                            headers={"content-type": "application/json"},
                        )
                    except httpx.HTTPError:  # the kill landed on this request: it was never acknowledged
                        return
                    if response.status_code == 201:
                        acknowledged.append(incident.id)

        threads = [threading.Thread(target=writer, args=(stop,)) for _ in range(4)]
        for thread in threads:
            thread.start()
        before = len(acknowledged)
        deadline = time.monotonic() + 60
        target = before + rng.randint(50, 150)
        while len(acknowledged) < target and time.monotonic() < deadline:
            time.sleep(0.01)
        server.kill()  # mid-stream: writers have requests in flight
        stop.set()
        for thread in threads:
            thread.join()
        restarts.append(server.start())

    from vigil.store.sql import Store

    store = Store(f"sqlite:///{home / 'vigil.db'}")
    lost = [i for i in acknowledged if store.incident(i) is None]
    with httpx.Client(base_url=server.url, timeout=10) as client:
        via_api = sum(client.get(f"/api/v1/incidents/{i}").status_code == 200 for i in acknowledged[-50:])
    store.close()
    return {
        "kills": kills,
        "acknowledged": len(acknowledged),
        "lost": len(lost),
        "last_50_readable_via_api": via_api,
        "restart_s_max": max(restarts),
    }


def summarize(results: list[tuple[str, float, int]]) -> dict[str, dict[str, float]]:
    by_label: dict[str, list[float]] = {}
    for label, latency, _ in results:
        by_label.setdefault(label, []).append(latency)
        by_label.setdefault("all", []).append(latency)
    out = {}
    for label, values in sorted(by_label.items()):
        arr = np.array(values) * 1000
        out[label] = {
            "n": len(arr),
            "p50_ms": float(np.percentile(arr, 50)),
            "p99_ms": float(np.percentile(arr, 99)),
            "max_ms": float(arr.max()),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--kills", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vigil-bench-serve-") as tmp:
        home = Path(tmp)
        with console.status("simulating 16 nodes x 8 GPUs, 60 min, into the store"):
            data = populate(home)
        server = Server(home)
        startup = server.start()
        try:
            # Warm-up (first touches of every route, connection set-up) is run and not counted.
            uvloop.run(load(server.url, data, args.rate, 3.0))
            load_before = os.getloadavg()[0]
            started = time.perf_counter()
            results = uvloop.run(load(server.url, data, args.rate, args.seconds))
            elapsed = time.perf_counter() - started
            load_after = os.getloadavg()[0]
            errors = sum(1 for _, _, code in results if not 200 <= code < 300)
            with console.status(f"durability: {args.kills} kill -9 restarts during writes"):
                durable = durability(home, server, args.kills, random.Random(3))
        finally:
            server.stop()
    stats = summarize(results)
    floor = stats["health"]["p50_ms"]
    table = Table(
        title=f"vigil serve: {len(results)} requests, {len(results) / elapsed:.0f} req/s achieved "
        f"(machine load {load_before:.1f} -> {load_after:.1f} on {os.cpu_count()} cores)"
    )
    for column in ("endpoint", "n", "p50 ms", "p99 ms", "max ms", "p50 / health p50"):
        table.add_column(column, justify="right" if column != "endpoint" else "left")
    for label, row in stats.items():
        table.add_row(
            label,
            str(row["n"]),
            f"{row['p50_ms']:.1f}",
            f"{row['p99_ms']:.1f}",
            f"{row['max_ms']:.1f}",
            f"{row['p50_ms'] / floor:.1f}x",
        )
    console.print(table)
    ok_load = stats["all"]["p99_ms"] < 200 and errors == 0
    ok_durable = durable["lost"] == 0 and durable["acknowledged"] > 0
    console.print(
        f"load target (p99 < 200 ms, no errors): {'met' if ok_load else 'NOT met'} "
        f"(p99 {stats['all']['p99_ms']:.1f} ms, {errors} errors)"
    )
    console.print(
        f"durability: {durable['acknowledged']} acknowledged incidents over {durable['kills']} kill -9, "
        f"{durable['lost']} lost; restart <= {durable['restart_s_max']:.1f} s: "
        f"{'met' if ok_durable else 'NOT met'}"
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "serve.json").write_text(
        json.dumps(
            {
                "rate_target": args.rate,
                "seconds": args.seconds,
                "requests": len(results),
                "achieved_rate": len(results) / elapsed,
                "errors": errors,
                "latency": stats,
                "health_floor_p50_ms": floor,
                "machine_load_avg_1m": {"before": load_before, "after": load_after, "cores": os.cpu_count()},
                "startup_s": startup,
                "durability": durable,
                "targets": {"load_p99_lt_200ms_no_errors": ok_load, "no_acknowledged_incident_lost": ok_durable},
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
