"""`vigil serve` and `vigil mcp`: heavy imports (FastAPI, uvicorn, the MCP SDK) stay inside the commands."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from vigil.faces.cli.core import is_demo_store
from vigil.faces.cli.listen import ensure_port_free, warn_if_open
from vigil.faces.cli.stopping import STOPPED_AT_ONCE, closed_at_exit, run_stoppable
from vigil.model import VigilInputError

if TYPE_CHECKING:
    from vigil.faces.api.auth import Authenticator
    from vigil.faces.api.context import ServeContext
    from vigil.remedy.remediator import Remediator
    from vigil.run.engine import Engine

ConfigOpt = Annotated[Path | None, typer.Option("--config", help="settings YAML file (else VIGIL_* env)")]
MetricsOpt = Annotated[
    Path | None,
    typer.Option("--metrics-dir", help="embedded metric store directory (default: <home>/metrics if present)"),
]
LaunchOpt = Annotated[
    list[Path] | None,
    typer.Option("--launch-dir", help="directory holding `vigil launch` runs (DIR/diagnosis.json); repeatable"),
]


def _context(
    config: Path | None, metrics_dir: Path | None, launch_dirs: list[Path] | None, actuator: str | None = "none"
) -> ServeContext:
    """The server's context; ``actuator`` None takes the setting ``remedy_backend``."""
    from vigil.config import load_settings
    from vigil.faces.api.context import ServeContext
    from vigil.model import Topology
    from vigil.remedy.acting import chosen_actuator, remediator_for
    from vigil.remedy.lifecycle import LifecycleStore
    from vigil.sources.promql import PromQLSource
    from vigil.store.metrics import MetricStore
    from vigil.store.sql import open_store

    settings = load_settings(config)
    backend = chosen_actuator(actuator, settings)
    store = open_store(settings)
    metrics_path = metrics_dir if metrics_dir is not None else settings.home / "metrics"
    if metrics_dir is not None and not metrics_path.is_dir():
        raise VigilInputError(f"--metrics-dir {metrics_path}: not a directory")
    metrics = MetricStore(metrics_path) if metrics_path.is_dir() else None
    prom = PromQLSource(settings.metrics_url) if settings.metrics_url else None
    for launch in launch_dirs or []:
        if not launch.is_dir():
            raise VigilInputError(f"--launch-dir {launch}: not a directory")
    lifecycle = LifecycleStore(settings.database_url())
    remediator = remediator_for(backend, settings, store.topology() or Topology(), lifecycle, "vigil-api")
    return ServeContext(
        store=store,
        settings=settings,
        metrics=metrics,
        prom=prom,
        launch_dirs=list(launch_dirs or []),
        lifecycle=lifecycle,
        remediator=_resumed(remediator),
        backend=backend,
    )


def _resumed(remediator: Remediator | None) -> Remediator | None:
    """The remediator approved actions run through, once it has resumed the actions a previous server was
    executing when it died (their lease lapsed) - before new ones are accepted. One that executes nothing (no back
    end, or execute_actions off) resumes nothing. Ctrl-C or SIGTERM meanwhile lets the action in flight finish and
    claims no further run, then ends the command, exit 0, before it serves; a second Ctrl-C ends it at once, exit 130
    (``run_stoppable``)."""
    if remediator is not None and not remediator.dry_run:
        stop = threading.Event()
        run_stoppable(lambda: remediator.recover(stop=stop), stop, who="vigil serve", bound_s=remediator.lease_s,
                      waiting=f"waiting for the action it is resuming at start-up, at most {remediator.lease_s:g} s",
                      left="before serving; an action it was resuming is taken over by another server or engine once "
                      "this process's lease on it lapses")
        if stop.is_set():
            raise typer.Exit(0)
    return remediator


