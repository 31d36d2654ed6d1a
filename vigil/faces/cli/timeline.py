"""`vigil timeline RUN_DIR`: the run's per-rank step and op timeline as a Chrome trace / Perfetto file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from vigil.faces.cli.output import SafeConsole, json_text, write_out


def timeline_command(
    run_dir: Annotated[Path, typer.Argument(help="run directory of `vigil launch` or of the probe")],
    out: Annotated[Path | None, typer.Option("--out", help="where to write (default RUN_DIR/timeline.json)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the trace on stdout instead")] = False,
) -> None:
    """Export every rank's steps and communication ops; open the file in ui.perfetto.dev or chrome://tracing."""
    from vigil.diagnose.hang import diagnose, load_run
    from vigil.diagnose.timeline import TIMELINE_FILE, chrome_trace

    run = load_run(run_dir)
    trace = chrome_trace(run, diagnose(run))
    if as_json:
        typer.echo(json_text(trace))
        return
    path = out or run_dir / TIMELINE_FILE
    write_out(path, json_text(trace))
    spans = sum(1 for e in trace["traceEvents"] if e["ph"] == "X")
    SafeConsole(stderr=True).print(f"{spans} spans of {len(run.snapshots)} rank(s) written to {path}", markup=False)
