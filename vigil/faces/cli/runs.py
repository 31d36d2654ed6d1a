"""`vigil runs`: index TensorBoard runs once and incrementally, list, compare and merge them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer
from rich.markup import escape

from vigil.config import settings
from vigil.faces.cli.output import DataTable, ProgressBar, SafeConsole, json_text

if TYPE_CHECKING:
    from vigil.sources.tensorboard import RunIndex

app = typer.Typer(help="Experiment runs (TensorBoard scalars): index, list, compare, merge.", no_args_is_help=True)
console = SafeConsole()


def _index() -> RunIndex:
    from vigil.sources.tensorboard import RunIndex

    return RunIndex(settings().home / "runs.sqlite")


@app.command("index")
def index_command(
    logdir: Annotated[Path, typer.Argument(help="a TensorBoard log directory (runs are its subdirectories)")],
    as_json: Annotated[bool, typer.Option("--json", help="print new points per run as JSON")] = False,
) -> None:
    """Read what is new in LOGDIR's event files into the index (only bytes not read before)."""
    index = _index()
    try:
        if as_json:
            added = index.update(logdir)
            typer.echo(json_text(added, indent=2))
            return
        with ProgressBar(console=console, transient=True) as bar:
            task = bar.add_task(f"indexing {escape(str(logdir))}", total=None)
            added = index.update(logdir, progress=lambda done, total: bar.update(task, completed=done, total=total))
    finally:
        index.close()
    console.print(f"{sum(added.values()):,} new points in {len(added)} runs", highlight=False)


@app.command("ls")
def ls_command(as_json: Annotated[bool, typer.Option("--json", help="print the runs as JSON")] = False) -> None:
    """Every indexed run and merged run, with its tags and number of points."""
    from dataclasses import asdict

    infos = []
    if (settings().home / "runs.sqlite").exists():  # a read makes no index (nor the home) where none is
        index = _index()
        try:
            infos = index.runs()
        finally:
            index.close()
    if as_json:
        typer.echo(json_text([asdict(i) for i in infos], indent=2))
        return
    table = DataTable(title="Runs", caption=None if infos else "no runs indexed: `vigil runs index LOGDIR`")
    for column in ("run", "points", "tags", "merged from"):
        table.add_column(column, overflow="fold")
    for info in infos:
        table.add_row(
            info.name,
            f"{info.points:,}",
            ", ".join(info.tags),
            ", ".join(info.merged_from or []),
        )
    console.print(table)


@app.command("compare")
def compare_command(
    runs: Annotated[list[str], typer.Argument(help="runs to compare (names from `vigil runs ls`)")],
    tag: Annotated[str, typer.Option("--tag", help="scalar tag, e.g. loss")],
    align: Annotated[str, typer.Option("--align", help="step, or time (seconds since each run's start)")] = "step",
    points: Annotated[int, typer.Option("--points", min=2, max=100_000, help="points per run at most")] = 1000,
    as_json: Annotated[bool, typer.Option("--json", help="print every run's points as JSON")] = False,
) -> None:
    """One tag of several runs side by side: last value, minimum, and the value at common x positions."""
    from vigil.model import VigilInputError

    if align not in ("step", "time"):
        raise VigilInputError(f"--align must be step or time, not {align!r}")
    how: Literal["step", "time"] = "step" if align == "step" else "time"
    index = _index()
    try:
        compared = index.compare(runs, tag, how, points)
    finally:
        index.close()
    if as_json:
        typer.echo(
            json_text(
                [
                    {
                        "run": s.run,
                        "tag": s.tag,
                        "x": x.tolist(),
                        "steps": s.steps.tolist(),
                        "values": s.values.tolist(),
                    }
                    for s, x in compared
                ]
            )
        )
        return
    table = DataTable(title=f"{tag} by {align}")
    for column in ("run", "points shown", "first x", "last x", "last value", "min value"):
        table.add_column(column, justify="right")
    for series, x in compared:
        table.add_row(
            series.run,
            f"{len(x):,}",
            f"{x[0]:.6g}",
            f"{x[-1]:.6g}",
            f"{series.values[-1]:.6g}",
            f"{float(series.values.min()):.6g}",
        )
    console.print(table)


@app.command("merge")
def merge_command(
    name: Annotated[str, typer.Argument(help="name of the merged run")],
    parts: Annotated[
        list[str], typer.Argument(help="runs in order; a later one replaces earlier points from its first step")
    ],
) -> None:
    """Make one run of several (a restarted job's segments); the parts stay as they are."""
    index = _index()
    try:
        index.merge(name, parts)
    finally:
        index.close()
    console.print(f"merged {len(parts)} runs into {escape(name)}")
