"""The lines `vigil serve` ends with when it stops, as the shutdown and CLI tests expect them."""

from __future__ import annotations

AT_ONCE = ("vigil serve: stopped at once on a second Ctrl-C, without waiting for the engine; an action it was resuming "
           "is taken over by another server or engine once this process's lease on it lapses")
