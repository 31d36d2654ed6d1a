"""Evaluate every complete checkpoint of a job, asynchronously, exactly once across crashes.

A watcher polls a checkpoint directory (``step-<N>/`` with DCP's ``.metadata``: complete) and queues each
new step. Each evaluation runs the user's command in its own process session through a small runner
(``python -m vigil.checkpoint.evalrun``) that writes ``result.json`` atomically when the command ends, so:

- a watcher that dies (kill -9) leaves its evaluations running; the next watcher adopts a live one (same
  pid and start time), takes the result of one that finished meanwhile, and never starts it again;
- an evaluation that dies without a result is retried up to ``retries`` times, then recorded as failed;
- a step already done is never evaluated again (the ledger is one SQLite file beside the checkpoints,
  updated in transactions).

The command gets the checkpoint as ``{checkpoint}`` / ``{step}`` placeholders and as ``VIGIL_CHECKPOINT_PATH``
/ ``VIGIL_CHECKPOINT_STEP``; a JSON object of numbers on its last line of standard output becomes the
step's scalars (``eval/<name>`` in TensorBoard, beside the training's own).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from vigil.checkpoint.evalrun import LOCK_FILE, RESULT_FILE
from vigil.checkpoint.manager import complete_steps, step_dir_name
from vigil.model import Evidence, FaultLevel, Incident, VigilInputError, job_id

LEDGER_DIR = ".vigil-eval"


class EvalState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    VANISHED = "vanished"  # the checkpoint was removed (retention) before it could be evaluated


@dataclass(frozen=True)
class EvalRecord:
    step: int
    state: EvalState
    attempts: int
    returncode: int | None
    metrics: dict[str, float]
    message: str
    started: float | None
    ended: float | None


@dataclass(frozen=True)
class EvalConfig:
    command: Sequence[str]
    max_parallel: int = 1
    devices: Sequence[str] = ()
    retries: int = 1
    timeout_s: float | None = None
    logdir: Path | None = None

    def __post_init__(self) -> None:
        if not self.command:
            raise VigilInputError("the evaluation command is empty")
        if self.max_parallel < 1:
            raise VigilInputError(f"max_parallel must be at least 1, not {self.max_parallel}")
        if self.retries < 0:
            raise VigilInputError(f"retries must be 0 or more, not {self.retries}")
        if self.timeout_s is not None and not (self.timeout_s > 0 and math.isfinite(self.timeout_s)):
            raise VigilInputError(f"timeout must be a positive number of seconds, not {self.timeout_s}")

    @property
    def slots(self) -> int:
        return min(self.max_parallel, len(self.devices)) if self.devices else self.max_parallel


def failure_incident(job: str, record: EvalRecord) -> Incident:
    """An evaluation that failed (or a checkpoint that vanished unevaluated) is an incident, not silence; one
    per job and step, so a watcher that reports it twice stores it once."""
    entity = job_id(job)
    what = "was removed before evaluation" if record.state == EvalState.VANISHED else "evaluation failed"
    summary = f"checkpoint step {record.step} {what}: {record.message}"[:4096]
    now = time.time()
    return Incident(
        id=f"inc-eval-{job}-{record.step}"[:64],
        title=f"Checkpoint step {record.step} of {job}: {what}",
        scope=entity,
        entities=[entity],
        start=record.started or now,
        end=record.ended or now,
        level=FaultLevel.OBSERVE,
        fault_types=["checkpoint_eval_failed"],
        evidence=[Evidence(kind="event", entity=entity, ts=record.ended or now, summary=summary)],
    )


def parse_command(text: str) -> list[str]:
    try:
        words = shlex.split(text)
    except ValueError as err:
        raise VigilInputError(f"evaluation command {text!r}: {err}") from None
    if not words:
        raise VigilInputError("the evaluation command is empty")
    return words


class Ledger:
    """One row per checkpoint step: its evaluation's state, attempts, running process and result."""

    def __init__(self, directory: Path) -> None:
        self.root = directory / LEDGER_DIR
        self.root.mkdir(exist_ok=True)
        self.path = self.root / "ledger.sqlite"
        try:
            self.db = sqlite3.connect(self.path, isolation_level=None)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute(
                "CREATE TABLE IF NOT EXISTS evals (step INTEGER PRIMARY KEY, state TEXT NOT NULL, attempts INTEGER"
                " NOT NULL DEFAULT 0, pid INTEGER, device TEXT, attempt_dir TEXT, returncode"
                " INTEGER, metrics TEXT NOT NULL DEFAULT '{}', message TEXT NOT NULL DEFAULT '', started REAL,"
                " ended REAL, scalars_written INTEGER NOT NULL DEFAULT 0)"
            )
        except sqlite3.DatabaseError as err:
            raise VigilInputError(f"evaluation ledger {self.path} is not a readable database: {err}") from None

    def close(self) -> None:
        self.db.close()

    def add_new(self, steps: Sequence[int]) -> list[int]:
        known = {row[0] for row in self.db.execute("SELECT step FROM evals")}
        new = [s for s in steps if s not in known]
        self.db.executemany("INSERT INTO evals (step, state) VALUES (?, ?)", ((s, EvalState.QUEUED) for s in new))
        return new

    def rows(self, state: EvalState | None = None) -> list[dict[str, Any]]:
        query = "SELECT * FROM evals" + (" WHERE state = ?" if state else "") + " ORDER BY step"
        cursor = self.db.execute(query, (state,) if state else ())
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor]

    def update(self, step: int, **fields: Any) -> None:
        assignments = ", ".join(f"{name} = ?" for name in fields)
        self.db.execute(f"UPDATE evals SET {assignments} WHERE step = ?", (*fields.values(), step))

    def records(self) -> list[EvalRecord]:
        return [
            EvalRecord(
                step=row["step"],
                state=EvalState(row["state"]),
                attempts=row["attempts"],
                returncode=row["returncode"],
                metrics=json.loads(row["metrics"]),
                message=row["message"],
                started=row["started"],
                ended=row["ended"],
            )
            for row in self.rows()
        ]


