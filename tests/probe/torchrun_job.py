"""fault_job.py as a torchrun user would run it: the script installs the probe itself."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import vigil.sources.probe

vigil.sources.probe.install()
JOB = Path(__file__).with_name("fault_job.py")
sys.argv = [str(JOB), *sys.argv[1:]]
runpy.run_path(str(JOB), run_name="__main__")
