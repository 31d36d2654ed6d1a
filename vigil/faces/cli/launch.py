"""`vigil launch`: run a script as an N-rank job with the probe and the supervisor."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

console = Console(stderr=True)


def launch_command(
    script: Annotated[
        Path | None, typer.Argument(help="training script, run unchanged as every rank's __main__")
    ] = None,
    script_args: Annotated[
        list[str] | None, typer.Argument(help="arguments passed to the script (after --)")
    ] = None,
    nproc_per_node: Annotated[int, typer.Option("--nproc-per-node", help="number of ranks to start")] = 2,
    hang_timeout: Annotated[
        float, typer.Option("--hang-timeout", help="seconds without progress that make a hang")
    ] = 10.0,
    out: Annotated[
        Path, typer.Option("--out", help="run directory (diagnosis.json, rank logs, stacks, FR dumps)")
    ] = Path("vigil-run"),
    as_json: Annotated[bool, typer.Option("--json", help="print diagnosis.json on stdout")] = False,
    job: Annotated[
        Path | None,
        typer.Option("--job", help="TrainingJob spec (YAML): run it honouring failoverPolicy and healthCheck"),
    ] = None,
) -> None:
    """Start SCRIPT as an N-rank torch.distributed job; on a hang, crash or mismatch say who and why.

    Exit status: 0 ok or slow, 3 crash, 4 hang, 5 mismatch, 2 bad input.
    """
    if job is not None:
        from vigil.remedy.launch import launch_job_command

        launch_job_command(job, out, as_json)
    if script is None:
        from vigil.model import VigilInputError

        raise VigilInputError("give a training SCRIPT to launch, or --job job.yaml")
    from vigil.diagnose.hang_render import print_diagnosis
    from vigil.run.launcher import launch

    # A terminated launcher must not orphan its ranks: turn SIGTERM into an exit that runs launch's cleanup.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

    with console.status(f"running {script} on {nproc_per_node} rank(s)") as status:

        def on_event(message: str) -> None:
            console.log(message)
            status.update(message)

        diagnosis = launch(
            script,
            script_args or [],
            nproc=nproc_per_node,
            hang_timeout=hang_timeout,
            out_dir=out,
            on_event=on_event,
        )
    if as_json:
        typer.echo(diagnosis.model_dump_json(indent=2))
    else:
        print_diagnosis(diagnosis, Console())
        console.print(f"diagnosis written to {out / 'diagnosis.json'}")
    raise typer.Exit(diagnosis.exit_code)
