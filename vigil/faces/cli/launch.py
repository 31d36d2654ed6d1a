"""`vigil launch script` and `vigil launch job`: run a training job under the probe and the supervisor.

Every launch writes into a run directory of its own, so no launch can overwrite the evidence of an
earlier one: ``--out DIR`` must be new (or empty), and without it each launch gets
``vigil-runs/<time>-<name>/`` and ``vigil-runs/latest`` points at it.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from vigil.faces.cli.output import SafeConsole
from vigil.model import VigilInputError
from vigil.sources.probe.records import DEFAULT_HANG_TIMEOUT_S

app = typer.Typer(
    help="Run a training job under the probe: a script on N local ranks, or a TrainingJob spec.",
    no_args_is_help=True,
)
console = SafeConsole(stderr=True, log_path=False)  # progress lines name the job's events, not this file
RUNS_ROOT = Path("vigil-runs")
LATEST = "latest"

OutOption = Annotated[
    Path | None,
    typer.Option("--out", help="new run directory (default: a fresh one under vigil-runs/, linked as latest)"),
]
JsonOption = Annotated[bool, typer.Option("--json", help="print the result as JSON on stdout")]


def new_run_dir(out: Path | None, name: str, root: Path = RUNS_ROOT) -> Path:
    """A run directory nobody has written to: ``out`` when it is new or empty, else refused; without ``out``
    a fresh ``root/<time>-<name>`` (created exclusively, so two launches in the same second differ) with
    ``root/latest`` moved to it."""
    if out is not None:
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise VigilInputError(
                f"--out {out} already holds {'a file' if not out.is_dir() else 'files'}; every launch needs a new "
                "run directory (omit --out for a fresh one under vigil-runs/)"
            )
        out.mkdir(parents=True, exist_ok=True)
        return out
    if root.exists() and not root.is_dir():
        raise VigilInputError(f"{root} is a file; run directories go under it")
    root.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for attempt in range(1000):
        run = root / (f"{stamp}-{name}" if attempt == 0 else f"{stamp}-{name}-{attempt}")
        try:
            run.mkdir()
        except FileExistsError:
            continue
        link = root / f".{LATEST}.{os.getpid()}"
        link.unlink(missing_ok=True)
        link.symlink_to(run.name)
        link.replace(root / LATEST)  # atomic: readers see the old run or the new one, never no link
        return run
    raise VigilInputError(f"{root}: no free run directory name for {stamp}-{name}")


def _positive_seconds(value: float, option: str) -> float:
    if not math.isfinite(value) or value <= 0:
        raise VigilInputError(f"{option} must be a positive number of seconds, not {value}")
    return value


@app.command("script")
def script_command(
    script: Annotated[Path, typer.Argument(help="training script, run unchanged as every rank's __main__")],
    script_args: Annotated[
        list[str] | None, typer.Argument(help="arguments passed to the script (after --)")
    ] = None,
    nproc_per_node: Annotated[int, typer.Option("--nproc-per-node", min=1, help="number of ranks to start")] = 2,
    hang_timeout: Annotated[
        float, typer.Option("--hang-timeout", help="seconds without progress that make a hang, at least (a job "
                            "with slower steps or collectives gets 4x its slowest recent one)")
    ] = DEFAULT_HANG_TIMEOUT_S,
    out: OutOption = None,
    as_json: JsonOption = False,
    nnodes: Annotated[int, typer.Option("--nnodes", min=1, help="nodes in the job (run this on each)")] = 1,
    node_rank: Annotated[int, typer.Option("--node-rank", min=0, help="this node's rank, 0 .. nnodes-1")] = 0,
    master_addr: Annotated[str, typer.Option("--master-addr", help="node 0's address (rendezvous)")] = "127.0.0.1",
    master_port: Annotated[
        int | None, typer.Option("--master-port", help="rendezvous port on node 0 (needed with --nnodes > 1)")
    ] = None,
    server: Annotated[
        str | None,
        typer.Option("--server", help="Vigil server to report placement, telemetry and verdict to "
                     "(default: the server_url setting, VIGIL_SERVER_URL)"),
    ] = None,
    job: Annotated[
        str | None, typer.Option("--job", help="job name on the server (default: the run directory's name)")
    ] = None,
    startup_grace: Annotated[
        float, typer.Option("--startup-grace", help="seconds of silence allowed before the first step (warm-up)")
    ] = 60.0,
    stack_period: Annotated[
        float, typer.Option("--stack-period", help="seconds between py-spy sweeps of every rank (0: off)")
    ] = 300.0,
) -> None:
    """Start SCRIPT as an N-rank torch.distributed job; on a hang, crash or mismatch say who and why.

    Several nodes: run it on every node with --nnodes, --node-rank, --master-addr, --master-port and the
    same --out, a directory every node can write; every node prints the same verdict.

    Exit status (the same as vigil diagnose run): 0 ok or slow, 3 crash, 4 hang, 5 mismatch, 2 bad input.
    """
    from vigil.diagnose.hang_render import print_diagnosis
    from vigil.run.launcher import launch

    _positive_seconds(hang_timeout, "--hang-timeout")
    _positive_seconds(startup_grace, "--startup-grace")
    if not script.is_file():
        raise VigilInputError(f"training script {script} does not exist")
    if nnodes > 1:
        if out is None:
            raise VigilInputError("several nodes share one run directory: give --out")
        # Shared by the nodes, so the others may have written there already.
        run_dir = out
        run_dir.mkdir(parents=True, exist_ok=True)
    else:
        run_dir = new_run_dir(out, script.stem)
    reporter = _reporter(server, job or run_dir.resolve().name, nproc_per_node * nnodes, nproc_per_node, run_dir,
                         node_rank)
    # A terminated launcher must not orphan its ranks: turn SIGTERM into an exit that runs launch's cleanup.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

    with console.status(f"running {escape(str(script))} on {nproc_per_node} rank(s)") as status:

        def on_event(message: str) -> None:
            console.log(message, markup=False)
            status.update(escape(message))

        diagnosis = launch(
            script,
            script_args or [],
            nproc=nproc_per_node,
            hang_timeout=hang_timeout,
            out_dir=run_dir,
            on_event=on_event,
            nnodes=nnodes,
            node_rank=node_rank,
            master_addr=master_addr,
            master_port=master_port,
            reporter=reporter,
            startup_grace=startup_grace,
            stack_period=stack_period,
        )
    if as_json:
        typer.echo(diagnosis.model_dump_json(indent=2))
    else:
        print_diagnosis(diagnosis, SafeConsole())
        console.print(f"diagnosis written to {run_dir / 'diagnosis.json'}", highlight=False, markup=False)
    raise typer.Exit(diagnosis.exit_code)


def _reporter(server: str | None, job: str, world: int, nproc: int, run_dir: Path, node_rank: int) -> Any:
    """The server reporter when a server is named (flag, else settings); None otherwise."""
    from vigil.config import settings
    from vigil.model import LaunchReport
    from vigil.run.report import LaunchReporter

    config = settings()
    url = server if server is not None else config.server_url
    if not url:
        return None
    if not url.startswith(("http://", "https://")):
        raise VigilInputError(f"--server {url!r}: expected an http:// or https:// URL")
    try:
        LaunchReport(job=job, ts=0.0, world_size=world)
    except ValueError:
        raise VigilInputError(f"--job {job!r}: expected letters, digits and . _ : - (starting with a letter or "
                              "digit)") from None
    return LaunchReporter(url, job, world, nproc, run_dir.resolve(), token=config.server_token or config.api_token,
                          node_rank=node_rank, interval_s=config.report_interval_s,
                          warn=lambda message: console.print(message, highlight=False, markup=False))


@app.command("job")
def job_command(
    spec: Annotated[Path, typer.Argument(help="TrainingJob spec (YAML) with failoverPolicy and healthCheck")],
    out: OutOption = None,
    as_json: JsonOption = False,
) -> None:
    """Run a TrainingJob spec on local ranks, honouring its failoverPolicy and healthCheck.

    Exit status: 0 the job finished, 3 it failed for good, 2 bad input.
    """
    from vigil.remedy.jobspec import load_jobspec
    from vigil.run.failover import print_report, report_json, run_job

    if spec.is_dir():
        raise VigilInputError(f"job spec {spec} is a directory; expected a TrainingJob YAML file")
    job = load_jobspec(spec)
    program = job.spec.command[0]
    if program not in ("python", "python3") and shutil.which(program) is None:
        raise VigilInputError(f"job spec {spec}: command {program!r} is not an executable on PATH")
    run_dir = new_run_dir(out, job.name)
    report = run_job(spec, run_dir, console=console)
    if as_json:
        typer.echo(report_json(report))
    else:
        print_report(report, SafeConsole())
    raise typer.Exit(0 if report.succeeded else 3)
