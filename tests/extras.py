"""Run the `vigil` command in a fresh interpreter where some installed packages are made unimportable, as in an
install without the extras that hold them (pyproject's [agent], [server], [train], [learn])."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Only in [train] or [learn]: what a server install does without.
TRAIN_AND_LEARN = ("torch", "tensorboard", "pyod", "opentelemetry", "fsspec")
# Everything the base install and [agent] leave out.
NOT_FOR_THE_AGENT = (*TRAIN_AND_LEARN, "mcp", "fastapi", "uvicorn", "sqlalchemy", "alembic", "psycopg", "jinja2",
                     "networkx", "scipy", "sklearn", "re2")

# A meta-path finder that refuses the blocked packages, as an interpreter without them would; at exit the
# command reports which blocked modules ended up loaded anyway.
RUN_VIGIL = """
import importlib.abc, json, sys
BLOCKED = set(sys.argv[1].split(","))

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
sys.argv = ["vigil", *sys.argv[2:]]
from vigil.faces.cli.main import main
try:
    main()
finally:
    print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)), file=sys.stderr)
"""


def run_without(blocked: tuple[str, ...], *args: str, home: Path) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """The finished `vigil ARGS` and the blocked modules it had loaded (none, when it truly ran without them)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "VIGIL_HOME": str(home)}
    proc = subprocess.run([sys.executable, "-c", RUN_VIGIL, ",".join(blocked), *args], capture_output=True,
                          text=True, env=env, timeout=300, cwd=home)
    return proc, list(json.loads(proc.stderr.strip().splitlines()[-1]))
