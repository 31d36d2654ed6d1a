"""Vigil's training probe: records every torch.distributed op of a rank so hangs can be localized.

Users who launch with their own torchrun or Slurm call ``vigil.sources.probe.install()`` at the top of the
training script and set ``VIGIL_PROBE_DIR`` to a directory shared by the ranks; ``vigil diagnose DIR``
then reads what the ranks left there. ``vigil launch`` does all of this without touching the script.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vigil.sources.probe.probe import Probe

__all__ = ["install"]


def install(out_dir: str | Path | None = None, hang_timeout_s: float | None = None) -> Probe:
    """Install the probe in this process (idempotent) and return it."""
    from vigil.sources.probe.activate import install_probe

    return install_probe(out_dir, hang_timeout_s)
