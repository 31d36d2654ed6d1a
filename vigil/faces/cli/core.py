"""The spine's verbs: demo, sim, incidents, nodes."""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from vigil.config import settings
from vigil.faces.cli.output import DataTable, ProgressBar, SafeConsole, json_text, styled
from vigil.model import FaultLevel, IncidentStatus, VigilInputError

if TYPE_CHECKING:
    from vigil.sources.sim import SimConfig

console = SafeConsole()
LEVEL_STYLE = {FaultLevel.HEALTHY: "green", FaultLevel.OBSERVE: "cyan", FaultLevel.DEGRADED: "yellow",
               FaultLevel.DRAIN: "dark_orange", FaultLevel.ISOLATE: "bold red"}
DEMO_MARKER = "DEMO"
MAX_SIM_MINUTES = 7 * 24 * 60  # a week of simulated time; longer runs are a typo, not a plan


def _progress() -> ProgressBar:
    """On stderr and only on a terminal, so it shows beside --json too (`vigil demo --json > out.json`)."""
    return ProgressBar(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                       TimeElapsedColumn(), console=SafeConsole(stderr=True), transient=True)


def _sim_config(nodes: int, gpus: int, minutes: float, seed: int) -> SimConfig:
    """Every number checked before anything is written (``nan`` and ``inf`` pass the comparisons)."""
    from vigil.sources.sim import SimConfig

    if not math.isfinite(minutes) or not 0 < minutes <= MAX_SIM_MINUTES:
        raise VigilInputError(f"--minutes must be a number of simulated minutes in (0, {MAX_SIM_MINUTES}], "
                              f"not {minutes}")
    config = SimConfig(nodes=nodes, gpus=gpus, minutes=minutes, seed=seed)
    config.validate()
    return config


def _directory_option(path: Path, option: str) -> Path:
    if path.exists() and not path.is_dir():
        raise VigilInputError(f"{option} {path} is a file; expected a directory")
    blocker = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise VigilInputError(f"{option} {path}: {blocker} is a file, so no directory can be made there")
    return path


def is_demo_store(settings: Any) -> bool:
    """The store under a home `vigil demo` wrote (it leaves its marker there). The live engine must not run on
    it: it would judge the demo's simulated incidents by the wall clock and open each one again."""
    home = settings.home
    return bool((home / DEMO_MARKER).exists() and settings.database_url() == f"sqlite:///{home / 'vigil.db'}")


def _fresh_demo_store(home: Path) -> Path:
    """The demo owns its store: it may replace a store it made before, never someone else's."""
    _directory_option(home, "--home")
    db = home / "vigil.db"
    if db.exists() and not (home / DEMO_MARKER).exists():
        raise VigilInputError(f"{db} holds data that `vigil demo` did not write; pass --home DIR to run the demo "
                              "elsewhere")
    for path in (db, home / "vigil.db-wal", home / "vigil.db-shm", home / "metrics"):
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    home.mkdir(parents=True, exist_ok=True)
    (home / DEMO_MARKER).write_text("this store was written by `vigil demo` and is replaced by the next one\n")
    return db


