"""`vigil du PATH`: directory usage at any level, largest first, with growth since earlier scans."""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.progress import SpinnerColumn, TextColumn, TimeElapsedColumn

from vigil.config import settings
from vigil.faces.cli.output import DataTable, ProgressBar, SafeConsole, json_text
from vigil.sources.fscount import ScanCache, ScanResult, Usage, scan

console = SafeConsole()


def _human(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} PiB"


def _growth(cache: ScanCache, result: ScanResult, rows: list[Usage]) -> dict[str, int | None]:
    """Bytes gained since the previous scan that recorded each directory (None: no earlier scan)."""
    history = cache.history(result.root)
    latest = max((ts for ts, _, _ in history), default=0.0)  # this scan's own rows
    before: dict[str, int] = {}
    for ts, path, nbytes in history:  # oldest first: the last earlier scan of each directory wins
        if ts < latest:
            before[path] = nbytes
    return {u.path: (u.bytes - before[u.path]) if u.path in before else None for u in rows}


def du(
    path: Annotated[Path, typer.Argument(help="directory to measure")],
    top: Annotated[int, typer.Option("--top", min=1, help="show the N largest directories")] = 20,
    depth: Annotated[int | None, typer.Option("--depth", min=0, help="only directories down to this depth")] = None,
    full: Annotated[bool, typer.Option("--full", help="list every directory again, ignoring the cache")] = False,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="neither read nor write the scan cache")] = False,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            min=1,
            max=64,
            help="processes listing separate subtrees on a first or full scan [default: CPUs, at most 8]",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print totals and the top directories as JSON")] = False,
) -> None:
    """Disk usage of PATH and its largest directories (GNU du's numbers); re-scans list only changed directories.

    The cache lives under the Vigil home (du.sqlite) and also keeps each scan's totals down to depth 2, so a
    second scan shows how much each directory grew.
    """
    cache = None if no_cache else ScanCache(settings().home / "du.sqlite")
    if as_json:
        result = scan(path, cache, full=full, workers=workers)
    else:
        with ProgressBar(
            SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console, transient=True
        ) as bar:
            shown = escape(str(path))
            task = bar.add_task(f"scanning {shown}", total=None)
            result = scan(
                path,
                cache,
                full=full,
                workers=workers,
                progress=lambda n: bar.update(task, description=f"scanning {shown}: {n:,} directories"),
            )
    rows = result.top(top, depth)
    growth = _growth(cache, result, rows) if cache is not None else {u.path: None for u in rows}
    total = result.totals[result.root]
    if as_json:
        typer.echo(
            json_text(
                {
                    "root": result.root,
                    "bytes": total.bytes,
                    "apparent_bytes": total.apparent,
                    "files": total.files,
                    "dirs": total.dirs,
                    "listed_dirs": result.listed,
                    "cached_dirs": result.reused,
                    "seconds": round(result.seconds, 4),
                    "top": [
                        {
                            "path": u.path,
                            "bytes": u.bytes,
                            "apparent_bytes": u.apparent,
                            "files": u.files,
                            "growth_bytes": growth[u.path],
                        }
                        for u in rows
                    ],
                },
                indent=2,
            )
        )
        return
    table = DataTable(title=f"Largest directories under {result.root}")
    table.add_column("directory", overflow="fold")
    for column in ("disk", "apparent", "files", "growth"):
        table.add_column(column, justify="right")
    for u in rows:
        change = growth[u.path]
        table.add_row(
            os.path.relpath(u.path, result.root),
            _human(u.bytes),
            _human(u.apparent),
            f"{u.files:,}",
            "-" if change is None else ("+" if change >= 0 else "-") + _human(abs(change)),
        )
    console.print(table)
    when = datetime.now().strftime("%H:%M:%S")
    console.print(
        f"{result.root}: {_human(total.bytes)} on disk ({total.bytes:,} bytes), {total.files:,} files in "
        f"{total.dirs:,} directories; {result.listed:,} listed, {result.reused:,} from cache, "
        f"{result.seconds:.2f} s at {when}",
        highlight=False,
        markup=False,
    )
