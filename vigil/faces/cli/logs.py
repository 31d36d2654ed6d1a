"""`vigil logs ...`: template mining, root-error triage, training-scalar checks, the signature library."""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.text import Text

from vigil.faces.cli.output import DataTable, ProgressBar, SafeConsole, json_text

app = typer.Typer(name="logs", help="Log intelligence: templates, root error across ranks, scalar checks.",
                  no_args_is_help=True)
console = SafeConsole()
err_console = SafeConsole(stderr=True)

JsonFlag = Annotated[bool, typer.Option("--json", help="machine-readable output")]


@app.command("parse")
def parse(
    file: Annotated[Path, typer.Argument(help="log file (raw lines or message contents)")],
    as_json: JsonFlag = False,
    state: Annotated[Path | None, typer.Option(help="template state file to resume from and save to")] = None,
    summary: Annotated[bool, typer.Option(help="one row per template with its line count, not per line")] = False,
) -> None:
    """Mine templates: one template per input line (with --json: JSON lines of line, template, template_id)."""
    from vigil.logs.miner import TemplateMiner, read_lines

    miner = TemplateMiner.load(state) if state else TemplateMiner()
    counts: Counter[str] = Counter()
    lineno = 0
    out = sys.stdout
    with _progress(err_console, file.stat().st_size if file.exists() else 0, "parsing") as (progress, task):
        for block in read_lines(file):
            templates = miner.add_templates(block)
            if summary:
                counts.update(t.id for t in templates)
            elif as_json:
                out.write("".join(
                    json.dumps({"line": lineno + i + 1, "template": t.text, "template_id": t.id}) + "\n"
                    for i, t in enumerate(templates)))
            else:
                out.write("".join(f"{lineno + i + 1}\t{t.id}\t{t.text}\n" for i, t in enumerate(templates)))
            lineno += len(block)
            progress.update(task, advance=sum(len(line) + 1 for line in block))
    if state:
        miner.save(state)
    if summary:
        # a template split off on a word and joined later (see TemplateMiner.canonical) counts as joined
        joined: Counter[str] = Counter()
        for tid, n in counts.items():
            joined[miner.canonical(miner.templates[tid]).id if tid in miner.templates else tid] += n
        rows = [(tid, n, miner.templates[tid].text if tid in miner.templates else "") for tid, n in
                joined.most_common()]
        if as_json:
            out.write(json_text([{"template_id": t, "lines": n, "template": text} for t, n, text in rows]) + "\n")
            return
        table = DataTable("template", "lines", "text", title=f"{file}: {lineno} lines, {len(rows)} templates")
        for tid, n, text in rows:
            table.add_row(tid, str(n), Text(text))
        console.print(table)
    else:
        err_console.print(f"{lineno} lines, {len(miner.templates)} templates", highlight=False)


def _byte_size(text: str, option: str) -> int:
    """``16G``, ``512M``, ``64K`` or a plain number of bytes (binary multiples); a one-line error otherwise."""
    found = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if found is None:
        raise typer.BadParameter(f"{text!r} is not a size (such as 16G, 512M or a number of bytes)",
                                 param_hint=option)
    return int(found[1]) << {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}[found[2].upper()]


