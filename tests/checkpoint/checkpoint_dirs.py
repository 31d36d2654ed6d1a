"""Checkpoint directories in the checkpoint manager's layout, for the cleanup tests of the checkpoint and remedy
packages."""

from __future__ import annotations

import os
import time
from pathlib import Path

HOUR = 3600.0


def make_checkpoints(root: Path) -> Path:
    """The manager's layout: complete steps 1-4, 6, 7 (with DCP's .metadata), an old cut-off save at step 5,
    and the save in flight at step 8."""
    ckpt = root / "j7"
    old = time.time() - 2 * HOUR
    for step in (1, 2, 3, 4, 5, 6, 7, 8):
        path = ckpt / f"step-{step:09d}"
        path.mkdir(parents=True)
        (path / "__0_0.distcp").write_bytes(os.urandom(1000 * step))
        if step not in (5, 8):
            (path / ".metadata").write_bytes(b"m" * 10)
        if step == 5:
            for item in (path / "__0_0.distcp", path):
                os.utime(item, (old, old))
    return ckpt
