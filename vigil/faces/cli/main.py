"""The `vigil` command: one verb per user job. Each package owns its verbs; this file only mounts them."""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from vigil.faces.cli import core as core_cli
from vigil.faces.cli.agent import agent
from vigil.faces.cli.checkpoint import app as checkpoint_app
from vigil.faces.cli.detect import app as detect_app
from vigil.faces.cli.diagnose import diagnose_command
from vigil.faces.cli.du import du
from vigil.faces.cli.engine import engine
from vigil.faces.cli.launch import launch_command
from vigil.faces.cli.logs import app as logs_app
from vigil.faces.cli.precheck import inspect_command, precheck_command
from vigil.faces.cli.rca import kb_app, rca_app
from vigil.faces.cli.remedy import app as remedy_app
from vigil.faces.cli.serve import mcp, serve
from vigil.faces.cli.timeline import timeline_command
from vigil.model import VigilInputError

app = typer.Typer(
    name="vigil",
    help="Vigil: observe, detect, localize, diagnose and remedy faults on AI training clusters.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    add_completion=False,
)
err_console = Console(stderr=True)


@app.callback()
def _root() -> None:
    """Vigil: observe, detect, localize, diagnose and remedy faults on AI training clusters."""


# the whole flow on the embedded default
app.command("demo")(core_cli.demo)
app.command("sim")(core_cli.sim)
app.command("incidents")(core_cli.incidents)
app.command("nodes")(core_cli.nodes)
# sources
app.command("agent")(agent)
app.command("launch")(launch_command)
# detection, localization, root cause
app.add_typer(detect_app, name="detect")
app.add_typer(logs_app, name="logs")
app.command("diagnose")(diagnose_command)
app.command("timeline")(timeline_command)
app.add_typer(kb_app, name="kb")
app.add_typer(rca_app, name="rca")
# remedy and prevention
app.add_typer(remedy_app, name="remedy")
app.command("precheck")(precheck_command)
app.command("inspect")(inspect_command)
app.add_typer(checkpoint_app, name="checkpoint")
app.command("du")(du)
# interfaces
app.command("serve")(serve)
app.command("engine")(engine)
app.command("mcp")(mcp)


def main() -> None:
    """Console entry point: user mistakes get one clear line, not a traceback."""
    try:
        app()
    except VigilInputError as err:
        err_console.print(f"[bold red]error:[/] {err}", highlight=False, soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
