"""`vigil agent`: the per-node collector (a DaemonSet on Kubernetes, a systemd unit elsewhere)."""

from __future__ import annotations

import logging
import signal
from typing import Annotated, Any

import typer
from rich.markup import escape

from vigil.faces.cli.listen import ensure_port_free
from vigil.faces.cli.output import DataTable, SafeConsole, SafeFormatter, json_text, styled
from vigil.model import VigilInputError, describe_validation_error

console = SafeConsole()


def agent(
    once: Annotated[bool, typer.Option("--once", help="read every source once, print, exit")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the --once report as JSON")] = False,
    interval: Annotated[float | None, typer.Option("--interval", help="one interval (s) for every source")] = None,
    port: Annotated[
        int | None, typer.Option("--port", min=0, max=65535, help="Prometheus /metrics port (0 = off)")
    ] = None,
    dcgm_url: Annotated[str | None, typer.Option("--dcgm-url", help="dcgm-exporter page ('' = off)")] = None,
    server: Annotated[str | None, typer.Option("--server", help="Vigil server URL to push events to")] = None,
    kmsg_file: Annotated[str | None, typer.Option("--kmsg-file", help="kernel log file instead of /dev/kmsg")] = None,
    store: Annotated[str | None, typer.Option("--store", help="keep a local history (tiered retention) here")] = None,
    state_dir: Annotated[str | None, typer.Option(
        "--state-dir", help="keep the events not yet sent here, sent first on the next start (default "
        "/var/lib/vigil-agent; '' = in memory only)")] = None,
    duration: Annotated[float | None, typer.Option("--duration", help="stop after this many seconds")] = None,
    rank_logs: Annotated[str | None, typer.Option(
        "--rank-logs", help="forward training ranks' log files matching this glob (quote it), e.g. "
        "'/var/log/train/*/rank-*.log'; several layouts: VIGIL_AGENT_RANK_LOGS (JSON list)")] = None,
    rank_log_pattern: Annotated[str | None, typer.Option(
        "--rank-log-pattern", help="regular expression naming the rank (and job) in a --rank-logs file's path: "
        "groups (?P<rank>...) and (?P<job>...)")] = None,
    rank_log_job: Annotated[str | None, typer.Option(
        "--rank-log-job", help="the job id of every --rank-logs file, when the path does not name it")] = None,
    rank_offset: Annotated[int, typer.Option(
        "--rank-offset", min=0, help="added to the rank a --rank-logs path names (torchrun's local ranks)")] = 0,
) -> None:
    """Collect GPU (NVML, dcgm-exporter), kernel Xid, host, InfiniBand and Kubernetes facts on this node, and
    forward its training ranks' log lines (--rank-logs) to the server."""
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    from vigil.sources.collect.agent import Agent, AgentSettings, build_sources

    overrides: dict[str, Any] = {
        k: v
        for k, v in {
            "port": port,
            "dcgm_url": dcgm_url,
            "server_url": server,
            "kmsg_file": kmsg_file,
            "store": store,
            "state_dir": state_dir,
        }.items()
        if v is not None
    }
    if rank_logs is not None:
        layout = {"glob": rank_logs, "pattern": rank_log_pattern or "", "job": rank_log_job or "",
                  "rank_offset": rank_offset}
        overrides["rank_logs"] = [layout]  # in place of VIGIL_AGENT_RANK_LOGS, as every flag overrides its variable
    elif rank_log_pattern is not None or rank_log_job is not None or rank_offset:
        raise VigilInputError("--rank-log-pattern, --rank-log-job and --rank-offset describe the files of "
                              "--rank-logs GLOB; give --rank-logs too")
    if once:
        overrides["state_dir"] = ""  # one read, no push: the spool is the running agent's
    try:
        settings = AgentSettings(**overrides)
    except ValidationError as err:
        raise VigilInputError(f"agent settings: {describe_validation_error(err)}") from None
    except SettingsError as err:
        raise VigilInputError(f"agent settings: {err} (VIGIL_AGENT_* values of lists and mappings are JSON)") from None
    if interval is not None:
        if interval <= 0:
            raise VigilInputError(f"--interval must be a positive number of seconds, not {interval}")
        settings.intervals = dict.fromkeys(settings.intervals, interval)
    handler = logging.StreamHandler()
    handler.setFormatter(SafeFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    if settings.port and not once:
        ensure_port_free("0.0.0.0", settings.port, "--port")
    agent_ = Agent(build_sources(settings), settings)
    if once:
        agent_.collect_once()
        agent_.record(0.0)
        report = agent_.report()
        agent_.close()
        if as_json:
            typer.echo(json_text(report, indent=2))
        else:
            _print_report(report)
        return
    if settings.port:
        _server, bound = agent_.serve()
        console.print(f"vigil agent on node {agent_.node}: Prometheus metrics at http://0.0.0.0:{bound}/metrics",
                      markup=False)
    signal.signal(signal.SIGTERM, lambda *_: agent_.stop_event.set())
    try:
        agent_.run(duration_s=duration)
    except KeyboardInterrupt:
        pass
    finally:
        agent_.close()


def _print_report(report: dict[str, Any]) -> None:
    table = DataTable(title=f"vigil agent on node {report['node']}")
    for column in ("source", "kind", "up", "points", "ms", "status", "problems"):
        table.add_column(column)
    for source in report["sources"]:
        problems = ", ".join(f"{k}: {v}" for k, v in source["problems"].items())
        table.add_row(
            source["name"],
            source["kind"],
            "yes" if source["up"] else styled("no", "red"),
            str(source["points"]),
            f"{source['duration_ms']:.0f}",
            source["status"],
            problems,
        )
    console.print(table)
    gpu = next((s for s in report["sources"] if s["name"] == "nvml"), None)
    if gpu is not None and gpu["status"].startswith("no GPU"):
        console.print(
            f"[yellow]{escape(gpu['status'])}[/]: GPU metrics come from dcgm-exporter if it runs; the rest is "
            "collected as usual."
        )
    events = ", ".join(f"{k}: {v}" for k, v in report["events"].items()) or "none"
    console.print(f"events: {events}", markup=False)