def live_engine(ctx: ServeContext) -> Engine:
    """The engine `vigil serve` runs in its process, with the server's remediator (the configured back end;
    dry-run while execute_actions is off)."""
    from vigil.run.engine import Engine

    live = Engine(ctx.store, ctx.settings, prom=ctx.prom, remediator=ctx.remediator)
    live.stand_by_on_loss = True  # the server serves on: its engine stands by again, to take over later
    return live


def serve(
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="TCP port")] = 8080,
    config: ConfigOpt = None,
    metrics_dir: MetricsOpt = None,
    launch_dir: LaunchOpt = None,
    actuator: Annotated[
        str | None,
        typer.Option(help="none, kubernetes or slurm: what runs approved actions when execute_actions is on "
                     "(off, every action stays a dry-run). Default: the setting remedy_backend "
                     "(VIGIL_REMEDY_BACKEND, or remedy_backend: in the --config file), else none"),
    ] = None,
    engine: Annotated[
        bool | None,
        typer.Option("--engine/--no-engine", help="run the live engine in this process (off: `vigil engine`); "
                     "default: on, except on a store `vigil demo` wrote"),
    ] = None,
) -> None:
    """Run the REST API (OpenAPI at /docs), the web dashboard, /metrics, the Alertmanager webhook and the engine."""
    from vigil.remedy.acting import check_actuator

    if actuator is not None:
        check_actuator(actuator)
    ensure_port_free(host, port, "--port")
    ctx = _context(config, metrics_dir, launch_dir, actuator)
    if engine is None:
        engine = not is_demo_store(ctx.settings)
        if not engine:
            typer.echo("the store is a `vigil demo` run, so the live engine is off: its incidents are judged on "
                       "simulated time, and re-reading its events would open them again (--engine runs it anyway)",
                       err=True)
    # without an engine no recovery round prunes the remediator's back-end command records: a thread of their own
    # does; a stop at once leaves the engine's threads as they are: the process ends now
    with closed_at_exit(ctx.store, pruned=None if engine else ctx.remediator):
        _serve(ctx, host, port, engine)


def _serve(ctx: ServeContext, host: str, port: int, engine: bool) -> None:
    """`vigil serve` on ``ctx``, until its server stops (and its engine, when ``engine``)."""
    import uvicorn

    from vigil.faces.api.app import app_for_context
    from vigil.remedy.acting import acting_line

    warn_if_open(host, ctx.auth_configured, "vigil serve")
    warn_shared_token(ctx.settings.api_token)
    app = app_for_context(ctx)
    if ctx.remediator is not None:
        typer.echo(acting_line(ctx.backend, not ctx.remediator.dry_run), err=True)
    # the server first, so that a SIGTERM before uvicorn captures signals (the heap's freeze) ends it too
    server = _noting_server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    live: Engine | None = None
    if engine:
        from vigil.run.engine import start_in_thread

        live = live_engine(ctx)
        loop = start_in_thread(live)

    def stopping(*_: object) -> None:
        server.note(signal.SIGTERM)
        if live is not None:
            live.stop.set()
        server.should_exit = True  # read once uvicorn starts: it shuts down at once, and the process ends below

    # uvicorn answers SIGTERM by shutting down, then raises it again under the handler it found: this one, so the
    # process ends below - once the engine has stopped and the connections are closed - instead of at once
    previous = signal.signal(signal.SIGTERM, stopping)
    try:
        _freeze_heap()
        typer.echo(f"vigil serving on http://{host}:{port} (store {ctx.settings.database_url()})", err=True)
        try:
            server.run()
        except KeyboardInterrupt:  # Ctrl-C: uvicorn shut down, and raised it again
            server.note(signal.SIGINT)
        if not server.started:  # start-up failed (uvicorn logged why), as uvicorn.run ends then
            raise typer.Exit(3)
    finally:
        try:
            if live is not None:
                # the engine's threads are daemons: without this wait the process ended mid-drain (also when start-up
                # failed); a second Ctrl-C during uvicorn's own shutdown (its force exit) skips it
                try:
                    _stop_engine(live, loop, at_once=server.force_exit, why=server.why())
                except KeyboardInterrupt:
                    # Ctrl-C after uvicorn put Python's handler back and before the wait took it: stopped at once all
                    # the same, one more Ctrl-C ignored while saying so (it would end the process with "Aborted!",
                    # exit 1)
                    signal.signal(signal.SIGINT, signal.SIG_IGN)
                    _stopped_at_once(live, server.why())
        finally:
            signal.signal(signal.SIGTERM, previous)


