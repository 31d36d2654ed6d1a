"""The `vigil` command: one verb per user job. Each package owns its verbs; this file only mounts them."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.markup import escape

# Typer carries its own copy of click; its usage errors are what a mistyped option raises.
from typer._click import exceptions as click_exceptions

from vigil import __version__
from vigil.faces.cli import core as core_cli
from vigil.faces.cli.agent import agent
from vigil.faces.cli.ask import ask
from vigil.faces.cli.checkpoint import app as checkpoint_app
from vigil.faces.cli.detect import app as detect_app
from vigil.faces.cli.diagnose import app as diagnose_app
from vigil.faces.cli.du import du
from vigil.faces.cli.engine import engine
from vigil.faces.cli.launch import app as launch_app
from vigil.faces.cli.logs import app as logs_app
from vigil.faces.cli.output import SafeConsole
from vigil.faces.cli.precheck import inspect_command, precheck_command
from vigil.faces.cli.rca import kb_app, rca_app
from vigil.faces.cli.remedy import app as remedy_app
from vigil.faces.cli.runs import app as runs_app
from vigil.faces.cli.serve import mcp, serve
from vigil.faces.cli.stacks import stacks_command
from vigil.faces.cli.tide import app as tide_app
from vigil.faces.cli.timeline import timeline_command
from vigil.faces.cli.users import app as users_app
from vigil.faces.cli.waste import waste
from vigil.model import VigilInputError

app = typer.Typer(
    name="vigil",
    help="Vigil: observe, detect, localize, diagnose and remedy faults on AI training clusters.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    add_completion=False,
)
err_console = SafeConsole(stderr=True)


def _print_version(show: bool) -> None:
    if show:
        typer.echo(f"vigil {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_print_version, is_eager=True, help="print the version and exit")
    ] = False,
) -> None:
    """Vigil: observe, detect, localize, diagnose and remedy faults on AI training clusters."""


# the whole flow on the embedded default
app.command("demo")(core_cli.demo)
app.command("sim")(core_cli.sim)
app.command("incidents")(core_cli.incidents)
app.command("nodes")(core_cli.nodes)
# sources
app.command("agent")(agent)
app.add_typer(launch_app, name="launch")
# detection, localization, root cause
app.add_typer(detect_app, name="detect")
app.add_typer(logs_app, name="logs")
app.add_typer(diagnose_app, name="diagnose")
app.command("timeline")(timeline_command)
app.command("stacks")(stacks_command)
app.add_typer(kb_app, name="kb")
app.add_typer(rca_app, name="rca")
# remedy and prevention
app.add_typer(remedy_app, name="remedy")
app.command("precheck")(precheck_command)
app.command("inspect")(inspect_command)
app.add_typer(checkpoint_app, name="checkpoint")
app.command("du")(du)
app.command("waste")(waste)
app.add_typer(tide_app, name="tide")
app.add_typer(runs_app, name="runs")
# interfaces
app.command("serve")(serve)
app.command("engine")(engine)
app.command("mcp")(mcp)
app.command("ask")(ask)
app.add_typer(users_app, name="users")


def main() -> None:
    """Console entry point: user mistakes - a bad option as much as bad data - get one clear line and exit
    status 2, not a traceback or a boxed usage page."""
    command = typer.main.get_command(app)
    try:
        code = command.main(prog_name="vigil", standalone_mode=False)
    except click_exceptions.NoArgsIsHelpError as err:
        err.show()
        sys.exit(2)
    except click_exceptions.UsageError as err:
        where = f" (see: {err.ctx.command_path} --help)" if err.ctx is not None else ""
        _error(f"{err.format_message()}{where}")
        sys.exit(2)
    except click_exceptions.ClickException as err:
        _error(err.format_message())
        sys.exit(err.exit_code)
    except VigilInputError as err:
        _error(str(err))
        sys.exit(2)
    except typer.Abort:
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


def _error(message: str) -> None:
    err_console.print(f"[bold red]error:[/] {escape(' '.join(message.split()))}", highlight=False, soft_wrap=True)


if __name__ == "__main__":
    main()
