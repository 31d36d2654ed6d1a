"""`vigil stacks RUN_DIR...`: the periodic stacks of runs clustered across ranks, and machines that are the
outliers in every job they ran."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from vigil.faces.cli.output import DataTable, SafeConsole, json_text


def stacks_command(
    run_dirs: Annotated[list[Path], typer.Argument(help="run directories of `vigil launch` (one per job)")],
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON on stdout")] = False,
) -> None:
    """Cluster each run's periodic py-spy sweeps by stack signature; flag machines whose ranks are the
    outliers in every multi-machine job they ran (a bad machine shows in every job)."""
    from vigil.diagnose.stack_clusters import job_stacks, machine_findings

    jobs = [job_stacks(run_dir) for run_dir in run_dirs]
    machines = machine_findings(jobs)
    if as_json:
        typer.echo(json_text({"jobs": [j.to_dict() for j in jobs], "machines": [m.to_dict() for m in machines]},
                              indent=2))
        return
    console = SafeConsole()
    for job in jobs:
        table = DataTable("ranks", "innermost frame", "outlier in sweeps",
                          title=f"{job.run_dir}: {job.sweeps} sweep(s), latest clusters",
                          caption=None if job.sweeps else "no stack sweeps recorded: sweeps start once the job "
                          "has stepped, every --stack-period seconds of `vigil launch`, and need py-spy")
        for cluster in job.latest:
            counts = ", ".join(f"{r}: {job.outlier_counts.get(r, 0)}" for r in cluster.ranks)
            table.add_row(str(cluster.ranks), cluster.top, counts)
        console.print(table)
    if machines:
        table = DataTable("host", "jobs", "outlier in", "flagged", title="machines across jobs")
        for machine in machines:
            table.add_row(machine.host, str(machine.jobs), str(machine.outlier_jobs), "yes" if machine.flagged else "")
        console.print(table)