def _still_running(attempt_dir: Path) -> bool:
    """Whether the attempt's runner (or its command) still holds the attempt's lock.

    The watcher takes the lock before it starts the runner and hands it over; the runner passes it on to
    the command. So a free lock means nothing of the attempt is alive, whatever happened to any watcher.
    """
    try:
        fd = os.open(attempt_dir / LOCK_FILE, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def read_result(attempt_dir: Path) -> dict[str, Any] | None:
    """The runner's result, or None while there is none (written atomically, so never half a file)."""
    path = attempt_dir / RESULT_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {"returncode": None, "metrics": {}, "message": f"unreadable result {path}"}
    return data if isinstance(data, dict) else {"returncode": None, "metrics": {}, "message": "result not an object"}


class ScalarSink:
    """Evaluation scalars as TensorBoard events in ``<logdir>/eval``, beside the training's own."""

    def __init__(self, logdir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(logdir / "eval"))

    def write(self, step: int, metrics: dict[str, float], wall_time: float | None) -> None:
        for name, value in sorted(metrics.items()):
            self.writer.add_scalar(f"eval/{name}", value, global_step=step, walltime=wall_time)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class CheckpointEvaluator:
    """Queue, run, adopt and record evaluations of one checkpoint directory (see the module docstring)."""

    def __init__(
        self,
        directory: Path,
        config: EvalConfig,
        on_failure: Callable[[EvalRecord], None] | None = None,
        on_done: Callable[[EvalRecord], None] | None = None,
    ) -> None:
        if not directory.is_dir():
            raise VigilInputError(f"checkpoint directory {directory} "
                                  f"{'is not a directory' if directory.exists() else 'does not exist'}")
        self.directory = directory
        self.config = config
        self.ledger = Ledger(directory)
        self.on_failure = on_failure
        self.on_done = on_done
        self.sink = ScalarSink(config.logdir) if config.logdir is not None else None

    def close(self) -> None:
        self.ledger.close()
        if self.sink is not None:
            self.sink.close()

    # ---------------------------------------------------------------- one pass
    def poll(self) -> None:
        """Queue new complete checkpoints, settle finished or dead evaluations, start queued ones."""
        self.ledger.add_new(complete_steps(self.directory))
        self._settle_running()
        self._write_pending_scalars()
        self._start_queued()

    def busy(self) -> bool:
        return bool(self.ledger.rows(EvalState.RUNNING) or self.ledger.rows(EvalState.QUEUED))

    def run(self, interval_s: float = 5.0, until_idle: bool = False, stop: Callable[[], bool] | None = None) -> None:
        """Poll every ``interval_s``; with ``until_idle`` return once nothing is queued or running."""
        while True:
            self.poll()
            if until_idle and not self.busy():
                return
            if stop is not None and stop():
                return
            time.sleep(interval_s)

    # ---------------------------------------------------------------- internals
    def _settle_running(self) -> None:
        for row in self.ledger.rows(EvalState.RUNNING):
            attempt_dir = Path(row["attempt_dir"])
            result = read_result(attempt_dir)
            if result is None and _still_running(attempt_dir):
                if self.config.timeout_s is not None and time.time() - row["started"] > self.config.timeout_s:
                    if row["pid"] is not None:
                        self._stop(row["pid"])
                    result = {
                        "returncode": None,
                        "metrics": {},
                        "message": f"timed out after {self.config.timeout_s} s",
                    }
                else:
                    continue
            if result is None:
                result = {"returncode": None, "metrics": {}, "message": "the evaluation died without a result"}
            self._finish(row, result)

    def _finish(self, row: dict[str, Any], result: dict[str, Any]) -> None:
        step = row["step"]
        returncode = result.get("returncode")
        metrics = {k: float(v) for k, v in (result.get("metrics") or {}).items()}
        if returncode == 0:
            self.ledger.update(
                step,
                state=EvalState.DONE,
                returncode=0,
                metrics=json.dumps(metrics),
                ended=result.get("ended"),
                message=str(result.get("message", "")),
                pid=None,
            )
            self._write_pending_scalars()
            if self.on_done:
                self.on_done(self._record(step))
            return
        message = str(result.get("message") or f"exit status {returncode}")
        if row["attempts"] <= self.config.retries and (self.directory / step_dir_name(step)).is_dir():
            self.ledger.update(step, state=EvalState.QUEUED, returncode=returncode, message=message, pid=None)
            return
        self.ledger.update(
            step,
            state=EvalState.FAILED,
            returncode=returncode,
            message=message,
            pid=None,
            ended=result.get("ended") or time.time(),
        )
        if self.on_failure:
            self.on_failure(self._record(step))

    def _write_pending_scalars(self) -> None:
        if self.sink is None:
            return
        for row in self.ledger.rows(EvalState.DONE):
            if row["scalars_written"]:
                continue
            self.sink.write(row["step"], json.loads(row["metrics"]), row["ended"])
            self.ledger.update(row["step"], scalars_written=1)

    def _start_queued(self) -> None:
        running = self.ledger.rows(EvalState.RUNNING)
        free_devices = [d for d in self.config.devices if d not in {r["device"] for r in running}]
        for row in self.ledger.rows(EvalState.QUEUED):
            if len(running) >= self.config.slots:
                return
            step = row["step"]
            checkpoint = self.directory / step_dir_name(step)
            if not checkpoint.is_dir():
                self.ledger.update(step, state=EvalState.VANISHED, message="removed before it was evaluated")
                if self.on_failure:
                    self.on_failure(self._record(step))
                continue
            device = free_devices.pop(0) if self.config.devices else None
            attempt = row["attempts"] + 1
            attempt_dir = self.ledger.root / step_dir_name(step) / f"attempt-{attempt}"
            attempt_dir.mkdir(parents=True, exist_ok=True)
            lock = os.open(attempt_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                # Recorded before the start: a watcher killed in between leaves a free lock and no result,
                # which the next one reads as "never ran" and queues again.
                self.ledger.update(
                    step,
                    state=EvalState.RUNNING,
                    attempts=attempt,
                    pid=None,
                    device=device,
                    attempt_dir=str(attempt_dir),
                    started=time.time(),
                )
                proc = self._spawn(checkpoint, step, attempt_dir, device, lock)
            finally:
                os.close(lock)
            self.ledger.update(step, pid=proc.pid)
            running.append({"device": device})

    def _spawn(
        self, checkpoint: Path, step: int, attempt_dir: Path, device: str | None, lock: int
    ) -> subprocess.Popen[bytes]:
        command = [
            part.replace("{checkpoint}", str(checkpoint)).replace("{step}", str(step)) for part in self.config.command
        ]
        env = dict(os.environ, VIGIL_CHECKPOINT_PATH=str(checkpoint), VIGIL_CHECKPOINT_STEP=str(step))
        if device is not None:
            env["CUDA_VISIBLE_DEVICES"] = device
        # Its own session: the evaluation outlives a watcher that is killed, and is adopted by the next one.
        return subprocess.Popen(
            [sys.executable, "-m", "vigil.checkpoint.evalrun", str(attempt_dir), str(lock), "--", *command],
            env=env,
            pass_fds=(lock,),
            cwd=self.directory,
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    @staticmethod
    def _stop(pid: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)

    def _record(self, step: int) -> EvalRecord:
        return next(r for r in self.ledger.records() if r.step == step)
