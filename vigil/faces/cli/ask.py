"""`vigil ask "QUESTION"`: an answer from Vigil's own data, each fact cited by the tool result it came from."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from vigil.faces.cli.output import SafeConsole, json_text

console = SafeConsole()


def ask(
    question: Annotated[str, typer.Argument(help='e.g. "why did job j7 stop?", "is node n003 healthy?"')],
    llm: Annotated[bool, typer.Option("--llm/--no-llm", help="use the configured LLM endpoint if there is one")]
    = True,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Answer a question about the cluster from the store: the planner's flows (why did job J stop / hang /
    crash, is node N healthy, what changed before incident I, what should I do now, has this happened before,
    daily on-call summary),
    or the LLM endpoint in settings with the same read tools. Every fact carries its citation; proposed
    actions are checked against the whitelist and never executed."""
    from vigil.config import settings
    from vigil.diagnose.llm import LlmClient
    from vigil.faces.api.ask.agent import answer_question
    from vigil.faces.api.ask.planner import StepRecord
    from vigil.faces.api.ask.tools import Toolbox
    from vigil.faces.api.context import ServeContext
    from vigil.model import VigilInputError
    from vigil.store.metrics import MetricStore
    from vigil.store.sql import open_store, store_exists

    config = settings()
    if not question.strip():
        raise VigilInputError("the question is empty")
    if not store_exists(config.database_url()):
        raise VigilInputError(f"nothing stored under {config.home}: run `vigil demo` or `vigil serve` first")
    store = open_store(config)
    metrics_dir = config.home / "metrics"
    ctx = ServeContext(store=store, settings=config, metrics=MetricStore(metrics_dir) if metrics_dir.is_dir()
                       else None)

    def show_step(step: StepRecord) -> None:
        if as_json:
            return
        args = ", ".join(f"{k}={v!r}" for k, v in step.args.items())
        state = f"[yellow]skipped: {escape(step.skipped)}[/]" if step.skipped else "[green]ok[/]"
        console.print(f"[bold cyan]{escape(step.id)}[/] {escape(step.tool)}({escape(args)}) {state}")

    try:
        toolbox = Toolbox(ctx)
        client = LlmClient.from_settings(config) if llm else None
        answer, _ = answer_question(toolbox, question, client, on_step=show_step)
    finally:
        store.close()
    if as_json:
        typer.echo(json_text(answer.model_dump(mode="json"), indent=2))
        return
    console.print(f"\n[bold]Answer[/] ({escape(answer.flow or answer.answered_by)}):")
    for line in answer.answer:
        cites = ", ".join(f.cite for f in line.facts)
        console.print(f"  {escape(line.text)} [dim]\\[{escape(cites)}][/]", soft_wrap=True)
    for proposal in answer.proposals:
        verdict = "proposed, needs approval" if proposal.accepted else f"refused: {proposal.why}"
        console.print(f"  [bold]action[/] {escape(proposal.action)} {escape(proposal.target)}: {escape(verdict)}")
    if answer.note:
        console.print(f"[yellow]note:[/] {escape(answer.note)}")
