"""Install the probe in the current process: hooks, crash recording, watchdog."""

from __future__ import annotations

import atexit
import os
import sys
import threading
from pathlib import Path
from types import TracebackType

from vigil.model import VigilInputError
from vigil.sources.probe.otel import tracer_from_env
from vigil.sources.probe.probe import Probe
from vigil.sources.probe.records import DEFAULT_HANG_TIMEOUT_S

ENV_DIR = "VIGIL_PROBE_DIR"
ENV_HANG_TIMEOUT = "VIGIL_HANG_TIMEOUT"
# The launcher's pid: a rank it started asks for SIGKILL when that parent dies (bootstrap.die_with_launcher).
ENV_LAUNCHER_PID = "VIGIL_LAUNCHER_PID"

_probe: Probe | None = None


# torchrun / vigil launch first, then what Slurm, Open MPI and MPICH/PMI set when ranks are started directly.
RANK_VARS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
WORLD_SIZE_VARS = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


def _env_int(names: tuple[str, ...], default: int) -> int:
    for name in names:
        value = os.environ.get(name, "")
        if not value:
            continue
        try:
            return int(value)
        except ValueError:
            raise VigilInputError(f"environment variable {name}={value!r} is not an integer") from None
    return default


def install_probe(out_dir: str | Path | None = None, hang_timeout_s: float | None = None) -> Probe:
    global _probe
    if _probe is not None:
        return _probe
    from vigil.sources.probe.hooks import install_hooks

    directory = out_dir if out_dir is not None else os.environ.get(ENV_DIR)
    path = Path(directory) if directory else None
    if path is not None:
        path.mkdir(parents=True, exist_ok=True)
    if hang_timeout_s is None:
        raw = os.environ.get(ENV_HANG_TIMEOUT, "")
        try:
            hang_timeout_s = float(raw) if raw else DEFAULT_HANG_TIMEOUT_S
        except ValueError:
            raise VigilInputError(f"environment variable {ENV_HANG_TIMEOUT}={raw!r} is not a number") from None
    probe = Probe(
        rank=_env_int(RANK_VARS, 0),
        world_size=_env_int(WORLD_SIZE_VARS, 1),
        out_dir=path,
        hang_timeout_s=hang_timeout_s,
    )
    install_hooks(probe)
    _chain_excepthooks(probe)
    traced = tracer_from_env(os.environ.get("VIGIL_JOB"), probe.rank)
    if traced is not None:
        probe.step_tracer, provider = traced
        atexit.register(provider.shutdown)  # registered first, runs last: the final spans are flushed
    atexit.register(probe.stop)
    probe.write_snapshot()
    probe.start_watchdog()
    _probe = probe
    return probe


def _chain_excepthooks(probe: Probe) -> None:
    previous = sys.excepthook

    def excepthook(
        exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None
    ) -> None:
        probe.record_error(exc_type, exc, tb)
        previous(exc_type, exc, tb)

    sys.excepthook = excepthook
    previous_thread_hook = threading.excepthook

    def thread_excepthook(args: threading.ExceptHookArgs) -> None:
        if args.exc_value is not None and probe.error is None:
            probe.record_error(args.exc_type, args.exc_value, args.exc_traceback)
        previous_thread_hook(args)

    threading.excepthook = thread_excepthook
