"""The progress a rank reports to the failover supervisor: one JSON line per step, with its metrics.

    from vigil.remedy.heartbeat import Heartbeat
    beat = Heartbeat()                     # reads VIGIL_RUN_DIR and RANK; a no-op outside vigil launch job
    beat.start(step=restored_step)
    for step in ...:
        ...
        beat.step(step, loss=loss.item(), grad_norm=norm)   # metrics feed healthCheck conditions
    beat.done(step)

Lines go to ``$VIGIL_RUN_DIR/progress-rank<RANK>.jsonl``; they feed healthCheck metric conditions and
time the resume after a restart. Liveness is not judged from them: every rank already carries the
probe (``vigil.sources.probe``), whose snapshot is the one heartbeat hangs are judged from.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

RUN_DIR_ENV = "VIGIL_RUN_DIR"


def progress_path(run_dir: Path, rank: int) -> Path:
    return run_dir / f"progress-rank{rank}.jsonl"


class Heartbeat:
    def __init__(self, run_dir: str | Path | None = None, rank: int | None = None) -> None:
        directory = run_dir if run_dir is not None else os.environ.get(RUN_DIR_ENV)
        self._stream: IO[str] | None = None
        if directory:
            path = progress_path(Path(directory), rank if rank is not None else int(os.environ.get("RANK", "0")))
            path.parent.mkdir(parents=True, exist_ok=True)
            self._stream = path.open("a", buffering=1)  # line-buffered: each beat is visible at once

    def _write(self, record: dict[str, object]) -> None:
        if self._stream is not None:
            self._stream.write(json.dumps({**record, "ts": time.time()}) + "\n")

    def start(self, step: int = 0) -> None:
        self._write({"event": "start", "step": step})

    def step(self, step: int, **metrics: float) -> None:
        self._write({"step": step, **metrics})

    def done(self, step: int) -> None:
        self._write({"event": "done", "step": step})
        if self._stream is not None:
            self._stream.close()
            self._stream = None


@dataclass
class RankProgress:
    offset: int = 0
    last_ts: float | None = None
    last_step: int = 0
    start_step: int | None = None
    done: bool = False
    metrics: list[tuple[float, dict[str, float]]] = field(default_factory=list)


class ProgressTracker:
    """Tails ``progress-rank<r>.jsonl`` (vigil.remedy.heartbeat): each line a step with its metrics (for
    healthCheck conditions), a start (for the time to resume) or a done. Hangs are judged from the
    probe's records, not from these lines."""

    def __init__(self, run_dir: Path, world_size: int) -> None:
        self.run_dir = run_dir
        self.ranks = [RankProgress() for _ in range(world_size)]

    def reset_attempt(self) -> None:
        for rank in self.ranks:
            rank.start_step, rank.done, rank.last_ts = None, False, None

    def update(self) -> None:
        for r, rank in enumerate(self.ranks):
            path = progress_path(self.run_dir, r)
            if not path.exists():
                continue
            with path.open() as stream:
                stream.seek(rank.offset)
                chunk = stream.read()
            complete = chunk[: chunk.rfind("\n") + 1]
            rank.offset += len(complete.encode())
            for line in complete.splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue
                rank.last_ts = time.time()
                if record.get("event") == "start":
                    rank.start_step = rank.last_step = int(record["step"])
                elif record.get("event") == "done":
                    rank.done = True
                else:
                    rank.last_step = int(record["step"])
                    values = {k: float(v) for k, v in record.items() if k not in ("step", "ts")}
                    rank.metrics.append((float(record["ts"]), values))

    def window(self, metric: str, seconds: float, now: float) -> list[float]:
        """Every rank's values of ``metric`` from the last ``seconds``."""
        return [
            values[metric]
            for rank in self.ranks
            for ts, values in rank.metrics
            if ts >= now - seconds and metric in values
        ]

    def latest(self, metric: str) -> list[float]:
        """Each rank's most recent value of ``metric`` (ranks that never reported it are left out)."""
        found = []
        for rank in self.ranks:
            value = next((values[metric] for _, values in reversed(rank.metrics) if metric in values), None)
            if value is not None:
                found.append(value)
        return found
