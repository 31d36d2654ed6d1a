"""What every node source gives the agent: points (metric values with bounded labels) and events.

A source is read by the agent on its own schedule and in its own thread (see ``agent.py``); it never raises
for bad input from the outside world. Malformed pages, lines or files are *counted* and *logged once* per
kind through ``ProblemLog`` so a sick node cannot flood the agent's log or crash it.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass, field

from vigil.model import Event

log = logging.getLogger("vigil.sources.collect")


@dataclass(frozen=True, slots=True)
class Point:
    """One metric value of one entity; ``labels`` are extra bounded labels (``xid``, ``port``) if any.

    A dataclass rather than a pydantic ``Sample`` because the agent makes thousands per minute and must stay
    far below 1% of a core.
    """

    metric: str
    entity: str
    value: float
    labels: tuple[tuple[str, str], ...] = ()


@dataclass
class Collection:
    """What one read of one source produced."""

    points: list[Point] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    # A short human status, e.g. "no NVIDIA driver on this node": shown by `vigil agent --once`.
    status: str = "ok"
    # False when the source's device, file or service could not be read at all (shown as down, not as idle).
    up: bool = True

    def add(self, metric: str, entity: str, value: float | int | bool | None, **labels: str) -> None:
        """Add a point, skipping values the source could not read (None)."""
        if value is None:
            return
        self.points.append(Point(metric, entity, float(value), tuple(sorted(labels.items()))))


class ProblemLog:
    """Counts problems per kind and logs only the first of each (a page broken every 10 s is one line)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def report(self, kind: str, detail: str) -> None:
        with self._lock:
            self.counts[kind] += 1
            first = self.counts[kind] == 1
        if first:
            log.warning(
                "%s: %s: %s (further %s problems are counted, not logged)",
                self.source,
                kind,
                detail[:300],
                kind,
            )

    def snapshot(self) -> dict[str, int]:
        """A copy safe to read while the source's thread keeps counting."""
        with self._lock:
            return dict(self.counts)

    def total(self) -> int:
        return sum(self.snapshot().values())


class Source(ABC):
    """A node source: ``collect(now)`` reads it once. Subclasses set ``name`` and ``kind``.

    ``kind`` is the metric kind that selects the sampling interval (gpu, network, host, kernel, kube).
    """

    name: str = "source"
    kind: str = "host"

    def __init__(self) -> None:
        self.problems = ProblemLog(self.name)

    @abstractmethod
    def collect(self, now: float) -> Collection:
        """Read the source once. Must not raise for bad outside input; count it in ``self.problems``."""

    def close(self) -> None:  # noqa: B027 - most sources hold no handle
        """Release handles (NVML, file descriptors); the default has none."""


def default_node_name() -> str:
    """The node's name as the cluster knows it: NODE_NAME (set by the DaemonSet) or the short hostname."""
    name = os.environ.get("NODE_NAME") or socket.gethostname().split(".")[0]
    return name or "localhost"
