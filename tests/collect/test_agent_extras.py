"""`pip install 'vigil[agent]'` is enough for the node agent: it runs with the server, training and learning
dependencies made unimportable (bench/agent_install.py measures a real install into a fresh virtualenv)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.collect.conftest import PageServer

REPO = Path(__file__).resolve().parents[2]
# Everything the base install and [agent] leave out (pyproject's [server], [train], [learn] extras).
NOT_INSTALLED = ("torch", "tensorboard", "mcp", "fastapi", "uvicorn", "sqlalchemy", "alembic", "psycopg", "jinja2",
                 "networkx", "scipy", "sklearn", "pyod", "opentelemetry", "re2", "fsspec")

# A meta-path finder that refuses those packages, as an interpreter without them would; it records each attempt.
RUN_AGENT = """
import importlib.abc, json, sys
BLOCKED = set(sys.argv[1].split(","))
attempts = []

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            attempts.append(name)
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
sys.argv = ["vigil", *sys.argv[2:]]
from vigil.faces.cli.main import main
try:
    main()
finally:
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    print(json.dumps({"attempts": attempts, "loaded": loaded}), file=sys.stderr)
"""


def run_without_heavy_deps(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "VIGIL_HOME": str(home)}
    return subprocess.run([sys.executable, "-c", RUN_AGENT, ",".join(NOT_INSTALLED), *args], capture_output=True,
                          text=True, env=env, timeout=120, cwd=home)


def test_agent_help_and_one_collection_run_without_server_train_or_learn_packages(
    tmp_path: Path, page_server: PageServer, dcgm_page: str
) -> None:
    help_run = run_without_heavy_deps("agent", "--help", home=tmp_path)
    assert help_run.returncode == 0, help_run.stderr
    assert "--once" in help_run.stdout

    page_server.page = dcgm_page.encode()
    kernel_log = tmp_path / "kern.log"
    kernel_log.write_text("[ 1.0] NVRM: Xid (PCI:0000:18:00): 79, pid=0, name=, GPU has fallen off the bus.\n")
    run = run_without_heavy_deps("agent", "--once", "--json", "--dcgm-url", f"{page_server.url}/metrics",
                                 "--kmsg-file", str(kernel_log), "--store", str(tmp_path / "history"), home=tmp_path)
    imports = json.loads(run.stderr.strip().splitlines()[-1])
    assert run.returncode == 0, run.stderr
    assert imports["loaded"] == []
    report = json.loads(run.stdout[run.stdout.index("{"):])
    sources = {s["name"]: s for s in report["sources"]}
    assert sources["dcgm"]["points"] > 0, sources["dcgm"]
    assert sources["host"]["points"] > 5
    assert report["events"] == {"xid/isolate": 1}
    assert any((tmp_path / "history").iterdir()), "the local history was written"
