"""The installed `vigil` command run as a user runs it: a subprocess with its own home, its output kept."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

VIGIL = [sys.executable, "-m", "vigil"]


def vigil(*args: str, home: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VIGIL_HOME": str(home), "COLUMNS": "200"}
    proc = subprocess.run([*VIGIL, *args], capture_output=True, text=True, env=env, timeout=300)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc
