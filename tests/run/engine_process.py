"""`vigil engine` as a real process for the lease tests, its stderr lines collected as they come."""

from __future__ import annotations

import subprocess
import sys
import threading

from tests.serve.conftest import REPO


class EngineProcess:
    """`vigil engine` as a process, its stderr lines collected as they come."""

    def __init__(self, env: dict[str, str], *options: str, module: str = "vigil") -> None:
        """``module``: what ``python -m`` runs (``tests.run.counted_connections``: `vigil` counting its connections)."""
        self.lines: list[str] = []
        self.process = subprocess.Popen([sys.executable, "-m", module, "engine", *options], cwd=REPO, env=env,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        stderr = self.process.stderr
        assert stderr is not None
        self.reader = threading.Thread(target=lambda: self.lines.extend(iter(stderr.readline, "")), daemon=True)
        self.reader.start()

    def said(self, words: str) -> bool:
        assert self.process.poll() is None, self.lines
        return any(words in line for line in self.lines)

    def end(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.reader.join(10)
