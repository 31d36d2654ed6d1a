"""`vigil checkpoint ls` / `restore-backup`: what checkpoints a job has, how big, and getting one back."""

from __future__ import annotations

import dataclasses
import signal
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from vigil.faces.cli.output import DataTable, SafeConsole, echo, json_text, styled
from vigil.model import VigilInputError

if TYPE_CHECKING:
    from vigil.checkpoint.evaluation import EvalRecord

app = typer.Typer(help="Checkpoints: list (with sizes), restore a backup, evaluate each new one.", no_args_is_help=True)
console = SafeConsole()


@app.command("ls")
def ls_command(
    directory: Annotated[Path, typer.Argument(help="a job's checkpoint directory")],
    as_json: Annotated[bool, typer.Option("--json", help="print the listing as JSON")] = False,
) -> None:
    """Every step directory: complete or not (a save cut short has no .metadata), size on disk, time."""
    from vigil.checkpoint.manager import describe_checkpoints

    if not directory.is_dir():
        raise VigilInputError(f"checkpoint directory {directory} "
                              f"{'is not a directory' if directory.exists() else 'does not exist'}")
    entries = describe_checkpoints(directory)
    if as_json:
        typer.echo(json_text(entries, indent=2))
        return
    table = DataTable(title=f"Checkpoints in {directory}")
    for column in ("step", "complete", "size MB", "files", "modified"):
        table.add_column(column, justify="right")
    for entry in entries:
        table.add_row(
            str(entry["step"]),
            "yes" if entry["complete"] else styled("no", "red"),
            f"{entry['bytes'] / 1e6:.1f}",
            str(entry["files"]),
            datetime.fromtimestamp(float(entry["mtime"])).strftime("%Y-%m-%d %H:%M:%S"),
        )
    total = sum(int(e["bytes"]) for e in entries)
    table.set_caption(f"{len(entries)} checkpoints, {total / 1e6:.1f} MB in all")
    console.print(table)


@app.command("restore-backup")
def restore_backup_command(
    url: Annotated[str, typer.Argument(help="fsspec URL the checkpoints were backed up to")],
    step: Annotated[int, typer.Argument(help="step to restore")],
    directory: Annotated[Path, typer.Argument(help="checkpoint directory to restore into")],
) -> None:
    """Copy a backed-up checkpoint into a job's checkpoint directory (e.g. on another cluster)."""
    from vigil.checkpoint.manager import restore_backup

    target = restore_backup(url, step, directory)
    console.print(f"restored step {step} into {target}", markup=False)


def _open_incident(job: str, record: EvalRecord) -> None:
    """An evaluation that failed (or a checkpoint that vanished unevaluated) is an incident, not silence."""
    from vigil.checkpoint.evaluation import failure_incident
    from vigil.store.sql import open_store

    incident = failure_incident(job, record)
    summary = incident.evidence[0].summary
    store = open_store()
    try:
        if store.incident(incident.id) is None:
            store.upsert_incident(incident)
    finally:
        store.close()
    console.print(f"[red]{escape(summary)}[/]")


@app.command("watch")
def watch_command(
    directory: Annotated[Path, typer.Argument(help="a job's checkpoint directory (step-<N>/ with .metadata)")],
    eval_command: Annotated[
        str, typer.Option("--eval", help="command run per checkpoint; {checkpoint} and {step} are filled in")
    ],
    max_parallel: Annotated[int, typer.Option("--max-parallel", min=1, help="evaluations at once")] = 1,
    devices: Annotated[
        str, typer.Option("--devices", help="comma-separated CUDA devices, one evaluation per device")
    ] = "",
    retries: Annotated[int, typer.Option("--retries", min=0, help="new attempts after a failed one")] = 1,
    timeout: Annotated[float | None, typer.Option("--timeout", help="seconds before an evaluation is stopped")] = None,
    logdir: Annotated[
        Path | None, typer.Option("--logdir", help="TensorBoard log directory; scalars go to <logdir>/eval")
    ] = None,
    job: Annotated[str | None, typer.Option("--job", help="job name for incidents (default: directory name)")] = None,
    interval: Annotated[float, typer.Option("--interval", min=0.05, help="seconds between polls")] = 5.0,
    once: Annotated[bool, typer.Option("--once", help="evaluate what is there now, wait for it, then exit")] = False,
) -> None:
    """Evaluate every new complete checkpoint asynchronously, exactly once, across watcher or eval crashes.

    The command's last stdout line, if a JSON object of numbers, becomes the step's scalars (TensorBoard and
    `vigil checkpoint evals`). A failed evaluation is retried, then opens an incident for the job.
    """
    from vigil.checkpoint.evaluation import CheckpointEvaluator, EvalConfig, parse_command
    from vigil.model import job_id

    name = job or directory.resolve().name
    job_id(name)  # a name that cannot be an entity id is refused before anything runs
    config = EvalConfig(
        command=parse_command(eval_command),
        max_parallel=max_parallel,
        devices=[d.strip() for d in devices.split(",") if d.strip()],
        retries=retries,
        timeout_s=timeout,
        logdir=logdir,
    )
    evaluator = CheckpointEvaluator(
        directory,
        config,
        on_failure=lambda record: _open_incident(name, record),
        on_done=lambda record: console.print(
            f"step {record.step}: " + ", ".join(f"{k}={v:.6g}" for k, v in sorted(record.metrics.items())),
            highlight=False,
            markup=False,
        ),
    )
    if not once:  # a watcher is silent until a checkpoint completes; say it started
        echo(f"watching {directory} every {interval:g} s for complete checkpoints (Ctrl-C stops)", err=True)
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: stopping.append(signum))
    try:
        evaluator.run(interval_s=interval, until_idle=once, stop=lambda: bool(stopping))
    except KeyboardInterrupt:
        pass
    finally:
        evaluator.close()


