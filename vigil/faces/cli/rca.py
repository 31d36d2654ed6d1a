"""`vigil kb`, `vigil rca eval` and the report behind `vigil diagnose incident ID`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markdown import Markdown
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

from vigil.faces.cli.output import DataTable, ProgressBar, SafeConsole, echo, json_text, styled, write_out
from vigil.model import VigilInputError

kb_app = typer.Typer(help="The fault knowledge base: symptom -> fault -> cause -> remedy.", no_args_is_help=False)
rca_app = typer.Typer(help="Root cause analysis: evaluation on simulated incidents.", no_args_is_help=True)


@kb_app.callback(invoke_without_command=True)
def kb_list(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="print the knowledge base as JSON")] = False,
    directory: Annotated[Path | None, typer.Option("--dir", help="a knowledge-base directory to read")] = None,
) -> None:
    """List the knowledge base: fault types with level, entity kinds, symptom and remedy counts."""
    if ctx.invoked_subcommand is not None:
        return
    from vigil.diagnose.kb import load_kb

    kb = load_kb(directory)
    if as_json:
        faults = {f.name: {"entity": list(f.entity_kinds), "level": f.level.label, "title": f.title,
                           "causes": list(f.causes), "symptoms": f.symptoms,
                           "remedies": [{"action": r.action.value, "target": r.on, "risk": r.risk, "why": r.why}
                                        for r in f.remedies], "log_prior": round(kb.log_prior(f.name), 4)}
                  for f in kb.faults.values()}
        typer.echo(json_text({"summary": kb.summary(), "faults": faults, "problems": kb.problems,
                               "warnings": kb.warnings}, indent=2))
        return
    console = SafeConsole()
    table = DataTable(title=f"Vigil knowledge base ({kb.source}; versions {kb.versions})")
    for column in ("fault", "entity", "level", "symptoms", "remedies", "prior"):
        table.add_column(column)
    for fault in kb.faults.values():
        table.add_row(fault.name, ",".join(fault.entity_kinds), fault.level.label, str(len(fault.symptoms)),
                      ", ".join(r.action.value for r in fault.remedies), f"{kb.log_prior(fault.name):.2f}")
    console.print(table)
    summary = kb.summary()
    console.print(f"{summary['signatures']} log signatures, {summary['xids']} Xid codes, "
                  f"{summary['trace_classes']} trace classes ({summary['trace_faults_mapped']} of "
                  f"{summary['trace_faults_total']} real faults mapped)")


@kb_app.command("validate")
def kb_validate(
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
    directory: Annotated[Path | None, typer.Option("--dir", help="a knowledge-base directory to check")] = None,
) -> None:
    """Check the knowledge base: YAML structure, whitelisted actions, symptom references, simulator coverage."""
    from vigil.diagnose.kb import load_kb

    kb = load_kb(directory)
    if as_json:
        typer.echo(json_text({"valid": not kb.problems, "problems": kb.problems, "warnings": kb.warnings,
                               "summary": kb.summary()}, indent=2))
    else:
        console = SafeConsole()
        for warning in kb.warnings:
            console.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False)
        for problem in kb.problems:
            console.print(f"[red]problem:[/] {escape(problem)}", highlight=False)
        if not kb.problems:
            console.print(f"[green]knowledge base valid[/]: {len(kb.faults)} faults, {len(kb.signatures)} "
                          f"signatures, {len(kb.xids)} Xids")
    if kb.problems:
        raise typer.Exit(1)


@rca_app.command("eval")
def rca_eval_command(
    cases: Annotated[int, typer.Option("--cases", help="number of simulated incidents")] = 300,
    seed: Annotated[int, typer.Option("--seed", help="seed of the case generator")] = 7,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
) -> None:
    """Build simulated incidents (single faults, switch cascades, hangs, crashes, noise), run detection and
    RCA on each, and report AC@1 / AC@3 overall and per fault type."""
    from vigil_eval.rca import evaluate

    err = SafeConsole(stderr=True)
    with ProgressBar(TextColumn("rca eval"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                     console=err) as bar:
        task = bar.add_task("cases", total=cases)
        report = evaluate(cases, seed, progress=lambda done, total: bar.update(task, completed=done))
    summary = report.summary()
    if as_json:
        typer.echo(json_text(summary, indent=2))
        return
    console = SafeConsole()
    table = DataTable(title=f"RCA on {summary['cases']} simulated incidents (seed {seed})")
    for column in ("fault type", "cases", "detected", "AC@1", "AC@3"):
        table.add_column(column)
    for name, block in summary["by_fault"].items():
        table.add_row(name, str(block["cases"]), str(block["detected"]), f"{block['ac_at_1']:.2f}",
                      f"{block['ac_at_3']:.2f}")
    table.add_row(styled("all", "bold"), str(summary["cases"]), str(summary["detected"]),
                  styled(f"{summary['ac_at_1']:.3f}", "bold"), styled(f"{summary['ac_at_3']:.3f}", "bold"))
    console.print(table)


def diagnose_incident(incident_id: str, as_json: bool = False, html: bool = False, out: Path | None = None,
                      ) -> None:
    """`vigil diagnose incident ID`: rank root causes of a stored incident and print the report."""
    from vigil.config import settings
    from vigil.diagnose.kg import KnowledgeGraph
    from vigil.diagnose.llm import LlmClient, diagnose
    from vigil.diagnose.memory import recall
    from vigil.diagnose.rca import analyze_incident
    from vigil.diagnose.report import render_html, render_markdown, report_data
    from vigil.store.sql import open_store, store_exists

    if not store_exists(settings().database_url()):
        raise VigilInputError(f"no incident {incident_id!r}: nothing is stored yet ({settings().database_url()})")
    store = open_store()
    incident = store.incident(incident_id)
    if incident is None:
        raise VigilInputError(f"no incident {incident_id!r} in the store; `vigil incidents` lists them")
    topology = store.topology()
    if topology is None:
        raise VigilInputError("the store holds no topology; run `vigil demo` or a collector first")
    slack = 900.0
    anomalies = store.anomalies(since=incident.start - slack, limit=100_000, ids=incident.anomalies)
    events = store.events(since=incident.start - slack, until=incident.end + slack, limit=100_000)
    logs = store.logs(since=incident.start - slack, until=incident.end + slack, limit=100_000)
    kg = KnowledgeGraph.build(topology)
    result = analyze_incident(kg, incident, anomalies, events, logs)
    diagnosis = diagnose(kg, incident, result, LlmClient.from_settings())
    diagnosis.similar = recall(store, incident, diagnosis)
    store.save_diagnosis(diagnosis)
    if as_json:
        text = json_text(report_data(incident, diagnosis, result), indent=2)
    elif html:
        text = render_html(incident, diagnosis, result)
    else:
        text = render_markdown(incident, diagnosis, result)
    if out is not None:
        write_out(out, text)
        SafeConsole(stderr=True).print(f"wrote {out}", markup=False)
    elif as_json:
        typer.echo(text)
    elif html:
        echo(text)
    else:
        SafeConsole().print(Markdown(text))

