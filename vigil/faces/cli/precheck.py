"""`vigil precheck` and `vigil inspect`: tell good machines from bad ones before and during jobs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.text import Text

from vigil.faces.cli.output import DataTable, SafeConsole, json_text, styled
from vigil.model import VigilInputError

if TYPE_CHECKING:
    from vigil.precheck.baseline import MachineVerdict

EXIT_NO_BASELINE = 3  # "unknown" to node-problem-detector's custom plugins and to Nagios-style checks
console = SafeConsole()
err_console = SafeConsole(stderr=True)


def _baseline_path(path: Path | None) -> Path:
    from vigil.config import settings

    return path or settings().home / "precheck-baselines.json"


def _round(nproc: int, baseline_file: Path, tolerance: float, record: bool, quick: bool) -> list[MachineVerdict]:
    from vigil.precheck.baseline import Baselines, hardware_key, verdicts
    from vigil.precheck.runner import CheckOptions, run_local

    options = CheckOptions(allreduce_mb=2.0, memcpy_mb=16.0, matmul_n=256, repeats=3) if quick else CheckOptions()
    baselines = Baselines.load(baseline_file)  # a bad baseline file is refused before the checks run
    with err_console.status(f"PreCheck: all-reduce, memory copy, matmul, NVML on {nproc} ranks"):
        per_rank = run_local(nproc, options)
    key = hardware_key(nproc)
    if record:
        baselines.record(key, [r for _, results in per_rank for r in results])
        baselines.save()
        err_console.print(f"baseline for [bold]{escape(key)}[/] written to {escape(str(baseline_file))}")
    elif key not in baselines.entries:
        err_console.print(f"[yellow]no baseline for {escape(key)} in {escape(str(baseline_file))}: the performance "
                          "checks were measured but not judged; record one on known-good hardware with "
                          "`vigil precheck --record-baseline`[/]")
    return verdicts(per_rank, baselines.entries.get(key, {}), tolerance)


def _as_json(machines: list[MachineVerdict]) -> list[dict[str, Any]]:
    return [machine.to_dict() for machine in machines]


def _print(machines: list[MachineVerdict]) -> None:
    from vigil.precheck.baseline import Verdict

    table = DataTable(title="PreCheck")
    for column in ("machine", "check", "value", "baseline", "result"):
        table.add_column(column)
    for machine in machines:
        for check in machine.checks:
            value = "-" if check.value is None else f"{check.value:.3g} {check.unit}"
            baseline = "-" if check.baseline is None else f"{check.baseline:.3g}"
            result = "skipped" if check.skipped else ("ok" if check.ok else styled("FAIL", "red"))
            table.add_row(machine.host, check.name, value, baseline, Text.assemble(result, f" {check.detail}"))
        style = {Verdict.GOOD: "green", Verdict.NO_BASELINE: "yellow"}.get(machine.verdict, "bold red")
        table.add_row(styled(f"{machine.host}: {machine.verdict}", style), ", ".join(machine.failing), "", "", "")
    console.print(table)


def _check_tolerance(tolerance: float) -> None:
    if not 0 <= tolerance < 1:
        raise VigilInputError(f"--tolerance must be in [0, 1), got {tolerance}")


def precheck_command(
    nproc: Annotated[int, typer.Option("--nproc", help="ranks to start (a gloo group on this machine)")] = 2,
    baseline: Annotated[Path | None, typer.Option("--baseline", help="baseline file (JSON)")] = None,
    record_baseline: Annotated[
        bool, typer.Option("--record-baseline", help="store these results as the baseline for this hardware")
    ] = False,
    tolerance: Annotated[float, typer.Option("--tolerance", help="allowed shortfall against the baseline")] = 0.5,
    quick: Annotated[bool, typer.Option("--quick", help="smaller sizes: a few seconds instead of ~10")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the verdicts as JSON")] = False,
) -> None:
    """Measure all-reduce bandwidth / latency, copy bandwidth, matmul throughput and NVML health.

    Each machine gets a good / bad verdict against the stored baseline for its hardware type, naming
    the failing checks, or "no baseline" when there was none to compare with. Exit status: 0 all good,
    1 some machine bad, 2 bad input, 3 no baseline for this hardware (nothing failed, nothing judged:
    NVML health still decides; record one with --record-baseline).
    """
    _check_tolerance(tolerance)
    machines = _round(nproc, _baseline_path(baseline), tolerance, record_baseline, quick)
    if as_json:
        typer.echo(json_text(_as_json(machines), indent=2))
    else:
        _print(machines)
    raise typer.Exit(exit_status(machines))


def exit_status(machines: list[MachineVerdict]) -> int:
    """0 all good, 1 a machine is bad, 3 not judged for want of a baseline: neither pass nor fail."""
    from vigil.precheck.baseline import Verdict

    if any(m.verdict is Verdict.BAD for m in machines):
        return 1
    if any(m.verdict is Verdict.NO_BASELINE for m in machines):
        return EXIT_NO_BASELINE
    return 0


def inspect_command(
    interval: Annotated[float, typer.Option("--interval", help="seconds between inspection rounds")] = 3600.0,
    count: Annotated[int, typer.Option("--count", help="rounds to run (0 = until interrupted)")] = 0,
    nproc: Annotated[int, typer.Option("--nproc", help="ranks per round")] = 2,
    baseline: Annotated[Path | None, typer.Option("--baseline", help="baseline file (JSON)")] = None,
    tolerance: Annotated[float, typer.Option("--tolerance", help="allowed shortfall against the baseline")] = 0.5,
    out: Annotated[Path | None, typer.Option("--out", help="append each round's verdicts here (JSON lines)")] = None,
    anomalies: Annotated[
        Path | None,
        typer.Option("--anomalies", help="append an Anomaly per bad machine here (input of `vigil remedy apply`)"),
    ] = None,
    quick: Annotated[bool, typer.Option("--quick", help="smaller sizes per round")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON line per round on stdout")] = False,
) -> None:
    """Periodic inspection: run PreCheck every --interval seconds and report machines that turned bad."""
    if interval <= 0:
        raise VigilInputError(f"--interval must be positive, got {interval}")
    for path, option in ((out, "--out"), (anomalies, "--anomalies")):
        if path is not None and path.is_dir():  # refused before a round is spent, not after it
            raise VigilInputError(f"{option} {path} is a directory; expected a file to append JSON lines to")
    _check_tolerance(tolerance)
    from vigil.precheck.baseline import Verdict

    done = 0
    next_round = time.monotonic()
    while True:
        machines = _round(nproc, _baseline_path(baseline), tolerance, False, quick)
        line = json_text({"round": done, "ts": time.time(), "machines": _as_json(machines)})
        if out is not None:
            _append(out, [line], "--out")
        if anomalies is not None:
            found = [a for a in (m.to_anomaly(time.time()) for m in machines) if a is not None]
            _append(anomalies, [a.to_json() for a in found], "--anomalies")
        bad = [f"{m.host} ({', '.join(m.failing)})" for m in machines if m.verdict is Verdict.BAD]
        unjudged = [m.host for m in machines if m.verdict is Verdict.NO_BASELINE]
        if as_json:
            typer.echo(line)
        elif bad:
            err_console.print(f"round {done}: [bold red]bad: {escape('; '.join(bad))}[/]")
        elif unjudged:
            err_console.print(f"round {done}: [yellow]no baseline: {escape(', '.join(unjudged))}[/]")
        else:
            err_console.print(f"round {done}: [green]all good[/]")
        done += 1
        if count and done >= count:
            break
        next_round += interval
        time.sleep(max(0.0, next_round - time.monotonic()))


def _append(path: Path, lines: list[str], option: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as stream:
            stream.writelines(line + "\n" for line in lines)
    except OSError as err:
        raise VigilInputError(f"{option} {path}: cannot append there ({err.strerror or err})") from None
