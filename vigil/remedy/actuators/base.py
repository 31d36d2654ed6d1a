"""The actuator interface.

An actuator says which action kinds it handles, what it would do (``describe``, shown in dry-run),
whether the world is already in the wanted state (``is_satisfied``, for idempotence) and does it
(``execute``, returning a one-line result). Dry-run, the blast-radius guard and the audit record are
applied around it by the Remediator, so no back end can skip them.
"""

from __future__ import annotations

import abc
import contextlib
import json
import logging
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn, Protocol

from vigil import procgroups
from vigil.model import Action, ActionKind, VigilInputError, parse_entity


class ActuatorError(RuntimeError):
    """The back end refused or failed; the message is recorded as the action's result."""


def run_command(argv: list[str], timeout_s: float, what: str) -> subprocess.CompletedProcess[str]:
    """Run a back end's command line (``scontrol``, ``nvidia-smi``); a missing program, a timeout or a non-zero
    exit becomes an ActuatorError naming ``what`` with the first line the program printed."""
    if shutil.which(argv[0]) is None:
        raise ActuatorError(f"{argv[0]} not found on PATH")
    # Started and registered under the lock the exit's kill takes its list under (``vigil.procgroups``): a command is
    # either in that list or not started at all. Its own session and process group: a terminal's Ctrl-C goes to the
    # whole foreground group, and would end a drain that `vigil serve` is waiting for on that very Ctrl-C; the timeout
    # below still ends it, by the group Vigil started
    # Recorded in the store first when a run's command (``recording``), so that the run's next owner finds it if this
    # process is killed outright: a row before the start, its marker in the command's environment (found in /proc if
    # the process dies before the row gets the pid), then the process group once started.
    recorder = getattr(_recording, "recorder", None)
    try:
        marker = recorder.starting(argv) if recorder is not None else None
    except Exception as err:  # not started unrecorded: the back end is not asked, the run fails
        raise ActuatorError(f"{what} not started: recording it failed: {type(err).__name__}: "
                            f"{next(iter(str(err).splitlines()), '')}") from err
    env = None if marker is None else {**os.environ, COMMAND_MARKER_ENV: marker}
    try:
        process: subprocess.Popen[str] | None = procgroups.start_group(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    except procgroups.Exiting:
        process = None
    if process is not None and recorder is not None and marker is not None:
        try:
            recorder.started(marker, process.pid)
        except BaseException:
            _end_group(process)  # not started where no one could find it
            raise
    if process is None:
        # this process is exiting (only daemon threads run then): the command is not started, and as for one ended
        # by the exit, no verdict - the run stays started, for the lease takeover
        _wait_for_the_end()
    with process:
        try:
            stdout, stderr = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _end_group(process)
            process.communicate()
            raise ActuatorError(f"{what} timed out after {timeout_s:g}s") from None
        except BaseException:
            _end_group(process)
            raise
        finally:
            procgroups.forget(process)
    if procgroups.exiting():
        # ended by this process's own exit (``procgroups.end_started_groups``): no verdict, the run stays started for
        # the lease takeover
        _wait_for_the_end()
    if recorder is not None and marker is not None:
        try:
            recorder.ended(marker, process.returncode)
        except Exception:  # the command's answer stands; its row stays "running", found gone by a next owner
            logging.getLogger("vigil.remedy").warning("recording the end of %s failed", what, exc_info=True)
    done = subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)
    if done.returncode != 0:
        message = (done.stderr or done.stdout).strip().splitlines()
        raise ActuatorError(f"{what} exited {done.returncode}: {message[0] if message else ''}")
    return done


# the environment variable naming a recorded command's row (``CommandRecorder.starting``), inherited by its children
COMMAND_MARKER_ENV = "VIGIL_COMMAND"


class CommandRecorder(Protocol):
    """Records a run's back-end commands in the store (``vigil.remedy.commands``), for the run's next owner should
    this process be killed outright."""

    def starting(self, argv: list[str]) -> str:
        """A row for a command about to start; returns its marker (put in its environment)."""

    def started(self, marker: str, pid: int) -> None:
        """The command started as ``pid``, the leader of a group and session of its own."""

    def ended(self, marker: str, returncode: int) -> None:
        """The command ended (reaped by this process)."""


_recording = threading.local()


@contextlib.contextmanager
def recording(recorder: CommandRecorder) -> Iterator[None]:
    """While inside, the commands this thread runs (``run_command``) are recorded with ``recorder``."""
    before = getattr(_recording, "recorder", None)
    _recording.recorder = recorder
    try:
        yield
    finally:
        _recording.recorder = before


def _wait_for_the_end() -> NoReturn:
    """Park this thread (a daemon's: the engine's, a resumed round's - the only ones that run once the process is
    exiting) until the interpreter ends."""
    threading.Event().wait()
    raise AssertionError("unreachable")  # pragma: no cover


def _end_group(process: subprocess.Popen[str]) -> None:
    procgroups.end_group(process)


def migration_nodes(action: Action) -> list[str]:
    """The bad nodes a migrate_job names (``params.nodes``: node ids), as the scheduler's node names; none for
    any other action."""
    nodes = action.params.get("nodes", []) if action.kind is ActionKind.MIGRATE_JOB else []
    if not isinstance(nodes, list):
        raise ActuatorError(f"migrate_job params.nodes must be a list of node ids, got {nodes!r}")
    names = []
    for node in nodes:
        try:
            kind, parts = parse_entity(str(node))
        except VigilInputError:  # a plan's params, not a command line: the action fails, the caller goes on
            kind, parts = "", ()
        if kind != "node":
            raise ActuatorError(f"migrate_job params.nodes holds {node!r}, not a node/<name> id")
        names.append(parts[0])
    return names


class Actuator(abc.ABC):
    name: str = "actuator"
    kinds: frozenset[ActionKind] = frozenset()
    target_kinds: frozenset[str] = frozenset({"node"})

    def accepts(self, action: Action) -> bool:
        return action.kind in self.kinds and parse_entity(action.target)[0] in self.target_kinds

    @abc.abstractmethod
    def describe(self, action: Action) -> str:
        """What ``execute`` would do, as a command or API call a person can read."""

    def is_satisfied(self, action: Action) -> bool:
        """True when the target is already in the state the action asks for."""
        return False

    @abc.abstractmethod
    def execute(self, action: Action) -> str:
        """Do it; return a one-line result or raise ActuatorError."""


class OutboxActuator(Actuator):
    """Alerts, vendor tickets and requests for diagnostics / log collection, as JSON lines in an outbox.

    Vigil does not page anyone itself; Alertmanager, a ticketing bridge, the web UI or the node agent
    (for diagnostics and log collection) tail the outbox.
    """

    name = "outbox"
    kinds = frozenset({ActionKind.ALERT, ActionKind.VENDOR_TICKET, ActionKind.RUN_DIAGNOSTICS, ActionKind.COLLECT_LOGS})
    target_kinds = frozenset({"node", "gpu", "nic", "switch", "rack", "job", "rank", "cluster"})

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def describe(self, action: Action) -> str:
        return f"append {action.kind.value} for {action.target} to {self.path}"

    def record(self, action: Action) -> dict[str, object]:
        """The JSON line appended for ``action``."""
        return {
            "ts": time.time(),
            "kind": action.kind.value,
            "target": action.target,
            "reason": action.reason,
            "action_id": action.id,
        }

    def execute(self, action: Action) -> str:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as outbox:
            outbox.write(json.dumps(self.record(action)) + "\n")
        return f"{self.record_kind(action)} written to {self.path}"

    def record_kind(self, action: Action) -> str:
        return action.kind.value