@app.command("evals")
def evals_command(
    directory: Annotated[Path, typer.Argument(help="a watched checkpoint directory")],
    as_json: Annotated[bool, typer.Option("--json", help="print the evaluations as JSON")] = False,
) -> None:
    """Every checkpoint's evaluation: state, attempts, scalars, and why it failed."""
    from vigil.checkpoint.evaluation import LEDGER_DIR, Ledger

    if not (directory / LEDGER_DIR / "ledger.sqlite").is_file():
        raise VigilInputError(f"{directory} has no evaluations (run `vigil checkpoint watch {directory}` first)")
    ledger = Ledger(directory)
    try:
        records = ledger.records()
    finally:
        ledger.close()
    if as_json:
        typer.echo(json_text([dataclasses.asdict(r) for r in records], indent=2))
        return
    table = DataTable(title=f"Checkpoint evaluations in {directory}")
    for column in ("step", "state", "attempts", "scalars", "message"):
        table.add_column(column, overflow="fold")
    for r in records:
        scalars = ", ".join(f"{k}={v:.4g}" for k, v in sorted(r.metrics.items()))
        table.add_row(str(r.step), r.state.value, str(r.attempts), scalars, r.message)
    console.print(table)


@app.command("clean")
def clean_command(
    directory: Annotated[Path, typer.Argument(help="one job's checkpoint directory (step-<N>/)")],
    keep_last: Annotated[int, typer.Option("--keep-last", min=1, help="complete checkpoints to keep")] = 3,
    partial_age: Annotated[
        float, typer.Option("--partial-age", min=0.0, help="seconds untouched before a partial save is orphaned")
    ] = 3600.0,
    job: Annotated[str | None, typer.Option("--job", help="job name (default: the directory's name)")] = None,
    execute: Annotated[bool, typer.Option("--execute", help="delete for real (default: dry-run)")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the audited actions as JSON")] = False,
) -> None:
    """Propose removing checkpoints beyond retention and orphaned partial saves, with du's sizes.

    Every removal is a delete_checkpoint action through the remediator: dry-run unless --execute, an audit
    record either way (`vigil remedy audit`), and the directory checked again right before it is deleted.
    """
    from vigil.checkpoint.cleanup import propose_cleanup
    from vigil.config import settings
    from vigil.model import job_id
    from vigil.remedy.actuators.checkpoint import CheckpointCleanupActuator
    from vigil.remedy.audit import AuditLog
    from vigil.remedy.lease import lease_of
    from vigil.remedy.remediator import Remediator

    name = job or directory.resolve().name
    job_id(name)  # a name that cannot be an entity id is refused before anything is proposed
    proposals = propose_cleanup(directory, keep_last, partial_age)
    remediator = Remediator([CheckpointCleanupActuator([directory])], AuditLog(), dry_run=not execute,
                            requested_by="vigil-cli", **lease_of(settings()))
    actions = [remediator.execute(p.action(name, keep_last, partial_age)) for p in proposals]
    if as_json:
        typer.echo(json_text([a.model_dump(mode="json") for a in actions], indent=2))
        return
    table = DataTable(title=f"Clean-up of {directory} ({'executed' if execute else 'dry-run'})")
    for column in ("step", "why", "size MB", "status", "result"):
        table.add_column(column, overflow="fold")
    for proposal, action in zip(proposals, actions, strict=True):
        table.add_row(str(proposal.step), proposal.reason, f"{proposal.bytes / 1e6:.1f}", action.status.value,
                      action.result)
    freed = sum(p.bytes for p, a in zip(proposals, actions, strict=True) if a.status.value == "executed")
    table.set_caption(f"{len(proposals)} proposals, {sum(p.bytes for p in proposals) / 1e6:.1f} MB; "
                      f"{freed / 1e6:.1f} MB freed" + ("" if execute else " (dry-run: run with --execute)"))
    console.print(table)
    if any(a.status.value in ("failed", "refused") for a in actions):
        raise typer.Exit(1)
