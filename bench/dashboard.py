"""The cluster page at 10,000 GPUs in headless Chromium: weight, time to the drawn map, and how many of the
non-healthy GPUs are on the first screen.

Run: .venv/bin/python bench/dashboard.py [--nodes 1250] [--gpus 8] [--loads 5]   -> bench/results/dashboard.json

Store: `vigil demo --nodes 1250 --gpus 8 --minutes 30` (simulated cluster, the live path's detectors).
Server: `vigil serve` as its own process over that store. Browser: Debian's Chromium, headless, 1280 x 900,
a fresh context (empty cache) per load. The numbers are the page's own: bytes are the encoded bodies of
the page, its assets and the map data (Resource Timing); the map time is the page's ``vigil-map-drawn`` mark
(performance.now() when the canvas first holds every GPU), counted from navigation start. The first load
after the server starts is reported apart (cold caches: topology parse, template compile).

Baseline, same run, same store: the cluster page as it was before (commit 784b8c0: one server-rendered SVG
row per node), served by that commit's own `vigil serve`; its map is drawn when the page's load event ends.

--first-view: the first view of incidents stored without a diagnosis (every incident of the demo store), right
after `vigil serve` started on a fresh copy of the store: the time to the incident page's HTML, and for this
version the time until its diagnosis is stored by the background thread (asked of .../diagnosis/status every
0.1 s). Baseline in the same run, on its own copy of the same store: commit 1772206, which diagnosed the
incident inside the page request.   -> bench/results/dashboard_first_view.json

--diagnosis-cost: one background diagnosis's own work (``ServeContext.compute_diagnosis``) over the incidents the
first view picks (--views, default 5 here), in one process on one store: the records of the incident's
footprint selected in the database by entity (this version) against the read of commit 35338d4 (every event and
log line of the window read and decoded, only the footprint's built: ``Store.events(keep=...)``), alternated per
incident and repetition, the same diagnoses asserted.   -> bench/results/dashboard_diagnosis_cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve import AUTH, REPO, RESULTS, Server  # noqa: E402

BASELINE_COMMIT = "784b8c0"
FIRST_VIEW_BASELINE = "1772206"  # the incident page diagnosing inside the request
VIEWPORT = {"width": 1280, "height": 900}
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
console = Console(width=170)

OURS_JS = """() => {
  const m = vigilMap.state.map;
  let bad = 0, shown = 0;
  const canvas = document.getElementById('map').getBoundingClientRect();
  for (let p = 0; p < m.gpu_levels.length; p++) {
    if (m.gpu_levels[p] === '0') { continue; }
    bad++;
    const c = vigilMap.cell(p);
    if (c && canvas.top + c[1] < innerHeight && canvas.left + c[0] < innerWidth) { shown++; }
  }
  const data = performance.getEntriesByType('resource').find((e) => e.name.includes('/api/v1/cluster/map'));
  return {map_ms: vigilMap.state.firstRenderMs, map_data_ms: data ? data.responseEnd : null, unhealthy: bad,
          unhealthy_on_first_screen: shown};
}"""

BASELINE_JS = """() => {
  const nav = performance.getEntriesByType('navigation')[0];
  let bad = 0, shown = 0;
  for (const cell of document.querySelectorAll('svg.heatmap rect.cell[data-entity^="gpu/"]')) {
    if (cell.dataset.level === '0') { continue; }
    bad++;
    if (cell.getBoundingClientRect().top < innerHeight) { shown++; }
  }
  return {map_ms: nav.loadEventEnd, map_data_ms: nav.responseEnd, unhealthy: bad, unhealthy_on_first_screen: shown};
}"""

COMMON_JS = """() => {
  const nav = performance.getEntriesByType('navigation')[0];
  const all = [nav, ...performance.getEntriesByType('resource')];
  const fcp = performance.getEntriesByName('first-contentful-paint')[0];
  return {bytes: all.reduce((s, e) => s + e.encodedBodySize, 0), requests: all.length,
          html_bytes: nav.encodedBodySize, dom_content_loaded_ms: nav.domContentLoadedEventEnd,
          first_contentful_paint_ms: fcp ? fcp.startTime : null};
}"""


def build_store(home: Path, nodes: int, gpus: int, minutes: float) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-m", "vigil", "demo", "--nodes", str(nodes), "--gpus", str(gpus), "--minutes",
         str(minutes), "--home", str(home), "--json"],
        cwd=REPO, env=env, check=True, capture_output=True, text=True,
    )
    summary = json.loads(out.stdout)
    return {"nodes": nodes, "gpus": summary["cluster"]["gpus"], "incidents": len(summary["incidents"])}


def baseline_checkout(into: Path, commit: str = BASELINE_COMMIT) -> Path:
    """The earlier version's package, exported from git (no work tree touched)."""
    archive = subprocess.run(["git", "archive", commit, "vigil"], cwd=REPO, check=True, capture_output=True)
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into


