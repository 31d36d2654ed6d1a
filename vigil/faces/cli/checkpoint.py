"""`vigil checkpoint ls` / `restore-backup`: what checkpoints a job has, how big, and getting one back."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from vigil.model import VigilInputError

app = typer.Typer(help="Checkpoints: list (with sizes), restore a backup.", no_args_is_help=True)
console = Console()


@app.command("ls")
def ls_command(
    directory: Annotated[Path, typer.Argument(help="a job's checkpoint directory")],
    as_json: Annotated[bool, typer.Option("--json", help="print the listing as JSON")] = False,
) -> None:
    """Every step directory: complete or not (a save cut short has no .metadata), size on disk, time."""
    from vigil.checkpoint.manager import describe_checkpoints

    if not directory.is_dir():
        raise VigilInputError(f"checkpoint directory {directory} does not exist")
    entries = describe_checkpoints(directory)
    if as_json:
        typer.echo(json.dumps(entries, indent=2))
        return
    table = Table(title=f"Checkpoints in {directory}")
    for column in ("step", "complete", "size MB", "files", "modified"):
        table.add_column(column, justify="right")
    for entry in entries:
        table.add_row(
            str(entry["step"]),
            "yes" if entry["complete"] else "[red]no[/]",
            f"{entry['bytes'] / 1e6:.1f}",
            str(entry["files"]),
            datetime.fromtimestamp(float(entry["mtime"])).strftime("%Y-%m-%d %H:%M:%S"),
        )
    total = sum(int(e["bytes"]) for e in entries)
    table.caption = f"{len(entries)} checkpoints, {total / 1e6:.1f} MB in all"
    console.print(table)


@app.command("restore-backup")
def restore_backup_command(
    url: Annotated[str, typer.Argument(help="fsspec URL the checkpoints were backed up to")],
    step: Annotated[int, typer.Argument(help="step to restore")],
    directory: Annotated[Path, typer.Argument(help="checkpoint directory to restore into")],
) -> None:
    """Copy a backed-up checkpoint into a job's checkpoint directory (e.g. on another cluster)."""
    from vigil.checkpoint.manager import restore_backup

    target = restore_backup(url, step, directory)
    console.print(f"restored step {step} into {target}")
