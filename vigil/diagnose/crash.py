"""The root error of a crashed job: the first causal error, not the cascade it set off on the peers.

When one rank dies, every peer reports a timeout or a reset connection a moment later. Those are
symptoms; the root is the earliest error that is not one of them, or a process that died silently.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from typing import Any

# Errors a healthy rank raises because a peer failed (gloo, NCCL, TCPStore wording).
CASCADE_PATTERNS = [
    re.compile(p, re.IGNORECASE)
    for p in (
        r"connection (reset|closed) by peer",
        r"connection refused",
        r"broken pipe",
        r"remote worker hanging",
        r"timed out|timeout",
        r"watchdog caught collective operation timeout",
        r"socket (timeout|closed)",
        r"NCCL (communicator was aborted|error: remote process exited)",
        r"DistNetworkError",
        r"Read error \[",
        r"peer .* (closed|disconnected)",
    )
]
# Lines worth reporting from a rank's stderr when the probe could not record the exception itself.
_ERROR_LINE = re.compile(
    r"(what\(\):\s*(?P<what>.+)$)|(^(?P<exc>[A-Za-z_][\w.]*(Error|Exception|Interrupt))(:\s*(?P<msg>.*))?$)"
)


@dataclass
class RankFailure:
    rank: int
    ts: float
    kind: str
    message: str
    exit_code: int | None

    @property
    def is_cascade(self) -> bool:
        return any(p.search(self.message) for p in CASCADE_PATTERNS)

    def describe(self) -> str:
        return f"rank {self.rank}: {self.kind}: {self.message}".strip()

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "ts": self.ts, "kind": self.kind, "message": self.message,
                "exit_code": self.exit_code, "cascade": self.is_cascade}


def error_from_log(text: str) -> tuple[str, str] | None:
    """The last exception or C++ ``what():`` line of a rank's output, as (kind, message)."""
    found: tuple[str, str] | None = None
    for line in text.splitlines():
        match = _ERROR_LINE.search(line.strip())
        if not match:
            continue
        if match.group("what"):
            found = ("C++ exception", match.group("what").strip())
        elif match.group("exc"):
            found = (match.group("exc"), (match.group("msg") or "").strip())
    return found


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


def root_failure(failures: list[RankFailure]) -> RankFailure | None:
    """Earliest non-cascade failure; a silent death beats a cascade; else the earliest of all."""
    if not failures:
        return None
    ordered = sorted(failures, key=lambda f: f.ts)
    for failure in ordered:
        if not failure.is_cascade:
            return failure
    return ordered[0]