def measure(browser: Any, url: str, ready: str, probe: str) -> dict[str, Any]:
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    page.goto(url, timeout=120_000)
    page.wait_for_function(ready, timeout=120_000)
    page.wait_for_load_state("load")
    row: dict[str, Any] = {**page.evaluate(COMMON_JS), **page.evaluate(probe)}
    context.close()
    return row


def run_page(browser: Any, server: Server, ready: str, probe: str, loads: int) -> dict[str, Any]:
    server.start()
    try:
        cold = measure(browser, server.url + "/", ready, probe)
        warm = [measure(browser, server.url + "/", ready, probe) for _ in range(loads)]
    finally:
        server.stop()
    keys = ("bytes", "html_bytes", "requests", "dom_content_loaded_ms", "first_contentful_paint_ms", "map_data_ms",
            "map_ms")
    median = {k: statistics.median(r[k] for r in warm if r[k] is not None) for k in keys}
    return {
        "cold": cold,
        "median": median,
        "max_map_ms": max(r["map_ms"] for r in warm),
        "unhealthy": warm[0]["unhealthy"],
        "unhealthy_on_first_screen": warm[0]["unhealthy_on_first_screen"],
        "loads": warm,
    }


def first_views(home: Path, code: Path, incidents: list[str], background: bool) -> list[dict[str, Any]]:
    """Start `vigil serve` (from ``code``) on ``home``; view each incident once, in turn: seconds to the page's
    HTML and, with ``background``, until the diagnosis is stored."""
    import httpx

    server = Server(home, code=code)
    server.start()
    rows = []
    try:
        with httpx.Client(base_url=server.url, headers=AUTH, timeout=300) as client:
            for incident in incidents:
                started = time.perf_counter()
                page = client.get(f"/incidents/{incident}")
                page.raise_for_status()
                row: dict[str, Any] = {"incident": incident, "page_s": time.perf_counter() - started,
                                       "pending_on_page": "Diagnosis in progress" in page.text}
                if background:
                    while client.get(f"/api/v1/incidents/{incident}/diagnosis/status").json()["state"] in (
                            "pending", "running"):
                        time.sleep(0.1)
                row["diagnosis_s"] = time.perf_counter() - started
                rows.append(row)
    finally:
        server.stop()
    return rows


