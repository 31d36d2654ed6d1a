"""Work a command runs on a thread of its own while its main thread takes the signals: `vigil engine`'s start and
ticks, `vigil serve`'s resume at start-up of the runs a killed server or engine left half done; and what the commands
close at their exit (``closed_at_exit``)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, NoReturn

import click
import typer

from vigil.model import VigilInputError
from vigil.procgroups import end_started_groups

if TYPE_CHECKING:
    from vigil.remedy.remediator import Remediator
    from vigil.run.engine import Engine
    from vigil.store.sql import Store

log = logging.getLogger(__name__)

# the exit status of a command stopped at once (a second Ctrl-C, or past the wait's bound: ``run_stoppable``)
STOPPED_AT_ONCE = 130


# How long a command's exit waits for the prune of the back-end commands' records in flight (two statements; a store
# that answers no sooner is left to the process's end, the thread being a daemon).
PRUNE_STOP_WAIT_S = 10.0

# How often the main thread looks whether a signal handler set ``stop`` while it waits for ``work`` (a handler that
# returns lets ``join`` go on waiting, so the bound below would never start otherwise).
LOOK_EVERY_S = 0.5


def _exit_now() -> NoReturn:
    """End the process at once, exit 0, past the bound: the abandoned ``work`` thread may hold a lock the way out
    waits for (a logging handler's, which ``logging.shutdown`` takes at exit: the process hung there). The back end's
    commands are killed first (``end_started_groups``, which atexit would have run) and the output flushed; nothing
    else is lost: the store is a database, whose commits are durable and whose transaction left open is rolled back
    by the database, as on a SIGKILL - the run left started is taken over once the lease lapses."""
    end_started_groups()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


def run_stoppable(work: Callable[[], object], stop: threading.Event, *, who: str, waiting: str, left: str,
                  bound_s: float | None = None) -> None:
    """Run ``work`` on a thread while this one takes the signals. SIGTERM (a service manager stopping it) or a first
    Ctrl-C sets ``stop`` and says so in one line (``who: stopping; waiting (Ctrl-C again to stop at once)``; on
    SIGTERM ``who: stopping on SIGTERM; waiting``): ``work`` sees it and ends at a safe point - a round of resumed runs
    finishes the action it is on and claims no further run. A further SIGTERM changes nothing (a service manager
    escalates to SIGKILL). A second Ctrl-C ends the process at once, exit 130, with one line (``who: stopped at once on
    a second Ctrl-C, left``); a back end's command ``work`` waited for is killed on the way out
    (``end_started_groups``) and its run left started, for the lease takeover. What ``work`` raises: a user's mistake
    (VigilInputError, a click exception, an exit) is raised here as if raised on this thread; anything else ends the
    command with one line naming it, exit 1 (the traceback at debug). Before, Ctrl-C raised wherever the main thread
    was - in the middle of a drain, killing its command and leaving its run started - a second one ended the process
    without a word, SIGTERM set ``stop`` without one, and an error of ``work`` ended it with a traceback.

    ``bound_s``: once ``stop`` is set, how long ``work`` is waited for at most (the lease of the action it resumes:
    past it another server or engine takes the action over, so waiting longer serves nothing); past it the command
    ends, exit 0, with one line (``who: did not stop within N s, left``) and its back end's commands killed on the way
    out. None waits for ``work`` however long it takes (before, the engine's line said "at most N s" and waited for a
    tick stuck in a database call for ever)."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread takes signals (a library use)
        work()
        return
    failed: list[BaseException] = []

    def guarded() -> None:
        try:
            work()
        except BaseException as err:  # raised again on this thread, as if run here
            failed.append(err)

    presses = 0

    def stopping(line: str) -> None:
        if stop.is_set():
            return
        stop.set()
        typer.echo(line, err=True)

    def on_ctrl_c(*_: object) -> None:
        nonlocal presses
        presses += 1
        if presses > 1:
            raise KeyboardInterrupt
        stopping(f"{who}: stopping; {waiting} (Ctrl-C again to stop at once)")

    worker = threading.Thread(target=guarded, name=f"{who} main".replace(" ", "-"), daemon=True)
    before_int = signal.signal(signal.SIGINT, on_ctrl_c)
    before_term = signal.signal(signal.SIGTERM, lambda *_: stopping(f"{who}: stopping on SIGTERM; {waiting}"))
    try:
        worker.start()
        deadline: float | None = None
        while worker.is_alive():
            if deadline is None and bound_s is not None and stop.is_set():
                deadline = time.monotonic() + bound_s
            left_s = None if deadline is None else deadline - time.monotonic()
            if left_s is not None and left_s <= 0:
                typer.echo(f"{who}: did not stop within {bound_s:g} s, {left}", err=True)
                _exit_now()
            worker.join(LOOK_EVERY_S if left_s is None else min(left_s, LOOK_EVERY_S))
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # one more Ctrl-C while saying so would end it with a traceback
        stop.set()
        typer.echo(f"{who}: stopped at once on a second Ctrl-C, {left}", err=True)
        raise typer.Exit(STOPPED_AT_ONCE) from None
    finally:
        signal.signal(signal.SIGTERM, before_term)
        if signal.getsignal(signal.SIGINT) is on_ctrl_c:
            signal.signal(signal.SIGINT, before_int)
    if not failed:
        return
    err = failed[0]
    if isinstance(err, (VigilInputError, click.exceptions.ClickException, click.exceptions.Exit, SystemExit,
                        KeyboardInterrupt, typer.Abort)):
        raise err
    log.debug("%s failed", who, exc_info=err)
    first = next(iter(str(err).splitlines()), "")
    typer.echo(f"{who}: stopped by an error: {type(err).__name__}{': ' + first if first else ''}", err=True)
    raise typer.Exit(1) from None


@contextmanager
def closed_at_exit(store: Store, live: Engine | None = None, pruned: Remediator | None = None) -> Iterator[None]:
    """Close what `vigil engine`, `vigil serve` or `vigil mcp` opened, at its exit (normal, or stopped by SIGTERM or a
    Ctrl-C): the thread pruning ``pruned``'s back-end command records (``Remediator.keep_pruning``, started here for a
    command whose remediator no engine's rounds prune: stopped and waited for, at most ``PRUNE_STOP_WAIT_S``), the
    engine (no round after the one in flight, its lease given up), the store's pool and the remedy journal's engines
    (``close_engines``: the audit log's and the lifecycle's), so every database connection ends with a goodbye to the
    server rather than with the process. Before, the engine's lease was released and the pools were left to the
    process's end. Not when the command stops at once (exit ``STOPPED_AT_ONCE``): its abandoned thread may still hold
    a connection (the pruning thread is told to stop, not waited for)."""
    from vigil.remedy.audit import close_engines

    at_once = False
    stop_pruning = threading.Event()
    pruning = None
    if pruned is not None:
        pruning = threading.Thread(target=pruned.keep_pruning, args=(stop_pruning,), name="vigil-prune-commands",
                                   daemon=True)
        pruning.start()
    try:
        yield
    except typer.Exit as err:
        at_once = err.exit_code == STOPPED_AT_ONCE
        raise
    finally:
        stop_pruning.set()
        if not at_once:
            if pruning is not None:
                pruning.join(PRUNE_STOP_WAIT_S)
                if pruning.is_alive():
                    log.warning("the back-end commands' records were still being pruned after %g s; left to the "
                                "next start", PRUNE_STOP_WAIT_S)
            if live is not None:
                live.close()
            store.close()
            close_engines()
