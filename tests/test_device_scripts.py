"""The device scripts (bench/device) run on a lent GPU machine for a few minutes; on the CPU machines they
must still import and parse their arguments, so a broken script is found before device time is spent."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CUDA_HANG = REPO / "bench" / "device" / "cuda_hang.py"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(CUDA_HANG), *args], capture_output=True, text=True, timeout=120,
                          cwd=REPO)


def test_cuda_hang_imports_and_lists_its_checks_without_a_gpu() -> None:
    done = run("--dry-run", "--gpu-busy-s", "1.5", "--steps", "3")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert (plan["gpu_busy_s"], plan["steps"]) == (1.5, 3)
    assert "ring: same ops as the comm hook" in plan["checks"]
    assert "ring: completion after the GPU work" in plan["checks"]


def test_cuda_hang_help_and_refusal_without_a_gpu() -> None:
    done = run("--help")
    assert done.returncode == 0 and "--gpu-busy-s" in done.stdout and "--dry-run" in done.stdout
    import torch

    if not torch.cuda.is_available():
        refused = run()
        assert refused.returncode == 2 and "needs a CUDA GPU" in refused.stderr