def run_first_view(args: argparse.Namespace) -> None:
    import shutil
    import sqlite3

    with tempfile.TemporaryDirectory(prefix="vigil-bench-first-view-") as tmp:
        pristine = Path(tmp) / "pristine"
        if args.from_store:
            shutil.copytree(args.from_store, pristine)
            store = {"nodes": args.nodes, "gpus": args.nodes * args.gpus, "from": str(args.from_store)}
        else:
            console.print(f"building the demo store: {args.nodes} nodes x {args.gpus} GPUs, {args.minutes:g} min")
            store = build_store(pristine, args.nodes, args.gpus, args.minutes)
        with sqlite3.connect(pristine / "vigil.db") as db:
            rows = db.execute("SELECT id, level, body FROM incidents WHERE status = 'open' AND scope LIKE 'gpu/%'"
                              ).fetchall()
        # the incidents an SRE opens from a page: open, GPU-scoped, the worst first
        picked = sorted(rows, key=lambda r: (-r[1], -len(json.loads(r[2])["evidence"]), r[0]))[: args.views]
        ids = [r[0] for r in picked]
        old = baseline_checkout(Path(tmp) / "baseline", FIRST_VIEW_BASELINE)
        results = {}
        for name, code, background in ((f"diagnosed in the request ({FIRST_VIEW_BASELINE})", old, False),
                                       ("diagnosed in the background (this version)", REPO, True)):
            home = Path(tmp) / ("home-" + ("new" if background else "old"))
            shutil.copytree(pristine, home)
            console.print(f"{name}: first view of {len(ids)} incidents")
            results[name] = first_views(home, code, ids, background)
    table = Table(title=f"First view of an undiagnosed incident at {store['gpus']:,} GPUs ({len(ids)} incidents)")
    for col in ("server", "page median s", "page max s", "diagnosis stored median s", "pending on the page"):
        table.add_column(col, justify="right" if col != "server" else "left")
    for name, rows in results.items():
        table.add_row(name, f"{statistics.median(r['page_s'] for r in rows):.3f}",
                      f"{max(r['page_s'] for r in rows):.3f}",
                      f"{statistics.median(r['diagnosis_s'] for r in rows):.1f}",
                      f"{sum(r['pending_on_page'] for r in rows)} of {len(rows)}")
    console.print(table)
    before, after = (statistics.median(r["page_s"] for r in rows) for rows in results.values())
    console.print(f"page median: {before:.2f} s -> {after:.3f} s ({before / after:.0f}x)")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {"store": store, "cpus": os.cpu_count(), "incidents": ids, "servers": results,
           "page_median_ratio": before / after}
    (RESULTS / "dashboard_first_view.json").write_text(json.dumps(out, indent=2) + "\n")
    console.print(f"wrote {RESULTS / 'dashboard_first_view.json'}")


class WindowReadStore:
    """A Store whose ``events`` and ``logs`` read as commit 35338d4's did: every row of the window read and
    decoded, the records of the wanted entities built (``keep``), the others dropped."""

    def __init__(self, store: Any) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def events(self, since: float, until: float, limit: int, entities: Any) -> list[Any]:
        from sqlalchemy import select

        from vigil.model import Event, FaultLevel
        from vigil.store import schema as t

        q = select(t.events).order_by(t.events.c.ts, t.events.c.id).limit(limit)
        q = q.where(t.events.c.ts >= since).where(t.events.c.ts <= until)
        with self._store.engine.connect() as conn:
            return [Event(ts=r.ts, entity=r.entity, kind=r.kind, source=r.source, level=FaultLevel(r.level),
                          message=r.message, attrs=r.attrs) for r in conn.execute(q) if r.entity in entities]

    def logs(self, since: float, until: float, limit: int, entities: Any) -> list[Any]:
        from sqlalchemy import select

        from vigil.model import LogRecord
        from vigil.store import schema as t

        q = select(t.logs).order_by(t.logs.c.ts, t.logs.c.id).limit(limit)
        q = q.where(t.logs.c.ts >= since).where(t.logs.c.ts <= until)
        with self._store.engine.connect() as conn:
            return [LogRecord(ts=r.ts, entity=r.entity, source=r.source, line=r.line, lineno=r.lineno)
                    for r in conn.execute(q) if r.entity in entities]


