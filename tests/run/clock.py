"""The engine's clock in the run tests: it reads the time it was made at and moves only when the test sets it."""

from __future__ import annotations

import time


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now