@app.command("triage")
def triage_command(
    directory: Annotated[Path, typer.Argument(help="the failed job's log directory (all ranks, node logs), or "
                                              "one log file such as a Slurm job's slurm-JOBID.out")],
    as_json: JsonFlag = False,
    job: Annotated[str | None, typer.Option(help="job id for entity ids (default: the directory name, or the "
                                            "file name without its extension)")] = None,
    workers: Annotated[int | None, typer.Option(help="processes reading the files (default: one per core for "
                                                "logs of 64 MB or more)")] = None,
    olddir: Annotated[list[Path] | None, typer.Option(
        help="a directory holding the logs' rotated generations (logrotate's olddir) where it is not a directory "
             "named old/, archive/ or rotated/ beside a log or its directory; may be repeated")] = None,
    inflate_budget: Annotated[str, typer.Option(
        help="the most bytes inflated across all compressed generations read (K, M, G suffixes; 0: no total); the "
             "oldest generations past it are left out with a warning")] = "16G",
) -> None:
    """Find the root error across the ranks of a failed job and mark the cascade."""
    from vigil.logs.sources import discover
    from vigil.logs.triage import triage

    budget = _byte_size(inflate_budget, "--inflate-budget")
    olddirs = olddir or []
    total = len(discover(directory, olddirs))
    with _progress(err_console, total, "reading logs") as (progress, task):
        result = triage(directory, job=job, workers=workers, inflate_budget=budget or None, olddirs=olddirs,
                        progress=lambda _name: progress.update(task, advance=1))
    if as_json:
        sys.stdout.write(result.model_dump_json(indent=2) + "\n")
        return
    console.print(Text(result.summary, style="bold"))
    if result.root is not None:
        root = result.root
        # ids and paths fold rather than end in an ellipsis: a cut job/<name>/rank/1 reads as the job itself
        table = DataTable(show_header=False, title="root error")
        table.add_column("what", no_wrap=True)
        table.add_column("value", overflow="fold")
        for key, value in [("where", f"{root.source}:{root.lineno}"), ("entity", root.entity),
                           ("fault", f"{root.fault_type or '-'} ({root.level.label})"),
                           ("named by", result.root_basis or "-"), ("signature", root.signature),
                           ("line", root.line[:300])] + [(k, str(v)) for k, v in root.attrs.items() if k != "frames"]:
            table.add_row(key, Text(value))
        console.print(table)
    for title, events in (("machine faults", result.machine_faults), ("cascade", result.cascade[:30])):
        if not events:
            continue
        table = DataTable(title=title)
        for column in ("entity", "kind", "lines", "first at", "line"):
            table.add_column(column, overflow="fold")
        for event in events:
            table.add_row(event.entity, event.kind, str(event.count), Text(f"{event.source}:{event.lineno}"),
                          Text(event.line[:120]))
        console.print(table)
    if len(result.cascade) > 30:
        console.print(f"... and {len(result.cascade) - 30} more cascade entries (--json for all)")


@app.command("scalars")
def scalars(
    run: Annotated[Path, typer.Argument(help="TensorBoard run directory or event file")],
    as_json: JsonFlag = False,
) -> None:
    """Check training scalars for NaN / Inf, loss spikes, stalls and vanishing gradients."""
    from vigil.logs.scalars import ScalarMonitor, check_event_dir

    monitor = ScalarMonitor()
    findings = check_event_dir(run, monitor)
    if as_json:
        sys.stdout.write(json_text([f.model_dump(mode="json") for f in findings]) + "\n")
        return
    if not monitor.tags:  # "no problems" would claim a check that had nothing to look at
        console.print(f"{run}: no scalars recorded yet, nothing to check", markup=False)
        return
    if not findings:
        console.print(f"{run}: no problems found in {len(monitor.tags)} training scalars", markup=False)
        return
    table = DataTable("step", "tag", "fault", "detail", title=f"{run}: {len(findings)} findings")
    for f in findings:
        table.add_row(str(f.step), Text(f.tag), f.fault_type, Text(f.detail))
    console.print(table)


@app.command("signatures")
def signatures(as_json: JsonFlag = False) -> None:
    """List the error signature library, with the fault and the RCA symptom each signature establishes."""
    from vigil.knowledge.signatures import signature_library

    library = signature_library()
    if as_json:
        sys.stdout.write(json_text([s.model_dump(mode="json") for s in library]) + "\n")
        return
    table = DataTable("id", "fault", "symptom", "level", "role", "description", title=f"{len(library)} signatures")
    for s in library:
        table.add_row(s.id, s.fault or "-", s.symptom or "-", s.level.label, s.role, Text(s.description))
    console.print(table)


class _progress:
    """A transient Rich progress bar on stderr (silent when stderr is not a terminal)."""

    def __init__(self, target: SafeConsole, total: int, label: str) -> None:
        self.bar = ProgressBar(TextColumn(label), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                               TimeElapsedColumn(), console=target, transient=True)
        self.total = total

    def __enter__(self) -> tuple[Progress, TaskID]:
        self.bar.start()
        return self.bar, self.bar.add_task("work", total=self.total or None)

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()