class TimedReads:
    """A store whose ``events`` and ``logs`` reads are timed (``spent``, seconds since the last ``take``)."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.spent = 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def _timed(self, read: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return read(**kwargs)
        finally:
            self.spent += time.perf_counter() - started

    def events(self, **kwargs: Any) -> Any:
        return self._timed(self._store.events, **kwargs)

    def logs(self, **kwargs: Any) -> Any:
        return self._timed(self._store.logs, **kwargs)

    def take(self) -> float:
        spent, self.spent = self.spent, 0.0
        return spent


def run_diagnosis_cost(args: argparse.Namespace) -> None:
    import re
    import shutil
    import sqlite3

    from vigil.config import Settings
    from vigil.faces.api.app import create_app
    from vigil.store.sql import Store

    with tempfile.TemporaryDirectory(prefix="vigil-bench-diagnosis-") as tmp:
        home = Path(tmp) / "home"
        if args.from_store:
            shutil.copytree(args.from_store, home)
            store_info = {"nodes": args.nodes, "gpus": args.nodes * args.gpus, "from": str(args.from_store)}
        else:
            console.print(f"building the demo store: {args.nodes} nodes x {args.gpus} GPUs, {args.minutes:g} min")
            store_info = build_store(home, args.nodes, args.gpus, args.minutes)
        with sqlite3.connect(home / "vigil.db") as db:
            rows = db.execute("SELECT id, level, body FROM incidents WHERE status = 'open' AND scope LIKE 'gpu/%'"
                              ).fetchall()
        picked = sorted(rows, key=lambda r: (-r[1], -len(json.loads(r[2])["evidence"]), r[0]))[: args.views]
        ids = [r[0] for r in picked]
        store = Store(f"sqlite:///{home / 'vigil.db'}")
        settings = Settings(home=home, db_url=store.url, serve_diagnosis_threads=0)
        new_ctx = create_app(store, settings=settings).state.ctx
        old_ctx = create_app(store, settings=settings).state.ctx
        old_ctx.store = TimedReads(WindowReadStore(store))
        new_ctx.store = TimedReads(store)
        read: dict[str, list[float]] = {"window read (35338d4)": [], "entities in SQL (this version)": []}
        reads: dict[str, list[float]] = {name: [] for name in read}
        rows_out = []

        def normalised(found: Any) -> str:
            return re.sub(r"ev-[0-9a-f]{12}", "ev-*", found.model_dump_json())

        new_ctx.compute_diagnosis(ids[0])  # builds the knowledge graph once (both share it)
        old_ctx._kg = new_ctx._kg
        for incident in ids:
            runs: dict[str, list[float]] = {name: [] for name in read}
            read_s: dict[str, list[float]] = {name: [] for name in read}
            made: dict[str, str] = {}
            for rep in range(args.reps):
                order = list(zip(read, (old_ctx, new_ctx), strict=True))
                for name, ctx in order if rep % 2 == 0 else order[::-1]:
                    ctx.store.take()
                    started = time.perf_counter()
                    found = ctx.compute_diagnosis(incident)
                    runs[name].append(time.perf_counter() - started)
                    read_s[name].append(ctx.store.take())
                    made.setdefault(name, normalised(found))
                    assert made[name] == normalised(found)
            same = len(set(made.values())) == 1
            assert same, f"{incident}: the two reads diagnosed differently"
            row = {"incident": incident, "same_diagnosis": same,
                   "diagnosis_s": {name: statistics.median(v) for name, v in runs.items()},
                   "events_and_logs_read_s": {name: statistics.median(v) for name, v in read_s.items()}}
            rows_out.append(row)
            for name in read:
                read[name].append(row["diagnosis_s"][name])
                reads[name].append(row["events_and_logs_read_s"][name])
            console.print(row)
        store.close()
    table = Table(title=f"One diagnosis at {store_info['gpus']:,} GPUs ({len(ids)} incidents, median of "
                  f"{args.reps} each, alternated)")
    for col in ("read", "diagnosis median s", "diagnosis max s", "events + logs read median s", "read max s"):
        table.add_column(col, justify="right" if col != "read" else "left")
    for name, values in read.items():
        table.add_row(name, f"{statistics.median(values):.2f}", f"{max(values):.2f}",
                      f"{statistics.median(reads[name]):.3f}", f"{max(reads[name]):.3f}")
    console.print(table)
    before, after = (statistics.median(v) for v in read.values())
    read_before, read_after = (statistics.median(v) for v in reads.values())
    console.print(f"diagnosis median: {before:.2f} s -> {after:.2f} s; its events and logs read: "
                  f"{read_before:.3f} s -> {read_after:.3f} s")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {"store": store_info, "cpus": os.cpu_count(), "reps": args.reps, "incidents": rows_out,
           "diagnosis_median_s": {name: statistics.median(v) for name, v in read.items()},
           "read_median_s": {name: statistics.median(v) for name, v in reads.items()}}
    (RESULTS / "dashboard_diagnosis_cost.json").write_text(json.dumps(out, indent=2) + "\n")
    console.print(f"wrote {RESULTS / 'dashboard_diagnosis_cost.json'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1250)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--loads", type=int, default=5)
    parser.add_argument("--first-view", action="store_true", help="the first view of undiagnosed incidents")
    parser.add_argument("--views", type=int, help="with --first-view (default 3) or --diagnosis-cost (default 5): "
                        "how many incidents")
    parser.add_argument("--diagnosis-cost", action="store_true", help="one diagnosis, entities read in SQL or not")
    parser.add_argument("--reps", type=int, default=3, help="with --diagnosis-cost: runs of each read per incident")
    parser.add_argument("--from-store", type=Path, help="with --first-view or --diagnosis-cost: a demo home built "
                        "already (copied)")
    args = parser.parse_args()
    if args.diagnosis_cost:
        args.views = args.views or 5
        run_diagnosis_cost(args)
        return
    args.views = args.views or 3
    if args.first_view:
        run_first_view(args)
        return
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="vigil-bench-dashboard-") as tmp:
        home = Path(tmp) / "home"
        console.print(f"building the demo store: {args.nodes} nodes x {args.gpus} GPUs, {args.minutes:g} min")
        store = build_store(home, args.nodes, args.gpus, args.minutes)
        old = baseline_checkout(Path(tmp) / "baseline")
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
            results = {
                "canvas map (this version)": run_page(
                    browser, Server(home), "document.body.dataset.mapReady", OURS_JS, args.loads
                ),
                f"SVG rows ({BASELINE_COMMIT})": run_page(
                    browser, Server(home, code=old), "document.readyState === 'complete'", BASELINE_JS, args.loads
                ),
            }
            browser.close()
    title = f"Cluster page at {store['gpus']:,} GPUs (median of {args.loads} loads, Chromium 1280x900)"
    table = Table(title=title)
    for col in ("page", "bytes", "requests", "DOMContentLoaded ms", "map data in ms", "map drawn ms", "max ms",
                "cold ms", "unhealthy on first screen"):
        table.add_column(col, justify="right" if col != "page" else "left")
    for name, r in results.items():
        m = r["median"]
        table.add_row(
            name, f"{m['bytes']:,.0f}", f"{m['requests']:.0f}", f"{m['dom_content_loaded_ms']:.0f}",
            f"{m['map_data_ms']:.0f}", f"{m['map_ms']:.0f}", f"{r['max_map_ms']:.0f}", f"{r['cold']['map_ms']:.0f}",
            f"{r['unhealthy_on_first_screen']} of {r['unhealthy']}",
        )
    console.print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {"store": store, "viewport": VIEWPORT, "loads": args.loads, "cpus": os.cpu_count(), "pages": results}
    (RESULTS / "dashboard.json").write_text(json.dumps(out, indent=2) + "\n")
    console.print(f"wrote {RESULTS / 'dashboard.json'}")


if __name__ == "__main__":
    main()