def demo(
    nodes: Annotated[int, typer.Option(help="nodes in the simulated cluster")] = 16,
    gpus: Annotated[int, typer.Option(help="GPUs per node")] = 8,
    minutes: Annotated[float, typer.Option(help="simulated minutes")] = 60.0,
    seed: Annotated[int, typer.Option(help="random seed (same seed, same run)")] = 0,
    home: Annotated[Path | None, typer.Option(help="where the demo's store goes (default: settings home)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Simulate a cluster with injected faults, run the whole flow, and score it against the ground truth."""
    config = _sim_config(nodes, gpus, minutes, seed)
    home = home or settings().home
    _directory_option(home, "--home")

    from vigil.detect.base import StreamDetector
    from vigil.detect.rules import RuleDetector
    from vigil.detect.stream import learned_detectors
    from vigil.run.pipeline import run_pipeline
    from vigil.sources.sim import simulate
    from vigil.store.metrics import MetricStore
    from vigil.store.sql import Store
    from vigil_eval.scoring import score as score_incidents

    db = _fresh_demo_store(home)
    run = simulate(config)
    store = Store(f"sqlite:///{db}")
    # the learned GPU detector runs beside the rules once one is trained into <home>/models/tce-gpu
    detectors: list[StreamDetector] = [RuleDetector(run.topology), *learned_detectors(run.topology, home)]
    with _progress() as progress:
        task = progress.add_task(f"simulating {nodes} x {gpus} GPUs for {minutes:g} min", total=run.n_ticks)
        # the events go to the store; the result's copy of them is not read here
        result = run_pipeline(run, store=store, metrics=MetricStore(home / "metrics"), detectors=detectors,
                              progress=lambda done, total: progress.update(task, completed=done), keep_events=False)
    score = score_incidents(result.incidents, run.ground_truth, run.topology)
    sim_seconds = run.n_ticks * config.interval_s
    if as_json:
        out: dict[str, Any] = {
            "cluster": {"nodes": nodes, "gpus_per_node": gpus, "gpus": nodes * gpus, "minutes": minutes,
                        "seed": seed, "jobs": len(run.topology.jobs)},
            "faults_injected": score.faults_injected, "faults_visible_to_rules": score.faults_visible,
            "faults_detected": score.faults_detected, "precision": round(score.precision, 4),
            "recall": round(score.recall, 4), "recall_all_faults": round(score.recall_all, 4),
            "localization": round(score.localization, 4), "exact_localization": round(score.exact_localization, 4),
            "mean_detection_delay_s": score.mean_delay_s,
            "samples": result.samples, "seconds": round(result.seconds, 3),
            "speedup_vs_real_time": round(sim_seconds / max(result.seconds, 1e-9), 1),
            "store": str(db),
            "detectors": [d.name for d in detectors],
            "incidents": [inc.model_dump(mode="json", exclude={"evidence"}) for inc in result.incidents],
            "ground_truth": [m.model_dump(mode="json") for m in score.matches],
            "by_fault": score.by_fault,
        }
        print(json_text(out))
        return
    console.print(f"[bold]Vigil demo[/] - {nodes} nodes x {gpus} GPUs, {len(run.topology.jobs)} training jobs, "
                  f"{minutes:g} simulated minutes, seed {seed}: {result.samples:,} samples in {result.seconds:.1f} s "
                  f"({sim_seconds / max(result.seconds, 1e-9):,.0f}x real time)")
    table = DataTable(title="Injected faults (ground truth) and what Vigil found", title_justify="left")
    # Entity ids are never cut (at 80 columns too); fault names fold whole and the verdict wraps instead.
    table.add_column("fault", overflow="fold")
    table.add_column("entity", no_wrap=True, min_width=max((len(m.entity) for m in score.matches), default=6))
    table.add_column("at", no_wrap=True)
    table.add_column("detected", overflow="fold")
    table.add_column("incident scope", no_wrap=True,
                     min_width=max((len(m.incident_scope or "-") for m in score.matches), default=5))
    table.add_column("delay", no_wrap=True)
    for m in score.matches:
        missed = styled("no", "red") if m.visible_to_rules else styled("no (not rule-visible)", "dim")
        seen = styled("yes", "green") if m.incident_id else missed
        table.add_row(m.fault_type, m.entity, f"+{(m.start - run.start_ts) / 60:.1f} min", seen,
                      m.incident_scope or "-", "-" if m.delay_s is None else f"{m.delay_s:+.0f} s")
    console.print(table)
    incidents = sorted(result.incidents, key=lambda i: i.start)
    inc_table = DataTable(title="Incidents", title_justify="left")
    # Ids are what the next command needs: never cut or wrapped; the title and fault types wrap instead.
    inc_table.add_column("id", no_wrap=True, min_width=max((len(i.id) for i in incidents), default=2))
    inc_table.add_column("level", no_wrap=True)
    inc_table.add_column("title", ratio=2, overflow="fold")
    inc_table.add_column("at", no_wrap=True)
    inc_table.add_column("fault types", ratio=1, overflow="fold")
    for inc in incidents:
        inc_table.add_row(inc.id, styled(inc.level.label, LEVEL_STYLE[inc.level]), inc.title,
                          f"+{(inc.start - run.start_ts) / 60:.1f} min", ", ".join(inc.fault_types[:4]))
    console.print(inc_table)
    console.print(f"precision [bold]{score.precision:.2f}[/]  recall [bold]{score.recall:.2f}[/] "
                  f"({score.faults_detected}/{score.faults_visible} rule-visible faults)  localization "
                  f"{score.localization:.2f} (entity, its node or job; the entity itself "
                  f"{score.exact_localization:.2f})  mean delay {score.mean_delay_s} s  "
                  f"loose observations (not paged): {len(result.observations)}")
    hidden = sorted({m.fault_type for m in score.matches if not m.visible_to_rules})
    if hidden:
        console.print(f"[dim]not visible to rules (left to the learned detectors): {escape(', '.join(hidden))}[/]")
    if len(detectors) == 1:
        console.print("[dim]detectors: rules only; to run the learned GPU detector beside them: "
                      "`vigil sim --seed 1 --minutes 240 --out RUN && vigil detect train --data RUN --format sim "
                      f"--out {escape(str(home))}/models/tce-gpu`[/]")
    else:
        console.print(f"[dim]detectors: {escape(', '.join(d.name for d in detectors))}[/]")
    console.print(f"[dim]stored in {escape(str(db))}; next: `vigil incidents`, `vigil nodes`[/]")


def sim(
    out: Annotated[Path, typer.Option(help="directory to write the simulated data into")],
    nodes: int = 16,
    gpus: int = 8,
    minutes: float = 60.0,
    seed: int = 0,
    as_json: Annotated[bool, typer.Option("--json", help="print a JSON summary")] = False,
) -> None:
    """Write a simulated run (topology, metrics, events, logs, ground truth) as files (see docs/simulator.md)."""
    from vigil.sources.sim import simulate
    from vigil.sources.sim.io import write_sim

    config = _sim_config(nodes, gpus, minutes, seed)
    _directory_option(out, "--out")
    run = simulate(config)
    with _progress() as progress:
        task = progress.add_task(f"writing {escape(str(out))}", total=run.n_ticks)
        summary = write_sim(run, out, progress=lambda done, total: progress.update(task, completed=done))
    if as_json:
        print(json_text({"out": str(out), **summary}))
    else:
        console.print(f"wrote {summary['samples']:,} samples, {summary['events']} events, {summary['log_lines']} log "
                      f"lines and {summary['faults']} ground-truth faults to {escape(str(out))}")


def _stored() -> Any:
    """The store for a read command, or None when nothing was ever stored (reading creates nothing)."""
    from vigil.store.sql import open_store, store_exists

    return open_store() if store_exists(settings().database_url()) else None


def incidents(
    status: Annotated[str | None, typer.Option(help="open, acknowledged or resolved")] = None,
    limit: Annotated[int, typer.Option(min=1, help="the newest this many")] = 100,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """List incidents, newest first."""
    if status is not None and status not in {s.value for s in IncidentStatus}:
        raise VigilInputError(f"bad --status {status!r}: expected open, acknowledged or resolved")
    store = _stored()
    items = store.incidents(status=status, limit=limit) if store is not None else []
    if as_json:
        print(json_text([i.model_dump(mode="json") for i in items]))
        return
    table = DataTable(title=f"{len(items)} incidents")
    # Ids are what the next command needs: never cut or wrapped; the title wraps instead.
    table.add_column("id", no_wrap=True, min_width=max((len(i.id) for i in items), default=2))
    for col in ("status", "level", "title", "entities"):
        table.add_column(col)
    for inc in items:
        table.add_row(inc.id, inc.status.value, styled(inc.level.label, LEVEL_STYLE[inc.level]), inc.title,
                      str(len(inc.entities)))
    console.print(table)


def nodes(
    unhealthy: Annotated[bool, typer.Option("--unhealthy", help="only nodes with a fault or out of service")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Health and fault level per node and GPU (worst open incident), with the node lifecycle state."""
    store = _stored()
    health = store.node_health() if store is not None else {}
    topo = store.topology() if store is not None else None
    lifecycle = _lifecycle_states() if store is not None else {}
    rows = []
    for node in topo.nodes if topo else []:
        rows.append({"node": node.id, "level": health.get(node.id, FaultLevel.HEALTHY).label,
                     "lifecycle": lifecycle.get(node.id, "healthy"), "switch": node.switch,
                     "gpus": {g.id: health.get(g.id, FaultLevel.HEALTHY).label for g in node.gpus}})
    total = len(rows)
    sick = [r for r in rows if r["level"] != "healthy" or r["lifecycle"] != "healthy"
            or any(v != "healthy" for v in r["gpus"].values())]
    if unhealthy:
        rows = sick
    if as_json:
        print(json_text(rows))
        return
    table = DataTable(title=f"{len(rows)} nodes")
    table.add_column("node", no_wrap=True, min_width=max((len(r["node"]) for r in rows), default=4))
    for col in ("level", "lifecycle", "switch", "GPUs (0..n)"):
        table.add_column(col)
    for row in rows:
        level = FaultLevel.parse(row["level"])
        cells = Text.assemble(*(("#" if v != "healthy" else ".", LEVEL_STYLE[FaultLevel.parse(v)])
                                for v in row["gpus"].values()))
        table.add_row(row["node"], styled(level.label, LEVEL_STYLE[level]), row["lifecycle"], row["switch"], cells)
    console.print(table)
    out_of_service = sum(1 for r in sick if r["lifecycle"] != "healthy")
    console.print(f"{total} nodes: {total - len(sick)} healthy, {len(sick)} with a fault or out of service "
                  f"({out_of_service} out of service)", highlight=False)


def _lifecycle_states() -> dict[str, str]:
    try:
        from vigil.remedy.lifecycle import LifecycleStore
    except ImportError:
        return {}
    return {node: str(state) for node, state in LifecycleStore(settings().database_url()).states().items()}
