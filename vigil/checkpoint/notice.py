"""A tidal preemption notice as a training loop sees it, and the checkpoint it should write on one.

Vigil tells a spot job ahead of time that its GPUs will be taken back (``vigil tide apply``):
- on Slurm with a signal (``scancel --signal=USR1 --full``); Slurm's own preemption sends SIGTERM;
- on Kubernetes with the pod annotation ``vigil.dev/preempt-at`` (the deadline), which the pod reads from a
  Downward API volume (``/etc/podinfo/annotations``; the kubelet refreshes the file).

``PreemptionNotice`` turns either into ``requested()``; ``checkpoint_on_notice`` saves through the
``CheckpointManager`` and waits until the checkpoint is durable, once per notice (a signal, or a deadline not
seen before)::

    notice = PreemptionNotice(annotations="/etc/podinfo/annotations").install()
    for step in range(start, steps):
        train_step()
        if checkpoint_on_notice(notice, manager, step, model, optimizer):
            break                      # the checkpoint is written; give the GPUs back
"""

from __future__ import annotations

import datetime as dt
import re
import signal
import threading
from pathlib import Path
from typing import Any

from vigil.checkpoint.manager import CheckpointManager

NOTICE_ANNOTATION = "vigil.dev/preempt-at"
_ANNOTATION = re.compile(r'^vigil\.dev/preempt-at="?([^"\n]+)"?$', re.MULTILINE)


class PreemptionNotice:
    """Set by a notice signal or by the deadline annotation; ``signals`` are caught only after ``install``."""

    def __init__(self, signals: tuple[signal.Signals, ...] = (signal.SIGUSR1, signal.SIGTERM),
                 annotations: str | Path | None = None) -> None:
        self.signals = signals
        self.annotations = Path(annotations) if annotations is not None else None
        self._event = threading.Event()
        self.received: signal.Signals | None = None
        self._answered: str | None = None

    def install(self) -> PreemptionNotice:
        """Catch the notice signals (main thread only, as Python's signal module requires)."""
        for sig in self.signals:
            signal.signal(sig, self._on_signal)
        return self

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.received = signal.Signals(signum)
        self._event.set()

    def _annotation(self) -> str | None:
        if self.annotations is None:
            return None
        try:
            match = _ANNOTATION.search(self.annotations.read_text())
        except OSError:
            return None  # the kubelet has not written the file (yet)
        return match.group(1) if match else None

    def deadline(self) -> float | None:
        """The deadline (epoch seconds) the Kubernetes annotation names, or None."""
        value = self._annotation()
        try:
            return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() if value else None
        except ValueError:
            return None

    def requested(self) -> bool:
        # an annotation whose deadline does not parse still asks for a checkpoint: the safe side
        return self._event.is_set() or self._annotation() is not None

    def take(self) -> bool:
        """True once per notice: a signal since the last call, or an annotation deadline not answered yet."""
        if self._event.is_set():
            self._event.clear()
            self._answered = self._annotation() or self._answered
            return True
        annotation = self._annotation()
        if annotation is not None and annotation != self._answered:
            self._answered = annotation
            return True
        return False


def checkpoint_on_notice(notice: PreemptionNotice, manager: CheckpointManager, step: int, model: Any,
                         optimizer: Any, extra: dict[str, Any] | None = None) -> bool:
    """When a notice has come (and was not answered yet): save ``step`` and wait until it is durable; True when
    it did."""
    if not notice.take():
        return False
    manager.save(step, model, optimizer, extra)
    manager.wait()
    return True
