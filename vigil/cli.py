"""The `vigil` command: one verb per user job."""

from __future__ import annotations

import sys

import typer
from rich.console import Console

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


# --- verbs: each package registers its own commands here, one line each -------------------------
from vigil.diagnose.rca_cli import kb_app as _kb  # noqa: E402
from vigil.diagnose.rca_cli import rca_app as _rca  # noqa: E402

app.add_typer(_kb, name="kb")
app.add_typer(_rca, name="rca")
from vigil.precheck.cli import inspect_command as _inspect  # noqa: E402
from vigil.precheck.cli import precheck_command as _precheck  # noqa: E402

app.command("precheck")(_precheck)
app.command("inspect")(_inspect)
from vigil.remedy.cli import app as _remedy  # noqa: E402

app.add_typer(_remedy, name="remedy")
from vigil.checkpoint.cli import app as _checkpoint  # noqa: E402

app.add_typer(_checkpoint, name="checkpoint")
from vigil.logs.cli import app as _logs  # noqa: E402

app.add_typer(_logs, name="logs")
from vigil import core_cli as _core  # noqa: E402

app.command("demo")(_core.demo)
app.command("sim")(_core.sim)
app.command("incidents")(_core.incidents)
app.command("nodes")(_core.nodes)
app.command("bench")(_core.bench)
from vigil.serve.cli import mcp as _mcp, serve as _serve  # noqa: E402

app.command("serve")(_serve)
app.command("mcp")(_mcp)
from vigil.diagnose.cli import diagnose_command as _diagnose  # noqa: E402
from vigil.probe.cli import launch_command as _launch  # noqa: E402

app.command("launch")(_launch)
app.command("diagnose")(_diagnose)
from vigil.collect.cli import agent as _agent  # noqa: E402

app.command("agent")(_agent)
from vigil.detect.cli import app as _detect  # noqa: E402

app.add_typer(_detect, name="detect")


def main() -> None:
    """Console entry point: user mistakes get one clear line, not a traceback."""
    try:
        app()
    except VigilInputError as err:
        err_console.print(f"[bold red]error:[/] {err}", highlight=False, soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