def _noting_server(config: Any) -> Any:
    """uvicorn's server for ``config``, noting the first signal that stopped it: ``note(sig)``, ``why()``."""
    import uvicorn

    class NotingServer(uvicorn.Server):
        first_signal: int | None = None

        def note(self, sig: int) -> None:
            if self.first_signal is None:
                self.first_signal = sig

        def handle_exit(self, sig: int, frame: Any) -> None:
            self.note(sig)
            super().handle_exit(sig, frame)

        def why(self) -> str:
            """What stopped the server: "Ctrl-C", "SIGTERM", or "start-up failed" (no signal, never served)."""
            if self.first_signal == signal.SIGINT:
                return "Ctrl-C"
            if self.first_signal is not None:
                return signal.Signals(self.first_signal).name
            return "start-up failed" if not self.started else "stopped"

    return NotingServer(config)


def _stop_engine(live: Engine, loop: threading.Thread, *, at_once: bool, why: str = "Ctrl-C") -> None:
    """Stop the engine of `vigil serve` shutting down, waiting for its tick and its round of resumed actions within one
    lease (``stop_in_thread``) - unless ``at_once`` or Ctrl-C comes (again) meanwhile: then the process ends now, exit
    130, with one line saying what it leaves, as uvicorn's force exit does. ``why``: what stopped the server
    (``_Server.why``), which the lines name. A second SIGTERM does not end the wait (a service manager escalates to
    SIGKILL after its own timeout)."""
    from vigil.run.engine import stop_in_thread

    lease_s = live.remediator.lease_s if live.remediator is not None else live.settings.remedy_lease_s
    # Python's own: Ctrl-C raises KeyboardInterrupt wherever the wait is (uvicorn and asyncio put it back, but a
    # start-up that failed may not have)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        if at_once:
            raise KeyboardInterrupt
        said = why if why == "start-up failed" else "stopping" if why in ("Ctrl-C", "stopped") else f"stopping on {why}"
        again = "Ctrl-C again" if why == "Ctrl-C" else "Ctrl-C"
        typer.echo(f"vigil serve: {said}; waiting for the engine's tick and the actions it resumes, at most "
                   f"{lease_s:g} s ({again} to stop at once)", err=True)
        stop_in_thread(live, loop)
    except KeyboardInterrupt:
        _stopped_at_once(live, why)
    finally:
        signal.signal(signal.SIGINT, before)


def _stopped_at_once(live: Engine, why: str) -> None:
    """End `vigil serve` at once on Ctrl-C while it stops, exit 130, with one line saying what it leaves."""
    live.stop.set()
    which = "a second Ctrl-C" if why == "Ctrl-C" else "Ctrl-C"
    typer.echo(f"vigil serve: stopped at once on {which}, without waiting for the engine; an action it was resuming "
               "is taken over by another server or engine once this process's lease on it lapses", err=True)
    raise typer.Exit(STOPPED_AT_ONCE) from None


def _freeze_heap() -> None:
    """Move everything alive after start-up (imported libraries, topology, caches: millions of objects) out
    of the cyclic GC's reach. Without it every full collection walks them all, a 0.3-0.8 s pause of every
    request in flight - the p99 of the server."""
    import gc

    gc.collect()
    gc.freeze()


