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
from pathlib import Path
from typing import IO


def progress_path(run_dir: Path, rank: int) -> Path:
    return run_dir / f"progress-rank{rank}.jsonl"


class Heartbeat:
    def __init__(self, run_dir: str | Path | None = None, rank: int | None = None) -> None:
        directory = run_dir if run_dir is not None else os.environ.get("VIGIL_RUN_DIR")
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
