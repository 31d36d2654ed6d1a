"""A bounded, thread-safe ring buffer of op records: the probe's memory of recent communication."""

from __future__ import annotations

import threading
from collections import deque

from vigil.sources.probe.records import OpRecord


class OpRing:
    """Keeps the last ``capacity`` ops; old ones fall off, so memory stays flat on long jobs.

    ``version`` changes on every append or state change, so a writer can skip re-serialising an
    unchanged buffer.
    """

    def __init__(self, capacity: int = 2048) -> None:
        if capacity < 1:
            raise ValueError("ring capacity must be at least 1")
        self.capacity = capacity
        self._ops: deque[OpRecord] = deque(maxlen=capacity)
        self._lock = threading.Lock()
        self._next_id = 0
        self.version = 0
        self.total = 0

    def new_record_id(self) -> int:
        with self._lock:
            record_id = self._next_id
            self._next_id += 1
            return record_id

    def append(self, op: OpRecord) -> None:
        with self._lock:
            self._ops.append(op)
            self.total += 1
            self.version += 1

    def touch(self) -> None:
        """Record that an op already in the buffer changed state."""
        with self._lock:
            self.version += 1

    def tail(self, count: int) -> list[OpRecord]:
        with self._lock:
            if count >= len(self._ops):
                return list(self._ops)
            return list(self._ops)[-count:]

    def __len__(self) -> int:
        return len(self._ops)
