"""`pip install 'vigil[agent]'` is enough for the node agent: it runs with the server, training and learning
dependencies made unimportable (bench/agent_install.py measures a real install into a fresh virtualenv)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.collect.conftest import PageServer
from tests.extras import NOT_FOR_THE_AGENT, run_without


def test_agent_help_and_one_collection_run_without_server_train_or_learn_packages(
    tmp_path: Path, page_server: PageServer, dcgm_page: str
) -> None:
    help_run, loaded = run_without(NOT_FOR_THE_AGENT, "agent", "--help", home=tmp_path)
    assert help_run.returncode == 0, help_run.stderr
    assert "--once" in help_run.stdout and loaded == []

    page_server.page = dcgm_page.encode()
    kernel_log = tmp_path / "kern.log"
    kernel_log.write_text("[ 1.0] NVRM: Xid (PCI:0000:18:00): 79, pid=0, name=, GPU has fallen off the bus.\n")
    run, loaded = run_without(NOT_FOR_THE_AGENT, "agent", "--once", "--json", "--dcgm-url",
                              f"{page_server.url}/metrics", "--kmsg-file", str(kernel_log), "--store",
                              str(tmp_path / "history"), home=tmp_path)
    assert run.returncode == 0, run.stderr
    assert loaded == []
    report = json.loads(run.stdout[run.stdout.index("{"):])
    sources = {s["name"]: s for s in report["sources"]}
    assert sources["dcgm"]["points"] > 0, sources["dcgm"]
    assert sources["host"]["points"] > 5
    assert report["events"] == {"xid/isolate": 1}
    assert any((tmp_path / "history").iterdir()), "the local history was written"