def mcp(
    transport: Annotated[str, typer.Option(help="stdio (local agents) or http (streamable HTTP at /mcp)")] = "stdio",
    host: Annotated[str, typer.Option(help="address for --transport http")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="port for --transport http")] = 8000,
    allow_writes: Annotated[
        bool,
        typer.Option("--allow-writes", help="add propose_action / approve_action (needs api_token for http)"),
    ] = False,
    config: ConfigOpt = None,
    metrics_dir: MetricsOpt = None,
    actuator: Annotated[
        str | None,
        typer.Option(help="none, kubernetes or slurm: what runs the approved actions of execute_action (with "
                     "--allow-writes) when execute_actions is on (off, every action stays a dry-run). Default: "
                     "the setting remedy_backend (VIGIL_REMEDY_BACKEND, or remedy_backend: in the --config file), "
                     "else none"),
    ] = None,
) -> None:
    """Serve Vigil's tools to agents over MCP (read-only unless --allow-writes)."""
    if transport not in ("stdio", "http"):
        raise VigilInputError(f"--transport {transport!r}: expected stdio or http")
    from vigil.remedy.acting import check_actuator

    if actuator is not None:
        check_actuator(actuator)
    ctx = _context(config, metrics_dir, None, actuator)
    # no engine runs this remediator's recovery rounds, which prune its back-end command records: a thread does
    with closed_at_exit(ctx.store, pruned=ctx.remediator):
        _mcp(ctx, transport, host, port, allow_writes)


def _mcp(ctx: ServeContext, transport: str, host: str, port: int, allow_writes: bool) -> None:
    """`vigil mcp` on ``ctx``, until its server stops."""
    from vigil.faces.api.mcp_server import build_mcp_server
    from vigil.remedy.acting import acting_line

    if ctx.remediator is not None:
        typer.echo(acting_line(ctx.backend, not ctx.remediator.dry_run), err=True)
    server = build_mcp_server(ctx, allow_writes=allow_writes)
    if transport == "stdio":
        server.run("stdio")
        return
    if allow_writes and not ctx.auth.configured:
        raise VigilInputError("--allow-writes over http needs users (`vigil users add`) or VIGIL_API_TOKEN to "
                              "check callers")
    import uvicorn

    ensure_port_free(host, port, "--port")
    warn_if_open(host, ctx.auth.configured, "vigil mcp")
    warn_shared_token(ctx.settings.api_token)
    app: Any = server.streamable_http_app(host=host)
    if ctx.auth.configured:
        app = BearerGate(app, ctx.auth, writes=allow_writes)
    _freeze_heap()
    typer.echo(f"vigil MCP (streamable HTTP) on http://{host}:{port}/mcp", err=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")


def warn_shared_token(api_token: str) -> None:
    from vigil.faces.api.auth import SHARED_TOKEN_WARNING
    from vigil.faces.cli.output import SafeConsole

    if api_token:
        SafeConsole(stderr=True).print(f"[bold yellow]warning:[/] {SHARED_TOKEN_WARNING}", highlight=False,
                                       soft_wrap=True, markup=True)


class BearerGate:
    """ASGI wrapper: every HTTP request needs a bearer token, of an operator when the write tools are on and
    of any user otherwise; the caller's identity is what the write tools record (lifespan passes through)."""

    def __init__(self, app: Any, auth: Authenticator, *, writes: bool) -> None:
        self.app = app
        self.auth = auth
        self.writes = writes

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        from fastapi import HTTPException

        from vigil.faces.api.auth import Role, mcp_caller

        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or []}
        try:
            who = self.auth.identify(headers)
        except HTTPException:
            who = None
        if who is None or who.role < (Role.OPERATOR if self.writes else Role.VIEWER):
            await send(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [(b"content-type", b"text/plain"), (b"www-authenticate", b"Bearer")],
                }
            )
            await send({"type": "http.response.body", "body": b"missing or wrong bearer token\n"})
            return
        token = mcp_caller.set(who)
        try:
            await self.app(scope, receive, send)
        finally:
            mcp_caller.reset(token)
